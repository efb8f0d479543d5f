"""sharding.py: how a batch is planned across NeMo-RL's vLLM engines (contiguous, length-aware,
least-loaded pick) and restored to input order."""
from __future__ import annotations

import pytest

from nemo_rl_specdec.nemo_rl import sharding


def test_planner_keeps_contiguous_sharding_when_asked():
    p = sharding.Planner("contiguous")
    assert not p.active and p.plan(["a"] * 8, 2) is None


def test_planner_length_aware_balances_and_restores_order():
    p = sharding.Planner("length_aware", max_new_tokens=1000)
    pids = [f"p{i // 4}" for i in range(16)]           # 4 GRPO groups of 4, contiguous like NeMo-RL
    lengths = {"p0": 900, "p1": 800, "p2": 50, "p3": 40}
    p.observe(pids, [lengths[x] for x in pids])
    plan = p.plan(pids, 2)
    assert sorted(plan.sent_order) == list(range(16))
    assert [plan.sent_order[r] for r in plan.restore] == list(range(16))
    assert plan.stats["contiguous_predicted_imbalance"] == pytest.approx(1700 * 4 / ((1790 * 4) / 2))
    assert plan.stats["predicted_imbalance"] < plan.stats["contiguous_predicted_imbalance"]
    assert plan.stats["predicted_imbalance"] == pytest.approx(1.0)
    assert plan.actual_stats([lengths[x] for x in pids]) == {"actual_imbalance": pytest.approx(1.0)}
    assert p.plan(pids[:1], 2) is None  # fewer requests than engines: NeMo-RL's own sharding


def test_planner_pick_sends_each_request_to_the_least_loaded_engine():
    p = sharding.Planner("length_aware")
    p.observe(["long", "short"], [1000, 10])
    e1, l1 = p.pick("long", 2)
    e2, _ = p.pick("short", 2)
    e3, _ = p.pick("short", 2)
    assert (e1, e2, e3) == (0, 1, 1)
    p.release(e1, l1)
    assert p.pick("short", 2)[0] == 0
    cold = sharding.Planner("length_aware")
    assert [cold.pick("x", 3)[0] for _ in range(6)] == [0, 1, 2, 0, 1, 2]
