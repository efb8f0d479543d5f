"""Lockstep between policy and drafter: versions, the staleness rule, and refresh errors.

Every engine carries one `LockstepState` (policy_version, drafter_version, drafter_built_from). The
rule checked before every generate call: policy_version - drafter_version <= refresh.max_policy_lag
(0 by default: sync pipelines must be equal). A frozen drafter is exempt by definition, and a
drafter disabled by `on_refresh_error: disable` is reported rather than checked.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

# `rollouts` value of an update whose rollouts were handed over earlier (Engine.stage_rollouts): the
# rollout-store drafter installs the rebuild it staged for exactly that version, or refuses
STAGED_ROLLOUTS = "staged"


class DrafterRefreshError(RuntimeError):
    """A drafter refresh did not land (missing drafter, unmatched or missing tensors, no rollouts)."""


class StaleDrafterError(RuntimeError):
    """Generation refused: the drafter is further behind the policy than the config allows, or
    the last policy update failed part-way."""


@dataclass
class LockstepState:
    """One engine's lockstep: the one class the vLLM worker extension keeps (its state is one), the
    NeMo-RL worker actor holds (its engine's, from every update's report) and our driver holds
    (`driver.engine.Engine.lockstep`). `policy_version` is the one version count: the policy the engine
    generates with, which tags its rollouts and names the next update (`policy_version + 1`)."""

    policy_version: int = 0
    drafter_version: int = 0
    drafter_built_from: int = 0  # the policy version the drafter's weights or rollouts came from
    policy_broken: str = ""  # why the last policy load failed part-way; generation refuses until fixed
    disabled: bool = False  # on_refresh_error: disable turned speculation off for this engine
    disabled_reason: str = ""

    @classmethod
    def of(cls, state: dict) -> LockstepState:
        """The lockstep part of an engine's reported state (`specdec_state()`, an update report's)."""
        return cls(**{f.name: state[f.name] for f in fields(cls) if f.name in state})

    @property
    def lag(self) -> int:
        """How many policy versions the drafter trails the policy."""
        return int(self.policy_version) - int(self.drafter_version)

    def check(self, *, mode: str, max_policy_lag: int, enabled: bool = True, engine: str = "engine") -> None:
        """Raise StaleDrafterError when generation must not run with this engine's drafter."""
        if self.policy_broken:
            raise StaleDrafterError(f"{engine}: the policy weights are incomplete ({self.policy_broken}); "
                                    "apply a complete update before generating")
        if not enabled or mode == "frozen" or self.disabled:
            return
        lag = self.lag
        if lag < 0:
            raise StaleDrafterError(f"{engine}: drafter version {self.drafter_version} is ahead of policy version "
                                    f"{self.policy_version} — updates were applied out of order")
        if lag > max_policy_lag:
            raise StaleDrafterError(
                f"{engine}: drafter is stale: policy_version={self.policy_version} drafter_version="
                f"{self.drafter_version} (lag {lag} > refresh.max_policy_lag={max_policy_lag}, mode={mode}). "
                "Refresh the drafter in the same update as the policy, or raise max_policy_lag for async pipelines.")
