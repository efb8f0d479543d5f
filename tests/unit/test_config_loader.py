"""config/loader.py: the one door for run files (defaults inheritance, NeMo-RL-relative parents,
overrides in NeMo-RL's spelling), for every command."""
from __future__ import annotations

from pathlib import Path

import pytest

from nemo_rl_specdec.config import loader as config_loader
from nemo_rl_specdec.config.run import BLOCK_PATH, ConfigError


def write_file(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


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


def test_every_command_reads_a_run_file_through_the_one_loader(tmp_path, capsys):
    """A run file with `defaults:` is composed for generate, demo and bench as for validate: the same
    file validates and runs, or both refuse it with the same error."""
    from nemo_rl_specdec import cli
    from nemo_rl_specdec.config.run import load_run_config
    from nemo_rl_specdec.demo.run import DemoSettings
    from nemo_rl_specdec.resources import config_path

    child = tmp_path / "child.yaml"
    child.write_text(f"defaults: {config_path('tiny_cpu.yaml')}\nname: child\ngrpo: {{max_num_steps: 2}}\n"
                     f"policy:\n  generation:\n    speculative_decoding: {{drafter: ngram}}\n")
    cfg = load_run_config(str(child))
    assert cfg.spec.drafter == "ngram" and cfg.raw["name"] == "child" and cfg.not_checked == []
    assert DemoSettings(cfg).steps == 2 and cfg.raw["grpo"]["num_prompts_per_step"] == 16  # from the parent
    assert cli.main(["validate", str(child)]) == 0
    capsys.readouterr()
    with pytest.raises(ConfigError) as loaded:
        load_run_config(str(child), ["+grpo.moed=async"])
    assert cli.main(["validate", str(child), "+grpo.moed=async"]) == 2
    assert capsys.readouterr().err == f"error: {loaded.value}\n"
    assert "grpo.moed: unknown key; did you mean 'mode'?" in str(loaded.value)


def test_a_nemo_rl_run_files_own_keys_pass_and_an_override_adding_an_unknown_one_does_not(tmp_path):
    """In a run file with parents, the keys its files define are NeMo-RL's (NeMo-RL's `val_temperature`
    is no typo of `temperature`); a key an override adds is checked as in a self-contained file."""
    from nemo_rl_specdec.config.run import load_run_config
    from nemo_rl_specdec.resources import asset_path

    (tmp_path / "base.yaml").write_text(
        f"policy:\n  model_name: {asset_path('tiny', 'policy')}\n  generation:\n    val_temperature: 0.0\n"
        "grpo: {max_num_epochs: 1, val_period: 10}\ncluster: {gpus_per_node: 8}\n")
    (tmp_path / "run.yaml").write_text("defaults: base.yaml\ngrpo: {max_num_steps: 3}\n")
    cfg = load_run_config(str(tmp_path / "run.yaml"))
    assert cfg.raw["grpo"] == {"max_num_epochs": 1, "val_period": 10, "max_num_steps": 3}
    for override, named in [("+grpo.max_num_step=4", "grpo.max_num_step: unknown key; did you mean 'max_num_steps'?"),
                            ("+policy.generation.temperture=0", "did you mean policy.generation.temperature?"),
                            ("+cluster.num_engine=2", "did you mean 'num_engines'?")]:
        with pytest.raises(ConfigError, match=named.replace("?", r"\?")):
            load_run_config(str(tmp_path / "run.yaml"), [override])
