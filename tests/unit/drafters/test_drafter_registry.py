"""The drafter layer: every registered drafter keeps the contract, and nothing outside
`drafters/` compares drafter names (they look the drafter up instead)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from nemo_rl_specdec.config.run import SpecDecConfig, load_run_config, to_vllm_speculative_config
from nemo_rl_specdec.config.schema import Strict
from nemo_rl_specdec.drafters.base import HOST, LIST, MODEL, PARALLEL, SEQUENTIAL, Drafter
from nemo_rl_specdec.drafters.registry import DRAFTERS, drafter, weights_in_policy
from nemo_rl_specdec.drafters.roles import Declared

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
    if d.kind == MODEL and not weights_in_policy(name):
        block[owner] = {"model": str(tmp_path)}
    spec = SpecDecConfig.model_validate(block)
    out = to_vllm_speculative_config(spec, temperature=1.0)
    assert out["num_speculative_tokens"] == 3 and isinstance(out["method"], str)
    if d.kind == MODEL:  # lossless at T>0 and better accepted; the hybrid's mixed batches verify greedy drafts
        assert out["draft_sample_method"] == ("greedy" if name == "hybrid" else "probabilistic")
    assert d.checkpoint(spec) == (str(tmp_path) if owner in block else None)


@pytest.mark.parametrize("name", sorted(n for n, d in DRAFTERS.items()
                                        if d.kind == MODEL and not weights_in_policy(n) and n != "hybrid"))
def test_a_model_drafter_without_its_checkpoint_is_refused_with_the_key_path(name):
    from nemo_rl_specdec.config.run import ConfigError

    with pytest.raises(ConfigError, match=rf"speculative_decoding\.{name}\.model"):
        load_run_config("configs/tiny_cpu.yaml", [f"policy.generation.speculative_decoding.{name}.model=null",
                                                  f"policy.generation.speculative_decoding.drafter={name}",
                                                  "policy.generation.speculative_decoding.enabled=true"])


def test_an_unknown_drafter_names_the_registered_ones():
    from nemo_rl_specdec.config.run import ConfigError

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


# ------------------------------------------------------------------------------ resolution at lookup

@pytest.mark.parametrize("name, backend, judges, budgets, own, entry", [
    ("suffix", "das", True, True, False, "das"),
    ("suffix", "vllm", False, False, True, "vllm_suffix"),
    ("ngram", "vllm", False, False, False, "ngram"),
    ("ngram", "specdec", True, False, False, "ngram_specdec"),
])
def test_a_backend_resolves_to_its_own_registered_drafter_whose_answers_are_constants(name, backend, judges, budgets,
                                                                                      own, entry):
    from nemo_rl_specdec.drafters.registry import BACKENDS, resolve
    from nemo_rl_specdec.drafters.roles import PricedDrafter, VllmMapping

    spec = SpecDecConfig.model_validate({"enabled": True, "drafter": name, name: {"backend": backend}})
    d = resolve(spec)
    assert d is BACKENDS[name][backend] and d is resolve(spec.model_dump(mode="json"))  # the block as plain data
    assert (d.judges_steps, d.takes_request_budgets, d.caches_own_requests) == (judges, budgets, own)
    assert drafter(spec, PricedDrafter).cost_entry == entry and drafter(spec, VllmMapping) is d
    assert resolve(name) is resolve({"drafter": name})  # a name is the block with its defaults


def test_no_drafter_asks_the_block_which_backend_it_is():
    """The registry picks the backend's drafter once, at lookup: nothing in drafters/ reads `<x>.backend`
    of a block (only a sub-block's own validator reads its field)."""
    bad = []
    for p in (PKG / "drafters").glob("*.py"):
        if p.name == "registry.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr == "backend" and isinstance(node.value, ast.Attribute)
                    and node.value.attr in DRAFTERS):
                bad.append(f"{p.name}:{node.lineno}: {ast.unparse(node)}")
    assert bad == []


@pytest.mark.parametrize("model", ["eagle3", "dflash", "draft_model", "mtp"])
def test_a_hybrid_is_composed_of_the_registered_parts_its_block_names(model, tmp_path):
    from nemo_rl_specdec.drafters.registry import resolve
    from nemo_rl_specdec.drafters.roles import ModelWeights, NemoRLRules

    block = {"drafter": "hybrid", "hybrid": {"model": model}}
    h = resolve(block)
    assert h.history is resolve({"drafter": "suffix"}) and h.model is DRAFTERS[model]
    assert resolve(block) is h  # one composition per pair of parts
    assert h.refresh_modes == DRAFTERS[model].refresh_modes and h.cost_parts == {"history": "das", "model": model}
    assert drafter(block, ModelWeights) is DRAFTERS[model] and drafter(block, NemoRLRules) is h


@pytest.mark.parametrize("block, path", [
    ({"drafter": "hybrid", "hybrid": {"model": "suffix"}}, "hybrid.model"),
    ({"drafter": "hybrid", "hybrid": {"model": "medusa"}}, "hybrid.model"),
    ({"drafter": "hybrid", "hybrid": {"history": "lookahead"}}, "hybrid.history"),
    ({"drafter": "suffix", "suffix": {"backend": "arctic"}}, "suffix.backend"),
])
def test_a_part_or_backend_that_is_not_registered_is_refused_at_lookup_with_its_path(block, path):
    from nemo_rl_specdec.config.schema import PathError
    from nemo_rl_specdec.drafters.registry import resolve

    with pytest.raises(PathError) as e:
        resolve(block)
    assert e.value.rel_path == path
