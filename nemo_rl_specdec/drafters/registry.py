"""The one list of drafters. Everything else looks a drafter up here and asks it as the role of its
own layer (`drafter(spec, Role)`, the roles on `drafters/roles.py`), which refuses a drafter that
does not play it."""
from __future__ import annotations

from typing import Any, TypeVar

from nemo_rl_specdec.drafters.base import Drafter
from nemo_rl_specdec.drafters.dflash import DFlash
from nemo_rl_specdec.drafters.draft_model import DraftModel
from nemo_rl_specdec.drafters.eagle3 import Eagle3
from nemo_rl_specdec.drafters.hybrid import Hybrid
from nemo_rl_specdec.drafters.mtp import MTP
from nemo_rl_specdec.drafters.ngram import Ngram
from nemo_rl_specdec.drafters.roles import ModelWeights
from nemo_rl_specdec.drafters.suffix import Suffix

Role = TypeVar("Role")

_SINGLE = (Ngram(), Suffix(), DraftModel(), Eagle3(), DFlash(), MTP())
DRAFTERS: dict[str, Drafter] = {d.name: d for d in (*_SINGLE, Hybrid(_SINGLE))}


def _name(name_or_spec: Any) -> Any:
    return name_or_spec if isinstance(name_or_spec, str) else (
        name_or_spec.get("drafter") if isinstance(name_or_spec, dict) else name_or_spec.drafter)


def drafter(name_or_spec: Any, role: type[Role]) -> Role:
    """The drafter named `name_or_spec` (a name, or a block with a `.drafter` / `["drafter"]`), as
    `role`: the runtime-checkable protocol of the layer that asks (a TypeError if it takes no part)."""
    name = _name(name_or_spec)
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


def weights_in_policy(name_or_spec: Any) -> bool:
    """Whether the drafter's weights ride in the policy's checkpoint (MTP layers); a list drafter has no
    weights."""
    d = registered(ModelWeights).get(_name(name_or_spec))
    return d is not None and d.weights_in_policy_checkpoint
