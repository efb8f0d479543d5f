"""The one list of drafters. Everything else looks a drafter up here and asks it."""
from __future__ import annotations

from typing import Any

from nemo_rl_specdec.drafters.base import Drafter
from nemo_rl_specdec.drafters.dflash import DFlash
from nemo_rl_specdec.drafters.draft_model import DraftModel
from nemo_rl_specdec.drafters.eagle3 import Eagle3
from nemo_rl_specdec.drafters.mtp import MTP
from nemo_rl_specdec.drafters.ngram import Ngram
from nemo_rl_specdec.drafters.suffix import Suffix

DRAFTERS: dict[str, Drafter] = {d.name: d for d in (Ngram(), Suffix(), DraftModel(), Eagle3(), DFlash(), MTP())}


def drafter(name_or_spec: Any) -> Drafter:
    """The drafter named `name_or_spec` (a name, or a block with a `.drafter` / `["drafter"]`)."""
    name: Any = name_or_spec if isinstance(name_or_spec, str) else (
        name_or_spec.get("drafter") if isinstance(name_or_spec, dict) else name_or_spec.drafter)
    try:
        return DRAFTERS[name]
    except KeyError:
        raise KeyError(f"drafter {name!r}: allowed: {list(DRAFTERS)}") from None
