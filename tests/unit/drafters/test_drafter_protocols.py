"""The drafter contract is one page, `drafters/roles.py`: small roles a layer asks of a drafter's
declaration (each at most 8 members; together they cover everything a drafter declares; a drafter
plays only the roles it has, and a lookup as a role it does not play is refused), and the runtime
contracts the engine checks by type on our proposers inside a vLLM worker."""
from __future__ import annotations

import ast
import typing
from pathlib import Path
from types import SimpleNamespace

import pytest

from nemo_rl_specdec.drafters import base, roles
from nemo_rl_specdec.drafters.base import LIST, MODEL
from nemo_rl_specdec.drafters.registry import DRAFTERS, drafter, registered

PKG = Path(__file__).resolve().parents[3] / "nemo_rl_specdec"
ROLES = [roles.Declared, roles.VllmMapping, roles.Refreshable, roles.ModelWeights, roles.NemoRLRules,
         roles.PricedDrafter]
OPTIONAL = [roles.TeacherForced]
RUNTIME = [roles.EngineProposer, roles.ListProposer, roles.BesideProposer, roles.RolloutStore, roles.CarriesState]
MAX_MEMBERS = 8


def members(proto) -> set:
    from typing_extensions import get_protocol_members

    return set(get_protocol_members(proto))


def plays(d) -> set:
    """The roles a drafter of this kind must play: every one, but a list drafter has no weights."""
    return {r for r in ROLES if not (d.kind == LIST and r is roles.ModelWeights)}


@pytest.mark.parametrize("proto", ROLES + OPTIONAL + RUNTIME, ids=lambda p: p.__name__)
def test_each_contract_is_small_and_on_the_one_page(proto):
    assert typing.Protocol in proto.__mro__ and proto.__module__ == "nemo_rl_specdec.drafters.roles"
    assert 1 <= len(members(proto)) <= MAX_MEMBERS, sorted(members(proto))


def test_the_roles_cover_what_a_drafter_declares_once():
    seen: dict = {}
    for proto in ROLES:
        for m in members(proto):
            assert m not in seen, f"{m} is in {seen.get(m)} and {proto.__name__}"
            seen[m] = proto.__name__
    # a model drafter's public members: every one is some role's (helpers of the defaults excepted)
    # (and the registry's resolution: which backend a drafter is, the part that plays a role for it)
    helpers = {"build_distiller", "backend", "as_role"}
    public = ({m for m in dir(base.ModelDrafter) if not m.startswith("_")} - helpers) | {"name"}  # each one's own
    assert public - set(seen) == set() and set(seen) - public == set()


@pytest.mark.parametrize("name", sorted(DRAFTERS))
def test_every_drafter_plays_the_roles_of_its_kind_and_no_other(name):
    d = DRAFTERS[name]
    assert d.kind in (LIST, MODEL)
    for role in ROLES:
        if role in plays(d):
            part = d.as_role(role)  # itself, or the part that plays it (a hybrid's weights: its model part's)
            assert drafter(name, role) is part and registered(role)[name] is part  # the lookup checks it
            assert part is d or (d.cost_parts is not None and role is roles.ModelWeights)
            for m in members(role):
                assert hasattr(part, m), m
        else:
            assert not isinstance(d, role) and name not in registered(role)


@pytest.mark.parametrize("name", sorted(n for n, d in DRAFTERS.items() if d.kind == LIST))
def test_a_list_drafter_has_no_weights_and_its_lookup_as_one_is_refused(name):
    """A real lookup of a real drafter: the online trainer is asked of a drafter without weights."""
    assert not hasattr(DRAFTERS[name], "distiller")
    with pytest.raises(TypeError, match=f"'{name}' takes no part in ModelWeights"):
        drafter(name, roles.ModelWeights)
    with pytest.raises(TypeError, match="takes no part in ModelWeights"):
        drafter({"drafter": name}, roles.ModelWeights)


def test_the_model_drafters_are_exactly_those_with_weights():
    assert set(registered(roles.ModelWeights)) == {n for n, d in DRAFTERS.items() if d.kind == MODEL}
    assert {"draft_model", "eagle3", "mtp", "dflash", "hybrid"} <= set(registered(roles.ModelWeights))


# ------------------------------------------------------------------------------ runtime contracts

def _das():
    from nemo_rl_specdec.drafters.suffix import DASProposer

    return DASProposer(SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4),
                                       model_config=SimpleNamespace(max_model_len=64)))


def _ngram():
    pytest.importorskip("vllm.v1.spec_decode.ngram_proposer")
    from nemo_rl_specdec.drafters.ngram import NgramProposer

    return NgramProposer(SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4),
                                         model_config=SimpleNamespace(max_model_len=64),
                                         scheduler_config=SimpleNamespace(max_num_seqs=8)))


def _hybrid():
    from nemo_rl_specdec.config.run import validate_spec_block
    from nemo_rl_specdec.drafters.hybrid import HybridProposer

    vc = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4),
                         model_config=SimpleNamespace(max_model_len=64))
    runner = SimpleNamespace(vllm_config=vc, input_batch=SimpleNamespace(req_ids=[]), requests={})
    return HybridProposer(runner, validate_spec_block({"enabled": True, "drafter": "hybrid",
                                                      "num_speculative_tokens": 4, "eagle3": {"model": "/ckpt"}}))


@pytest.mark.parametrize("build, contracts", [
    (_das, {roles.EngineProposer, roles.ListProposer, roles.RolloutStore, roles.CarriesState}),
    (_ngram, {roles.EngineProposer, roles.ListProposer}),
    (_hybrid, {roles.EngineProposer, roles.BesideProposer}),
], ids=["das", "ngram", "hybrid"])
def test_our_proposers_keep_the_runtime_contracts_the_engine_checks(build, contracts):
    p = build()
    assert {c for c in RUNTIME if isinstance(p, c)} == contracts
    if roles.BesideProposer in contracts:  # its history half is the store the engine refreshes, saves, restores
        assert {c for c in RUNTIME if isinstance(p.history, c)} >= {roles.RolloutStore, roles.CarriesState}


def test_a_disabled_list_proposer_drafts_nothing():
    """`EngineProposer.specdec_disable`, which the worker extension calls on every proposer of ours."""
    p = _ngram()
    p.specdec_attach(SimpleNamespace(input_batch=SimpleNamespace(req_ids=["a"])), {"ngram": {"backend": "specdec"}})
    p.specdec_disable("refresh failed")
    import numpy as np

    row = np.array([[1, 2, 3, 4, 5, 1, 2, 3]], dtype=np.int32)
    assert p.propose([[3]], np.array([8]), row) == [[]] and p.disabled_reason == "refresh failed"


def test_the_engine_finds_our_proposers_by_type_never_by_probing_members():
    """engine/ and bench/replay.py ask our proposers through the runtime contracts: no `hasattr` on a
    contract member (and the runner's proposers are found by `vllm_compat.our_proposer`)."""
    names = set().union(*(members(c) for c in RUNTIME))
    bad = []
    for p in [*(PKG / "engine").glob("*.py"), PKG / "bench" / "replay.py"]:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("hasattr", "getattr") \
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in names:
                bad.append(f"{p.name}:{node.lineno} {ast.unparse(node)}")
    assert bad == []


def test_no_layer_outside_drafters_types_against_the_base_classes():
    """Consumers see a drafter as their layer's role: none imports `Drafter`, `ModelDrafter` or
    `CheckpointDrafter`."""
    bad = []
    for p in PKG.rglob("*.py"):
        if "drafters" in p.relative_to(PKG).parts[:1]:
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "nemo_rl_specdec.drafters.base":
                bad += [f"{p.relative_to(PKG)}: {a.name}" for a in node.names if a.name.endswith("Drafter")]
    assert bad == []
