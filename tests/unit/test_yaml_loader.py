"""config/yaml_loader.py: one reader, one override grammar and one resolver set for run files, scenarios
and NeMo-RL run files; every error names the file, and the override at fault."""
from __future__ import annotations

import json

import pytest

from nemo_rl_specdec.config import yaml_loader
from nemo_rl_specdec.config.schema import ConfigError
from nemo_rl_specdec.resources import asset_path


class CallerError(ConfigError):
    """A caller's own error class (the simulator's ScenarioError)."""


@pytest.fixture
def run(tmp_path):
    p = tmp_path / "run.yaml"
    p.write_text("a: {b: 1, c: 2}\nlr: 1.0e-3\nn: ${a.b}\nitems: [1, 2]\n")
    return p


def test_every_override_form_and_yaml_values(run):
    raw = yaml_loader.load(run, ["a.b=7", "+x.y=[1, 2]", "++a.d={e: 1}", "~a.c", "lr=1e-4", "items.1=5", "s=${a.b}"])
    assert raw["a"] == {"b": 7, "d": {"e": 1}} and raw["x"] == {"y": [1, 2]}
    assert raw["lr"] == 1e-4 and isinstance(raw["lr"], float)  # OmegaConf's YAML: no `.` needed
    assert raw["items"] == [1, 5] and raw["n"] == 7 and raw["s"] == 7  # interpolations resolve after overrides


def test_a_mapping_value_merges_into_the_mapping_it_replaces(run):
    assert yaml_loader.load(run, ["a={c: 3}"])["a"] == {"b": 1, "c": 3}


@pytest.mark.parametrize("override", ["a.b", "=1", "+++a=1", "~", "~a=1", "~~a", "+~a=1"])
def test_malformed_overrides_name_the_file_the_override_and_the_forms(run, override):
    with pytest.raises(CallerError) as ei:
        yaml_loader.load(run, [override], error=CallerError, example="speculation.k=4")
    msg = str(ei.value)
    assert msg.startswith(f"override {override!r} of {run}: expected key=value, +key=value, ++key=value or ~key")
    assert msg.endswith("(e.g. speculation.k=4)")


def test_bad_values_and_deletions_name_the_override(run):
    with pytest.raises(ConfigError, match=rf"override 'a.b.z=1' of {run}: a.b is a value \(1\), not a mapping"):
        yaml_loader.load(run, ["a.b.z=1"])          # below a scalar
    with pytest.raises(ConfigError, match=rf"override 'x=\[1, 2' of {run}: "):
        yaml_loader.load(run, ["x=[1, 2"])          # unreadable YAML value
    with pytest.raises(ConfigError, match=rf"override '~a.q' of {run}: a.q does not exist, so it cannot be deleted"):
        yaml_loader.load(run, ["~a.q"])


def test_file_errors_name_the_file(tmp_path):
    with pytest.raises(CallerError, match=r"scenario '.*nope\.yaml' not found"):
        yaml_loader.read(tmp_path / "nope.yaml", CallerError, what="scenario")
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: {b: 1\n  c: [\n")
    with pytest.raises(ConfigError, match=rf"{bad}: cannot read the run file: "):
        yaml_loader.read(bad, what="run file")
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match=rf"{listy}: a run file must be a mapping of keys \(got a ListConfig\)"):
        yaml_loader.read(listy, what="run file")
    dangling = tmp_path / "dangling.yaml"
    dangling.write_text("a: ${nowhere}\n")
    with pytest.raises(ConfigError, match=rf"(?s){dangling}: .*nowhere.*\(hint\)"):
        yaml_loader.resolve(yaml_loader.read(dangling), dangling, hint=" (hint)")


def test_resolvers_for_assets_and_nemo_rl_arithmetic(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("m: ${specdec_asset:tiny/policy}\nx: ${mul:3,4}\ny: ${add:1,2}\nz: ${div:6,4}\nw: ${max:2,5}\n")
    assert yaml_loader.load(p) == {"m": str(asset_path("tiny", "policy")), "x": 12, "y": 3, "z": 1.5, "w": 5}


def test_an_unquoted_override_value_drops_surrounding_whitespace_and_a_quoted_one_keeps_it(capsys):
    """The documented normalisation (docs/configuration.md, "Overrides"): an override's value is YAML,
    so `drafter= ngram ` is `ngram`, as in a run file and in Hydra; quoted, the spaces stay part of
    the value, which the block then refuses by key path with the allowed names."""
    from nemo_rl_specdec import cli
    from nemo_rl_specdec.resources import config_path

    key = "policy.generation.speculative_decoding.drafter"
    assert cli.main(["validate", str(config_path("tiny_cpu.yaml")), f"{key}= ngram "]) == 0
    assert json.loads(capsys.readouterr().out)["speculative_decoding"]["drafter"] == "ngram"
    assert cli.main(["validate", str(config_path("tiny_cpu.yaml")), f'{key}=" ngram"']) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: invalid configuration:\n  {key}: got ' ngram'; allowed:") and "'ngram'" in err


def test_arithmetic_resolvers_are_not_left_registered(tmp_path):
    """NeMo-RL runs in the process our launcher resolved the run file in, and v0.7.0 registers no `add`:
    a run file it cannot resolve must fail there as it does under its own launcher, in any test order."""
    from omegaconf import OmegaConf

    p = tmp_path / "r.yaml"
    p.write_text("y: ${add:1,2}\n")
    assert yaml_loader.load(p) == {"y": 3}
    for name in yaml_loader.RESOLVERS:
        assert not OmegaConf.has_resolver(name), name
    with pytest.raises(Exception, match="add"):
        OmegaConf.to_container(OmegaConf.load(p), resolve=True)


def test_a_resolver_registered_before_is_used_and_kept(tmp_path):
    """One NeMo-RL registered (its `mul`) is the one used, and stays registered after our resolve."""
    from omegaconf import OmegaConf

    p = tmp_path / "r.yaml"
    p.write_text("x: ${mul:3,4}\ny: ${add:1,2}\n")
    register = getattr(OmegaConf, "register_resolver", None) or OmegaConf.register_new_resolver
    register("mul", lambda a, b: f"theirs {a * b}")
    try:
        assert yaml_loader.load(p) == {"x": "theirs 12", "y": 3}
        assert OmegaConf.has_resolver("mul") and not OmegaConf.has_resolver("add")
    finally:
        OmegaConf.clear_resolver("mul")
