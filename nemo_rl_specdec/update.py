"""One policy update, as it travels from the trainer to every engine's worker, and its report.

`PolicyUpdate` is what `Engine.update`, `Engine.submit_update`, `EngineGroup.update`, the engine
actors, the worker extension's `specdec_apply_update` / `specdec_after_policy_weights` RPCs and
the NeMo-RL worker actors' staging (`specdec_stage_update`) all take: the new policy version, the
policy weights, and what refreshes the drafter (drafter weights, rollouts, or neither). It is a
frozen dataclass of plain values (or Ray object refs while staged), so it pickles through Ray and
an in-process `collective_rpc` unchanged. vLLM's multiprocess engine core (NeMo-RL's async
engine) is reached through vLLM's msgpack, which would turn it into the map of its fields, every
tensor in it into a bare (dtype, shape, buffer) triple, and pickle each Ray ref without its owner:
there it travels as `to_rpc()`'s bytes, refs resolved first, and `PolicyUpdate.from_rpc` turns
them back.

`UpdateReport` is what one engine reports once the update landed: what was applied, whether the
drafter was refreshed, and the engine's state (versions, disabled, ...) after it. `to_dict()` is
its flat form for metrics and JSON.

No NeMo-RL, no vLLM, no Ray import.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any


class UpdateError(ValueError):
    """A policy update is malformed (the message names the field and the allowed values)."""


@dataclass(frozen=True)
class PolicyUpdate:
    """One policy update (policy weights + drafter refresh + version), applied as a unit.

    Weights (`policy`, `drafter_weights`): a dict of tensors | safetensors bytes | a path | None.
    `rollouts`: the step's rollouts for a rollout-store drafter (records, engine rollouts or dicts
    with their keys, a `RolloutBatch`), `lockstep.STAGED_ROLLOUTS` for the store staged earlier,
    or None. `drafter_version`: the policy version the pushed drafter weights were trained for
    (default: `version`). `refresh_drafter=False`: an off-cadence step, the drafter ages.
    `drafter_checkpoint`: the trainer's drafter is still the checkpoint the engine loaded (online
    mode before its first publication)."""

    version: int
    policy: Any = None
    drafter_weights: Any = None
    rollouts: Any = None
    drafter_version: int | None = None
    refresh_drafter: bool = True
    drafter_checkpoint: bool = False

    def __post_init__(self):
        for name in ("version", "drafter_version"):
            v = getattr(self, name)
            if v is None and name == "drafter_version":
                continue
            if isinstance(v, bool) or not isinstance(v, int) and not hasattr(v, "__index__"):
                raise UpdateError(f"PolicyUpdate.{name}: got {v!r}; allowed: an int policy version >= 0")
            if int(v) < 0:
                raise UpdateError(f"PolicyUpdate.{name}: got {v!r}; allowed: an int policy version >= 0")
            object.__setattr__(self, name, int(v))
        object.__setattr__(self, "refresh_drafter", bool(self.refresh_drafter))
        object.__setattr__(self, "drafter_checkpoint", bool(self.drafter_checkpoint))

    def to_rpc(self) -> bytes:
        """The update as one pickled blob, for a `collective_rpc` into vLLM's multiprocess engine core
        (module docstring). Raises UpdateError while it still holds Ray object refs: pickled outside
        Ray, a ref loses its owner and cannot be fetched there (resolve them first)."""
        import pickle

        rollouts = self.rollouts if isinstance(self.rollouts, list | tuple) else [self.rollouts]
        refs = [name for name, values in (("drafter_weights", [self.drafter_weights]), ("rollouts", rollouts))
                if any(type(v).__name__ == "ObjectRef" for v in values)]
        if refs:
            raise UpdateError(f"PolicyUpdate.to_rpc: {', '.join(refs)} still hold Ray object refs; allowed: the "
                              "values they hold (a ref pickled outside Ray loses its owner)")
        return pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def from_rpc(cls, obj: Any) -> PolicyUpdate:
        """`obj` as a `collective_rpc` argument arrives: the update itself (in-process engine core), or
        `to_rpc()`'s bytes (multiprocess engine core). Anything else is a TypeError."""
        if isinstance(obj, cls):
            return obj
        if isinstance(obj, bytes | bytearray | memoryview):
            import pickle

            out = pickle.loads(obj)
            if isinstance(out, cls):
                return out
            raise TypeError(f"expected PolicyUpdate.to_rpc() bytes, got the bytes of a {type(out).__name__}")
        raise TypeError(f"expected a nemo_rl_specdec.update.PolicyUpdate or its to_rpc() bytes, "
                        f"got {type(obj).__name__}")

    def with_(self, **changes: Any) -> PolicyUpdate:
        """A copy with `changes` (e.g. staged Ray refs replaced by what they hold)."""
        return replace(self, **changes)


@dataclass
class UpdateReport:
    """What one engine did with one `PolicyUpdate`.

    `state` is the engine's state after the update (`policy_version`, `drafter_version`,
    `drafter_built_from`, `disabled`, ...: the worker extension's `specdec_state()`)."""

    policy_version: int
    mode: str
    drafter_refreshed: bool = False
    drafter_tensors_applied: int = 0
    rollouts_added: int = 0
    policy_tensors_applied: int = 0
    refresh_s: float = 0.0
    staged: bool = False              # the rollout store staged earlier was installed
    staged_wait_s: float | None = None    # how long installing it waited for its rebuild (critical path)
    staged_rebuild_s: float | None = None  # the rebuild's own time on its background thread
    state: dict = field(default_factory=dict)
    prefix_cache_reset: bool = False  # set by the engine after the RPC
    in_flight_requests: int | None = None  # requests paused and resumed around an in-flight update
    # NeMo-RL refits (adapter/extension.py): the refit RPC that carried it, rollouts fetched, fetch time
    transport: str | None = None
    rollouts: int | None = None
    rollouts_fetch_s: float | None = None

    @property
    def drafter_version(self) -> int:
        return int(self.state.get("drafter_version", 0))

    @property
    def disabled(self) -> bool:
        return bool(self.state.get("disabled"))

    @property
    def disabled_reason(self) -> str:
        return str(self.state.get("disabled_reason", ""))

    def to_dict(self) -> dict:
        """Flat: the report's fields (unset optional ones left out) over the engine's state."""
        own = {k: v for k, v in asdict(self).items() if k != "state" and v is not None}
        if not self.staged:
            own.pop("staged")
        return {**self.state, **own}
