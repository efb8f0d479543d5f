"""bench --suite parametric (no engine): which rows run, in which policy group, with which k."""
from __future__ import annotations

import pytest

from nemo_rl_specdec.bench.parametric import _options, configurations
from nemo_rl_specdec.config.run import ConfigError, load_run_config
from nemo_rl_specdec.drafters import registry


def test_tiny_run_has_frozen_and_online_rows_for_every_parametric_drafter():
    cfg = load_run_config("configs/tiny_cpu.yaml", [])
    opts = _options(cfg)
    # drafters of one part (a hybrid's model part is benched on its own)
    online = [d.name for d in registry.DRAFTERS.values() if "online" in d.refresh_modes and d.cost_parts is None]
    assert opts["drafters"] == online and "dflash" in online and opts["steps"] >= 10
    groups = configurations(cfg, opts)
    assert [[c["name"] for c in cs] for _, cs in groups] == [
        [f"{d}_{m}" for d in online if d != "mtp" for m in ("frozen", "online")], ["mtp_frozen", "mtp_online"]]
    (main, _), (mtp_policy, mtp) = groups
    assert main.model_path == cfg.model_path
    assert mtp_policy.model_path.endswith("tiny_mtp") and all(c["cfg"].model_path == mtp_policy.model_path for c in mtp)
    assert {c["cfg"].spec.num_speculative_tokens for c in mtp} == {1}
    assert {c["cfg"].spec.refresh.mode for c in mtp} == {"frozen", "online"}


def test_mtp_run_file_benches_its_own_heads_only_and_bad_choices_name_the_key():
    cfg = load_run_config("configs/tiny_mtp_cpu.yaml", [])
    groups = configurations(cfg, _options(cfg))
    assert len(groups) == 1 and [c["name"] for c in groups[0][1]] == ["mtp_frozen", "mtp_online"]
    with pytest.raises(ConfigError, match="bench.parametric.drafters"):
        _options(load_run_config("configs/tiny_mtp_cpu.yaml", ["bench.parametric.drafters=[eagle3]"]))
