"""config_loader.py: composing a NeMo-RL run file (defaults inheritance, NeMo-RL-relative
parents, overrides in NeMo-RL's spelling)."""
from __future__ import annotations

import pytest
from fakes import (  # noqa: E402
    write_file,
)

from nemo_rl_specdec.adapter import config_loader
from nemo_rl_specdec.config import BLOCK_PATH, ConfigError


def test_compose_inherits_like_nemo_rl(tmp_path):
    write_file(tmp_path / "base" / "grand.yaml", "a: 1\nsection: {x: 1, y: 2}\nkeep: {k: 1}\n")
    write_file(tmp_path / "base" / "parent.yaml", "defaults: grand.yaml\na: 2\nb: ${a}\n")
    write_file(tmp_path / "other.yaml", "c: 3\n")
    child = write_file(tmp_path / "run" / "child.yaml",
                   "defaults: [../base/parent.yaml, ../other.yaml]\nsection: {_override_: true, z: 9}\n"
                   "keep: {j: 2}\na: 5\n")
    c = config_loader.compose(child)
    assert c.missing_parents == []
    assert c.resolved() == {"a": 5, "section": {"z": 9}, "keep": {"k": 1, "j": 2}, "b": 5, "c": 3}


def test_compose_resolves_nemo_rl_parents_against_the_checkout(tmp_path):
    root = tmp_path / "nemo-rl"
    write_file(root / "examples" / "configs" / "base.yaml", "policy: {model_name: base, precision: bfloat16}\nx: 1\n")
    run = write_file(tmp_path / "run.yaml",
                     "defaults: nemo_rl:examples/configs/base.yaml\npolicy: {model_name: mine}\n")
    c = config_loader.compose(run, [], root)
    assert c.uses_nemo_rl_parent and c.missing_parents == []
    assert c.resolved() == {"policy": {"model_name": "mine", "precision": "bfloat16"}, "x": 1}
    alone = config_loader.compose(run, [], None)
    assert alone.missing_parents == ["nemo_rl:examples/configs/base.yaml"]
    assert alone.resolved() == {"policy": {"model_name": "mine"}}


def test_overrides_in_nemo_rl_spelling(tmp_path):
    run = write_file(tmp_path / "run.yaml", "a: {b: 1, c: 2}\nn: ${a.b}\n")
    c = config_loader.compose(run, ["a.b=7", "++a.d=[1, 2]", "+e=x", "~a.c", f"{BLOCK_PATH}.enabled=true"])
    raw = c.resolved()
    assert raw["a"] == {"b": 7, "d": [1, 2]} and raw["n"] == 7 and raw["e"] == "x"
    assert raw["policy"]["generation"]["speculative_decoding"]["enabled"] is True
    assert "${a.b}" in c.to_yaml()  # interpolations are kept for NeMo-RL's own loader
    with pytest.raises(ConfigError, match="expected key=value"):
        config_loader.compose(run, ["justakey"])
    with pytest.raises(ConfigError, match="not found"):
        config_loader.compose(tmp_path / "nope.yaml")


def test_a_bundled_run_file_is_found_by_name_from_anywhere(tmp_path, monkeypatch):
    from nemo_rl_specdec.resources import config_path

    monkeypatch.chdir(tmp_path)
    c = config_loader.compose("qwen3_8b_suffix.yaml")
    assert c.source == config_path("qwen3_8b_suffix.yaml") and c.uses_nemo_rl_parent
    with pytest.raises(ConfigError,
                       match=r"override '~policy.nope' of .*qwen3_8b_suffix.yaml: policy.nope does not exist"):
        config_loader.compose("qwen3_8b_suffix.yaml", ["~policy.nope"])
