"""Lockstep between policy and drafter: versions, the staleness rule, and refresh errors.

Every engine carries (policy_version, drafter_version, drafter_built_from). The rule checked
before every generate call: policy_version - drafter_version <= refresh.max_policy_lag
(0 by default: sync pipelines must be equal). A frozen drafter is exempt by definition, and a
drafter disabled by `on_refresh_error: disable` is reported rather than checked.
"""
from __future__ import annotations

# `rollouts` value of an update whose rollouts were handed over earlier (Engine.stage_rollouts): the
# rollout-store drafter installs the rebuild it staged for exactly that version, or refuses
STAGED_ROLLOUTS = "staged"


class DrafterRefreshError(RuntimeError):
    """A drafter refresh did not land (missing drafter, unmatched or missing tensors, no rollouts)."""


class StaleDrafterError(RuntimeError):
    """Generation refused: the drafter is further behind the policy than the config allows, or
    the last policy update failed part-way."""


def policy_lag(state: dict) -> int:
    return int(state["policy_version"]) - int(state["drafter_version"])


def check_versions(state: dict, *, mode: str, max_policy_lag: int, enabled: bool = True,
                   engine: str = "engine") -> None:
    """Raise StaleDrafterError when generation must not run with this engine's drafter."""
    if state.get("policy_broken"):
        raise StaleDrafterError(f"{engine}: the policy weights are incomplete ({state['policy_broken']}); "
                                "apply a complete update before generating")
    if not enabled or mode == "frozen" or state.get("disabled"):
        return
    lag = policy_lag(state)
    if lag < 0:
        raise StaleDrafterError(f"{engine}: drafter version {state['drafter_version']} is ahead of policy version "
                                f"{state['policy_version']} — updates were applied out of order")
    if lag > max_policy_lag:
        raise StaleDrafterError(
            f"{engine}: drafter is stale: policy_version={state['policy_version']} drafter_version="
            f"{state['drafter_version']} (lag {lag} > refresh.max_policy_lag={max_policy_lag}, mode={mode}). "
            "Refresh the drafter in the same update as the policy, or raise max_policy_lag for async pipelines.")

