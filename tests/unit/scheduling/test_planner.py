"""planner.py: predict → place → budget for one batch, observe, and the one-request pick."""
from __future__ import annotations

import pytest

from nemo_rl_specdec.scheduling.budget import engine_budgets
from nemo_rl_specdec.scheduling.planner import Planner, check_policies
from nemo_rl_specdec.scheduling.predictor import LengthPredictor


def _planner(**kw):
    return Planner(LengthPredictor(cold_start="mean", max_len=1000), k=8, **kw)


def test_plan_predicts_places_and_restores():
    p = _planner(placement="length_aware")
    pids = [f"p{i // 4}" for i in range(16)]
    lengths = {"p0": 900, "p1": 800, "p2": 50, "p3": 40}
    p.observe(pids, [lengths[x] for x in pids])
    plan = p.plan(pids, 2)
    assert plan.predicted == [float(lengths[x]) for x in pids]
    sent_order = [i for eng in plan.assignment for i in eng]
    assert sorted(sent_order) == list(range(16))
    assert [sent_order[r] for r in plan.restore] == list(range(16))
    assert plan.loads() == [1790.0 * 2, 1790.0 * 2]  # LPT balances the groups
    assert [plan.engine_of[i] for i in plan.assignment[1]] == [1] * 8
    assert plan.budgets == [None] * 16 and plan.hints == [None] * 16  # uniform: the drafter's k


def test_requests_without_a_problem_id_get_the_cold_prediction_and_their_own_group():
    p = _planner(placement="length_aware")
    p.observe(["a", "b"], [100, 300])
    plan = p.plan([None, None, "a"], 3)
    assert plan.predicted == [200.0, 200.0, 100.0]
    assert sorted(len(eng) for eng in plan.assignment) == [1, 1, 1]


def test_budgets_per_engine_keep_fixed_ones_and_hint_only_the_planners():
    p = _planner(budget="length_aware")
    pids = [f"p{i}" for i in range(8)]
    p.observe(pids, [50 * (i + 1) for i in range(8)])
    fixed = [None, 3] + [None] * 6
    plan = p.plan(pids, 2, fixed=fixed)
    want = engine_budgets(plan.predicted, plan.assignment, 8, "length_aware", fixed=fixed, acceptance=0.7)
    assert plan.budgets == want and plan.budgets[1] == 3
    assert plan.hints[1] is None  # a budget the caller fixed is a cap: never lifted
    assert [h is None for h in plan.hints] == [
        b is None or f is not None for b, f in zip(plan.budgets, fixed, strict=True)
    ]


def test_pick_sends_each_request_to_the_least_loaded_engine():
    p = Planner(LengthPredictor(), placement="length_aware")
    p.observe(["long", "short"], [1000, 10])
    e1, l1 = p.pick("long", 2)
    e2, _ = p.pick("short", 2)
    e3, _ = p.pick("short", 2)
    assert (e1, e2, e3) == (0, 1, 1)
    p.release(e1, l1)
    assert p.pick("short", 2)[0] == 0
    cold = Planner(LengthPredictor())
    assert [cold.pick("x", 3)[0] for _ in range(6)] == [0, 1, 2, 0, 1, 2]


def test_unknown_policies_are_named():
    with pytest.raises(ValueError, match=r"budget='fast': expected one of \['uniform'"):
        check_policies("contiguous", "fast")
    with pytest.raises(ValueError, match=r"placement='x'"):
        _planner().plan(["a"], 1, placement="x")
