"""One lockstep state (`lockstep.LockstepState`): the vLLM worker extension's state is one, the
NeMo-RL worker actor and our driver each hold their engine's, and the rule checked before every
generate call is its method."""
import dataclasses

import pytest

from nemo_rl_specdec.lockstep import LockstepState, StaleDrafterError


def test_it_is_read_from_an_engines_reported_state_and_nothing_else():
    s = LockstepState.of({"policy_version": 3, "drafter_version": 2, "drafter_built_from": 2, "disabled": False,
                          "mode": "refit", "metrics": {"x": 1.0}, "updates": 3})
    assert s == LockstepState(policy_version=3, drafter_version=2, drafter_built_from=2) and s.lag == 1


def test_the_worker_extensions_state_is_one():
    pytest.importorskip("torch")
    from nemo_rl_specdec.engine.worker_extension import _EngineState

    st = _EngineState(policy_version=2, drafter_version=2, spec={"enabled": True})
    assert isinstance(st, LockstepState) and LockstepState.of(dataclasses.asdict(st)) == LockstepState(2, 2)


@pytest.mark.parametrize("state, kw, error", [
    (LockstepState(2, 1), {"mode": "refit", "max_policy_lag": 0},
     r"drafter is stale: policy_version=2 drafter_version=1 \(lag 1 > refresh.max_policy_lag=0, mode=refit\)"),
    (LockstepState(1, 2), {"mode": "refit", "max_policy_lag": 3}, "drafter version 2 is ahead of policy version 1"),
    (LockstepState(2, 2, policy_broken="layer 3 missing"), {"mode": "frozen", "max_policy_lag": 0},
     r"the policy weights are incomplete \(layer 3 missing\)"),
])
def test_the_rule_refuses_a_stale_or_broken_engine_naming_it(state, kw, error):
    with pytest.raises(StaleDrafterError, match="^e7: " + error):
        state.check(engine="e7", **kw)


@pytest.mark.parametrize("state, kw", [
    (LockstepState(2, 1), {"mode": "refit", "max_policy_lag": 1}),
    (LockstepState(5, 0), {"mode": "frozen", "max_policy_lag": 0}),     # a frozen drafter is exempt
    (LockstepState(5, 0, disabled=True), {"mode": "rebuild", "max_policy_lag": 0}),  # reported, not checked
    (LockstepState(5, 0), {"mode": "rebuild", "max_policy_lag": 0, "enabled": False}),
])
def test_the_rule_lets_a_current_exempt_or_disabled_drafter_generate(state, kw):
    state.check(**kw)
