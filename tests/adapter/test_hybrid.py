"""The hybrid drafter through NeMo-RL's own config handling, on the checkout under test (NEMO_RL_SRC).

The Qwen3-8B Eagle3 example with `drafter: hybrid` (history part DAS, model part the trainer's
Eagle3 head): our entry point composes it; NeMo-RL's `load_config` and `MasterConfig` accept it;
NeMo-RL's `configure_generation_config`, wrapped by us, writes the model part's
`speculative_config` (greedy drafts) and `async_scheduling: false` into `vllm_kwargs`; the
preflight, fed what the vLLM this NeMo-RL pins accepts, keeps it (or, for a vLLM without the
custom-class runner, v0.7.0's 0.20.0, refuses it naming the key path); the trainer's Eagle head is
the model part's weight source (`refit_stream`), and the step's rollouts reach the engines for the
history half.
"""
from __future__ import annotations

import pytest
from test_configs import _configured, nemo_rl_load, pinned_speculative, pinned_vllm

from nemo_rl_specdec import run_grpo
from nemo_rl_specdec.adapter import preflight, translate
from nemo_rl_specdec.config import loader as config_loader
from nemo_rl_specdec.config.run import BLOCK_PATH, ConfigError
from nemo_rl_specdec.resources import config_path

pytestmark = pytest.mark.nemo_rl


@pytest.fixture(scope="module")
def hybrid_run(nemo_rl_src, tmp_path_factory):
    path = config_path("qwen3_8b_eagle3.yaml")
    overrides = [f"{BLOCK_PATH}.drafter=hybrid"]
    code, plan = run_grpo.prepare(["--config", str(path), *overrides])
    assert code == -1 and plan["spec"].drafter == "hybrid"
    composed = config_loader.compose(path, overrides, nemo_rl_src)
    assert composed.missing_parents == []
    raw, master = nemo_rl_load(run_grpo.write_composed(composed, str(tmp_path_factory.mktemp("hybrid"))))
    return raw, master


def test_nemo_rl_accepts_the_hybrid_block(hybrid_run):
    raw, master = hybrid_run
    block = master.policy["generation"]["speculative_decoding"]
    assert block["drafter"] == "hybrid" and block == raw["policy"]["generation"]["speculative_decoding"]
    spec = translate.check_run(raw)
    assert spec.hybrid.history == "suffix" and spec.hybrid.model == "eagle3"


def test_configure_writes_the_model_parts_config_and_synchronous_scheduling(hybrid_run, nemo_rl_src):
    _, master = hybrid_run
    gen, spec = _configured(master)
    kwargs = gen["vllm_kwargs"]
    sc = kwargs["speculative_config"]
    assert sc["method"] == "eagle3" and sc["model"] == master.policy["draft"]["model_name"]
    assert sc["draft_sample_method"] == "greedy" and kwargs["async_scheduling"] is False
    assert gen[translate.WEIGHT_SOURCE_KEY] == translate.SOURCE_REFIT_STREAM  # the trainer's Eagle head
    assert translate.rollouts_wanted(spec)  # and the history half's rollouts
    version = pinned_vllm(nemo_rl_src)
    accepts = pinned_speculative(version)
    facts = {"vllm": version, "python": "workers", "fields": sorted(accepts["keys"]),
             "methods": sorted(accepts["methods"])}
    if "custom_class" not in accepts["methods"]:  # v0.7.0's vLLM 0.20.0: refused before any engine starts
        with pytest.raises(ConfigError, match=rf"^{BLOCK_PATH}\.drafter: got 'hybrid'.*vLLM {version}.*main"):
            preflight.adapt_speculative_config(sc, facts, spec, log=lambda m: None)
        return
    adapted = preflight.adapt_speculative_config(sc, facts, spec, log=lambda m: None)
    assert adapted == sc and not set(adapted) - accepts["keys"]
