"""The one list of drafters. Everything else looks a drafter up here and asks it as the role of its
own layer (`drafter(spec, Role)`, the roles on `drafters/roles.py`), which refuses a drafter that
does not play it.

A lookup resolves the block to the registered drafter it configures: the backend's
(`suffix.backend`: `DAS` or `VllmSuffix`; `ngram.backend`: `VllmNgram` or `SpecdecNgram`), or a
`Hybrid` composed of the two parts its `hybrid:` sub-block names. A name alone stands for the block of
that drafter with its defaults.
"""
from __future__ import annotations

from functools import cache
from typing import Any, TypeVar

from nemo_rl_specdec.config.schema import PathError
from nemo_rl_specdec.drafters.base import Drafter, ModelDrafter
from nemo_rl_specdec.drafters.dflash import DFlash
from nemo_rl_specdec.drafters.draft_model import DraftModel
from nemo_rl_specdec.drafters.eagle3 import Eagle3
from nemo_rl_specdec.drafters.hybrid import Hybrid, HybridConfig
from nemo_rl_specdec.drafters.mtp import MTP
from nemo_rl_specdec.drafters.ngram import SpecdecNgram, VllmNgram
from nemo_rl_specdec.drafters.roles import ModelWeights
from nemo_rl_specdec.drafters.suffix import DAS, VllmSuffix

Role = TypeVar("Role")

# every drafter of one part; a drafter with backends once per backend
_PARTS: tuple[Drafter, ...] = (VllmNgram(), SpecdecNgram(), DAS(), VllmSuffix(), DraftModel(), Eagle3(), DFlash(),
                               MTP())
BACKENDS: dict[str, dict[str, Drafter]] = {}  # name -> backend -> its drafter
for _d in _PARTS:
    if _d.backend is not None:
        BACKENDS.setdefault(_d.name, {})[_d.backend] = _d


def _default(name: str) -> Drafter:
    first = next(d for d in _PARTS if d.name == name)
    return BACKENDS[name][first.config.model_fields["backend"].default] if name in BACKENDS else first


_SINGLE = {d.name: _default(d.name) for d in _PARTS}
_MODEL_PARTS = {n: d for n, d in _SINGLE.items() if isinstance(d, ModelDrafter)}


@cache
def _hybrid(history: Drafter, model: ModelDrafter) -> Hybrid:
    return Hybrid(history, model)


# name -> the drafter a block of that name configures with its defaults
DRAFTERS: dict[str, Drafter] = {**_SINGLE, "hybrid": _hybrid(_SINGLE[HybridConfig().history],
                                                              _MODEL_PARTS[HybridConfig().model])}


def _name(name_or_spec: Any) -> Any:
    return name_or_spec if isinstance(name_or_spec, str) else (
        name_or_spec.get("drafter") if isinstance(name_or_spec, dict) else name_or_spec.drafter)


def _setting(spec: Any, block: str, key: str) -> Any:
    """`spec`'s `<block>.<key>` (a validated block or the block as plain data); None where unset."""
    sub = spec.get(block) if isinstance(spec, dict) else getattr(spec, block, None)
    return sub.get(key) if isinstance(sub, dict) else getattr(sub, key, None)


def _part(name: str, spec: Any) -> Drafter:
    """The registered drafter `name` as `spec` configures it: its backend's, if it has backends."""
    backends = BACKENDS.get(name)
    if backends is None:
        return _SINGLE[name]
    chosen = _setting(spec, name, "backend")
    if chosen is None:
        return _SINGLE[name]
    if chosen not in backends:
        raise PathError(f"{name}.backend", chosen, f"one of {list(backends)}")
    return backends[chosen]


def resolve(name_or_spec: Any) -> Drafter:
    """The registered drafter that `name_or_spec` configures: a name (its defaults), or a block with a
    `.drafter` / `["drafter"]`. A bad name is a KeyError; a bad part or backend, a PathError."""
    name = _name(name_or_spec)
    if name not in DRAFTERS:
        raise KeyError(f"drafter {name!r}: allowed: {list(DRAFTERS)}")
    if isinstance(name_or_spec, str):
        return DRAFTERS[name]
    if name != "hybrid":
        return _part(name, name_or_spec)
    history = _setting(name_or_spec, "hybrid", "history") or HybridConfig().history
    model = _setting(name_or_spec, "hybrid", "model") or HybridConfig().model
    if history not in _SINGLE:
        raise PathError("hybrid.history", history, "'suffix' (DAS, suffix.backend: das)")
    if model not in _MODEL_PARTS:
        why = (f": {model!r} is a history drafter, and a hybrid takes one history part (hybrid.history)"
               if model in _SINGLE else "")
        raise PathError("hybrid.model", model, f"one of {list(_MODEL_PARTS)}{why}")
    return _hybrid(_part(history, name_or_spec), _MODEL_PARTS[model])


def playing(name_or_spec: Any, role: type[Role]) -> Role | None:
    """What plays `role` for the drafter `name_or_spec` configures (`resolve`): the drafter, or the part
    a drafter made of parts hands for it (a hybrid's weights are its model part's); None where nothing
    does."""
    d = resolve(name_or_spec).as_role(role)
    return d if isinstance(d, role) else None


def drafter(name_or_spec: Any, role: type[Role]) -> Role:
    """`playing`, as the layer that asks expects it: a TypeError if the drafter takes no part in `role`
    (the runtime-checkable protocol of that layer)."""
    d = playing(name_or_spec, role)
    if d is None:
        raise TypeError(f"drafter {_name(name_or_spec)!r} takes no part in {role.__name__}")
    return d


def registered(role: type[Role]) -> dict[str, Role]:
    """Every registered drafter that takes part in `role`, by name, as its defaults configure it."""
    out = {n: playing(n, role) for n in DRAFTERS}
    return {n: d for n, d in out.items() if d is not None}


def weights_in_policy(name_or_spec: Any) -> bool:
    """Whether the drafter's weights ride in the policy's checkpoint (MTP layers); a list drafter has no
    weights."""
    d = playing(name_or_spec, ModelWeights)
    return d is not None and d.weights_in_policy_checkpoint


__all__ = ["BACKENDS", "DRAFTERS", "drafter", "playing", "registered", "resolve", "weights_in_policy"]
