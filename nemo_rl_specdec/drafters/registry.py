"""The one list of drafters. Everything else looks a drafter up here and asks it, as the protocol
of its own layer (`drafter(spec, Role)`: `base.Declared`, `base.VllmMapping`,
`lockstep.Refreshable`, `adapter.translate.NemoRLRules`, `cost.price.PricedDrafter`)."""
from __future__ import annotations

from typing import Any, TypeVar

from nemo_rl_specdec.drafters.base import Drafter
from nemo_rl_specdec.drafters.dflash import DFlash
from nemo_rl_specdec.drafters.draft_model import DraftModel
from nemo_rl_specdec.drafters.eagle3 import Eagle3
from nemo_rl_specdec.drafters.hybrid import Hybrid
from nemo_rl_specdec.drafters.mtp import MTP
from nemo_rl_specdec.drafters.ngram import Ngram
from nemo_rl_specdec.drafters.suffix import Suffix

Role = TypeVar("Role")

_SINGLE = (Ngram(), Suffix(), DraftModel(), Eagle3(), DFlash(), MTP())
DRAFTERS: dict[str, Drafter] = {d.name: d for d in (*_SINGLE, Hybrid(_SINGLE))}


def drafter(name_or_spec: Any, role: type[Role]) -> Role:
    """The drafter named `name_or_spec` (a name, or a block with a `.drafter` / `["drafter"]`), as
    `role`: the runtime-checkable protocol of the layer that asks (a TypeError if it takes no part)."""
    name: Any = name_or_spec if isinstance(name_or_spec, str) else (
        name_or_spec.get("drafter") if isinstance(name_or_spec, dict) else name_or_spec.drafter)
    try:
        d = DRAFTERS[name]
    except KeyError:
        raise KeyError(f"drafter {name!r}: allowed: {list(DRAFTERS)}") from None
    if not isinstance(d, role):
        raise TypeError(f"drafter {name!r} takes no part in {role.__name__}")
    return d


def registered(role: type[Role]) -> dict[str, Role]:
    """Every registered drafter that takes part in `role`, by name."""
    return {n: d for n, d in DRAFTERS.items() if isinstance(d, role)}
