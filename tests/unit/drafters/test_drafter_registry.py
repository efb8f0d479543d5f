"""The drafter layer: every registered drafter keeps the contract, and nothing outside
`drafters/` compares drafter names (they look the drafter up instead)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from nemo_rl_specdec.config import SpecDecConfig, load_run_config, to_vllm_speculative_config
from nemo_rl_specdec.drafters.base import HOST, LIST, MODEL, PARALLEL, SEQUENTIAL, Drafter
from nemo_rl_specdec.drafters.registry import DRAFTERS, drafter
from nemo_rl_specdec.drafters.roles import Declared
from nemo_rl_specdec.schema import Strict

PKG = Path(__file__).resolve().parents[3] / "nemo_rl_specdec"
MODES = {"frozen", "refit", "online", "rebuild"}


@pytest.mark.parametrize("name", sorted(DRAFTERS))
def test_each_drafter_keeps_the_contract(name):
    d = DRAFTERS[name]
    assert isinstance(d, Drafter) and d.name == name and drafter(name, Declared) is d
    assert d.kind in (LIST, MODEL) and d.draft_cost in (HOST, SEQUENTIAL, PARALLEL)
    assert (d.kind == LIST) == (d.draft_cost == HOST)
    assert d.refresh_modes and set(d.refresh_modes) <= MODES
    assert issubclass(d.config, Strict) and SpecDecConfig.model_fields[name].annotation is d.config
    for label, overrides in d.variants:
        assert label and all("=" in o for o in overrides)


@pytest.mark.parametrize("name", sorted(DRAFTERS))
def test_each_drafter_maps_to_a_vllm_speculative_config(name, tmp_path):
    d = DRAFTERS[name]
    block = {"enabled": True, "drafter": name, "num_speculative_tokens": 3}
    # the hybrid's checkpoint is its model part's (hybrid.model: eagle3 by default)
    owner = "eagle3" if name == "hybrid" else name
    if d.kind == MODEL and not d.weights_in_policy_checkpoint:
        block[owner] = {"model": str(tmp_path)}
    spec = SpecDecConfig.model_validate(block)
    out = to_vllm_speculative_config(spec, temperature=1.0)
    assert out["num_speculative_tokens"] == 3 and isinstance(out["method"], str)
    if d.kind == MODEL:  # lossless at T>0 and better accepted; the hybrid's mixed batches verify greedy drafts
        assert out["draft_sample_method"] == ("greedy" if name == "hybrid" else "probabilistic")
    assert d.checkpoint(spec) == (str(tmp_path) if owner in block else None)


@pytest.mark.parametrize("name", sorted(n for n, d in DRAFTERS.items()
                                        if d.kind == MODEL and not d.weights_in_policy_checkpoint and n != "hybrid"))
def test_a_model_drafter_without_its_checkpoint_is_refused_with_the_key_path(name):
    from nemo_rl_specdec.config import ConfigError

    with pytest.raises(ConfigError, match=rf"speculative_decoding\.{name}\.model"):
        load_run_config("configs/tiny_cpu.yaml", [f"policy.generation.speculative_decoding.{name}.model=null",
                                                  f"policy.generation.speculative_decoding.drafter={name}",
                                                  "policy.generation.speculative_decoding.enabled=true"])


def test_an_unknown_drafter_names_the_registered_ones():
    from nemo_rl_specdec.config import ConfigError

    with pytest.raises(ConfigError, match="speculative_decoding.drafter") as e:
        load_run_config("configs/tiny_cpu.yaml", ["policy.generation.speculative_decoding.drafter=medusa"])
    assert all(n in str(e.value) for n in DRAFTERS)
    with pytest.raises(KeyError, match="allowed"):
        drafter("medusa", Declared)


def _name_comparisons(text: str, where: str) -> list:
    """`x == "eagle3"`, `x in ("suffix", ...)`, `x != "mtp"`: comparisons with a registered drafter name."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.Compare):
            continue
        for comp in [node.left, *node.comparators]:
            consts = [comp] if isinstance(comp, ast.Constant) else list(getattr(comp, "elts", []))
            if any(isinstance(c, ast.Constant) and c.value in DRAFTERS for c in consts):
                out.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
                break
    return out


def test_nothing_outside_drafters_compares_drafter_names():
    files = [p for p in PKG.rglob("*.py") if "drafters" not in p.relative_to(PKG).parts]
    assert len(files) > 40
    found = [hit for p in files for hit in _name_comparisons(p.read_text(), str(p.relative_to(PKG.parent)))]
    assert found == [], "look the drafter up in drafters/registry.py instead:\n" + "\n".join(found)


def test_the_name_check_finds_comparisons():
    text = 'if spec.drafter == "eagle3" or d in ("suffix", "x") or d == "medusa":\n    pass\n'
    assert [h.split(": ", 1)[1] for h in _name_comparisons(text, "t")] == ["spec.drafter == 'eagle3'",
                                                                           "d in ('suffix', 'x')"]
