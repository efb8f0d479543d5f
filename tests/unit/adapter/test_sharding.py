"""sharding.py: NeMo-RL's side of the plan (scheduling.planner.Planner): when NeMo-RL's contiguous
shards are kept, the budgets sent to the workers, and the per-step placement statistics."""
from __future__ import annotations

import pytest

from nemo_rl_specdec.adapter import sharding
from nemo_rl_specdec.config.run import SpecDecConfig


def test_contiguous_uniform_keeps_nemo_rls_sharding():
    p = sharding.planner_for(None)
    assert not sharding.reshards(p) and sharding.shard(p, ["a"] * 8, 2) is None


def test_length_aware_balances_restores_order_and_reports_imbalance():
    p = sharding.planner_for(None, max_new_tokens=1000, placement="length_aware")
    pids = [f"p{i // 4}" for i in range(16)]           # 4 GRPO groups of 4, contiguous like NeMo-RL
    lengths = {"p0": 900, "p1": 800, "p2": 50, "p3": 40}
    p.observe(pids, [lengths[x] for x in pids])
    plan = sharding.shard(p, pids, 2)
    sent_order = [i for eng in plan.assignment for i in eng]
    assert sorted(sent_order) == list(range(16))
    assert [sent_order[r] for r in plan.restore] == list(range(16))
    stats = sharding.placement_stats(plan, [lengths[x] for x in pids])
    assert stats["contiguous_predicted_imbalance"] == pytest.approx(1700 * 4 / ((1790 * 4) / 2))
    assert stats["predicted_imbalance"] == pytest.approx(1.0)
    assert stats["actual_imbalance"] == pytest.approx(1.0)
    assert sharding.budgets_to_send(p, plan) == (None, None)  # uniform budgets: no per-row keys
    assert sharding.shard(p, pids[:1], 2) is None  # fewer requests than engines: NeMo-RL's own sharding


def test_a_budget_policy_sends_budgets_with_their_predictions():
    spec = SpecDecConfig(enabled=True, drafter="suffix", num_speculative_tokens=8,
                         suffix={"backend": "das"}, scheduling={"budget": "length_aware"})
    p = sharding.planner_for(spec, max_new_tokens=1000)
    pids = [f"p{i}" for i in range(8)]
    p.observe(pids, [100 * (i + 1) for i in range(8)])
    plan = sharding.shard(p, pids, 2)  # contiguous placement, but budgets: the batch is planned
    budgets, hints = sharding.budgets_to_send(p, plan)
    assert plan.assignment == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert all(b is not None and 0 <= b <= 8 for b in budgets) and hints == plan.predicted


def test_planner_for_refuses_unknown_policies():
    with pytest.raises(ValueError, match=r"placement='fastest': expected one of"):
        sharding.planner_for(None, placement="fastest")
    with pytest.raises(TypeError, match="unknown policy 'k'"):
        sharding.planner_for(None, k=3)
