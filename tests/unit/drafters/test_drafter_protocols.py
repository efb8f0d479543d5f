"""The drafter contract is a few small protocols, one per layer that asks a drafter, each defined
in that layer: every one has at most 8 members, together they cover everything a drafter
declares, and every registered drafter takes part in each one its layers ask it."""
from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

from nemo_rl_specdec.adapter.translate import NemoRLRules
from nemo_rl_specdec.cost.price import PricedDrafter
from nemo_rl_specdec.drafters import base
from nemo_rl_specdec.drafters.registry import DRAFTERS, drafter, registered
from nemo_rl_specdec.lockstep import Refreshable

PKG = Path(__file__).resolve().parents[3] / "nemo_rl_specdec"
# protocol -> the module of the layer that asks it (config.py and the engine share base.py's two)
PROTOCOLS = {base.Declared: "nemo_rl_specdec.drafters.base", base.VllmMapping: "nemo_rl_specdec.drafters.base",
             Refreshable: "nemo_rl_specdec.lockstep", NemoRLRules: "nemo_rl_specdec.adapter.translate",
             PricedDrafter: "nemo_rl_specdec.cost.price"}
MAX_MEMBERS = 8


def members(proto) -> set:
    from typing_extensions import get_protocol_members

    return set(get_protocol_members(proto))


@pytest.mark.parametrize("proto", list(PROTOCOLS), ids=lambda p: p.__name__)
def test_each_protocol_is_small_and_lives_in_its_layer(proto):
    assert typing.Protocol in proto.__mro__ and proto.__module__ == PROTOCOLS[proto]
    assert 1 <= len(members(proto)) <= MAX_MEMBERS, sorted(members(proto))


def test_the_protocols_cover_what_a_drafter_declares_once():
    seen: dict = {}
    for proto in PROTOCOLS:
        for m in members(proto):
            assert m not in seen, f"{m} is in {seen.get(m)} and {proto.__name__}"
            seen[m] = proto.__name__
    # the base's public members: every one is some protocol's (helpers of the defaults excepted)
    helpers = {"build_distiller"}
    public = ({m for m in dir(base.Drafter) if not m.startswith("_")} - helpers) | {"name"}  # each drafter's own
    assert public - set(seen) == set() and set(seen) - public == set()


@pytest.mark.parametrize("name", sorted(DRAFTERS))
@pytest.mark.parametrize("proto", list(PROTOCOLS), ids=lambda p: p.__name__)
def test_every_drafter_takes_part_in_each_layers_protocol(name, proto):
    d = drafter(name, proto)  # the lookup checks it (runtime_checkable)
    assert isinstance(d, proto) and registered(proto)[name] is d
    for m in members(proto):
        assert getattr(d, m) is not None, m


def test_a_lookup_as_a_protocol_the_drafter_misses_is_refused():
    @typing.runtime_checkable
    class Medusa(typing.Protocol):
        def heads(self) -> int: ...

    with pytest.raises(TypeError, match="'suffix' takes no part in Medusa"):
        drafter("suffix", Medusa)
    assert registered(Medusa) == {}


def test_no_layer_outside_drafters_types_against_the_base_class():
    """Consumers see a drafter as their layer's protocol: none imports `Drafter` or `CheckpointDrafter`."""
    bad = []
    for p in PKG.rglob("*.py"):
        if p.parent.name == "drafters" or "drafters" in p.relative_to(PKG).parts[:1]:
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "nemo_rl_specdec.drafters.base":
                bad += [f"{p.relative_to(PKG)}: {a.name}" for a in node.names if a.name.endswith("Drafter")]
    assert bad == []
