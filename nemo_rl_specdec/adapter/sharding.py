"""Length-aware sharding of a NeMo-RL generation batch onto the data-parallel vLLM engines.

NeMo-RL cuts a batch into contiguous shards, so one engine can collect the longest GRPO
groups and the whole step waits for it. The plan (predict → place → budget, and the
least-loaded pick for the async engine) is `scheduling.planner.Planner`, the same one the CPU
engine group uses; this module owns NeMo-RL's side of it: the planner a run's block gets
(`planner_for`), when NeMo-RL's own contiguous sharding is kept (`shard` returns None), and the
placement statistics logged each step (`placement_stats`). Pure; no NeMo-RL.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nemo_rl_specdec.adapter.metrics import imbalance
from nemo_rl_specdec.scheduling.budget import set_at_submission
from nemo_rl_specdec.scheduling.placement import Request, place
from nemo_rl_specdec.scheduling.planner import Plan, Planner, check_policies
from nemo_rl_specdec.scheduling.predictor import LengthPredictor


def planner_for(spec: Any | None, max_new_tokens: int | None = None, **policies: str) -> Planner:
    """The planner for a run's speculative block (None: speculation off, contiguous and uniform);
    `policies` (placement=, budget=) override the block's `scheduling` keys."""
    # A positive prior: with nothing observed yet every request predicts the same length, so
    # placement balances request counts (all-zero predictions would all tie on engine 0).
    prior = float(max_new_tokens) / 2 if max_new_tokens else 1.0
    predictor = LengthPredictor(prior=prior, max_len=max_new_tokens)
    planner = Planner.for_spec(spec, predictor) if spec is not None else Planner(predictor)
    for key, value in policies.items():
        if key not in ("placement", "budget"):
            raise TypeError(f"planner_for: unknown policy {key!r}; allowed: placement, budget")
        setattr(planner, key, value)
    check_policies(planner.placement, planner.budget)
    return planner


def reshards(planner: Planner) -> bool:
    """Whether NeMo-RL's contiguous sharding is replaced (per batch, or per request when async)."""
    return planner.placement != "contiguous"


def shard(planner: Planner, problem_ids: Sequence[str], num_engines: int) -> Plan | None:
    """The plan for one batch, or None to keep NeMo-RL's contiguous sharding (contiguous placement
    with uniform budgets, fewer requests than engines, or a placement that leaves an engine idle)."""
    n = len(problem_ids)
    if (not reshards(planner) and not set_at_submission(planner.budget)) or n < max(1, num_engines):
        return None
    plan = planner.plan(problem_ids, num_engines)
    return None if any(not eng for eng in plan.assignment) else plan


def budgets_to_send(planner: Planner, plan: Plan) -> tuple[list | None, list | None]:
    """(budget, predicted length) per row for the workers, or (None, None) where budgets are not set
    at submission (uniform, adaptive)."""
    return (plan.budgets, plan.hints) if set_at_submission(planner.budget) else (None, None)


def placement_stats(plan: Plan, generation_lengths: Sequence[float]) -> dict:
    """Imbalance (max / mean per-engine load) of the plan's predicted tokens, of NeMo-RL's contiguous
    shards' predicted tokens, and of the tokens actually generated (input-order lengths)."""
    ordered = [Request(i, i, p) for i, p in enumerate(plan.predicted)]
    contiguous = place(ordered, len(plan.assignment), "contiguous")
    return {
        "predicted_imbalance": imbalance(plan.loads()),
        "contiguous_predicted_imbalance": imbalance([sum(plan.predicted[i] for i in eng) for eng in contiguous]),
        "actual_imbalance": imbalance(plan.loads(generation_lengths)),
    }
