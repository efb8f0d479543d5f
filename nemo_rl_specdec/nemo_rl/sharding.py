"""Length-aware placement of a NeMo-RL generation batch onto the data-parallel vLLM engines.

NeMo-RL cuts a batch into contiguous shards, so one engine can collect the longest GRPO
groups and the whole step waits for it. `Planner` predicts each request's length from the
lengths its problem produced before (`scheduling.predictor.LengthPredictor`, keyed by a hash
of the prompt tokens), assigns requests with `scheduling.placement.place`, gives each request
its draft budget over its engine's share (`scheduling.budget.engine_budgets`), and gives the
permutation that puts the combined results back in input order. Pure; no NeMo-RL.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from nemo_rl_specdec.nemo_rl.metrics import imbalance


@dataclass
class Plan:
    assignment: list[list[int]]   # per engine: request indices, in the order they are sent
    restore: list[int]            # row of the combined (engine-ordered) output for request i
    stats: dict = field(default_factory=dict)
    budgets: Optional[list] = None    # per request (input order): max draft tokens, None = k
    predicted: Optional[list] = None  # per request: predicted output tokens (None where no budget)

    @property
    def sent_order(self) -> list[int]:
        return [i for eng in self.assignment for i in eng]

    def actual_stats(self, generation_lengths: Sequence[float]) -> dict:
        """Imbalance of the generated tokens per engine (input-order lengths)."""
        loads = [sum(float(generation_lengths[i]) for i in eng) for eng in self.assignment]
        return {"actual_imbalance": imbalance(loads)}


def restore_permutation(assignment: list[list[int]]) -> list[int]:
    """For each request index, its row in the engine-ordered concatenation of the results."""
    from nemo_rl_specdec.scheduling.placement import restore_order

    rows, pos = [], 0
    for eng in assignment:
        rows.append(list(range(pos, pos + len(eng))))
        pos += len(eng)
    return restore_order(rows, assignment)


class Planner:
    """Per-batch placement for `VllmGeneration.generate` plus per-request picks for `generate_async`."""

    def __init__(self, policy: str, max_new_tokens: Optional[int] = None, budget: str = "uniform",
                 spec: Optional[object] = None):
        from nemo_rl_specdec.scheduling.predictor import LengthPredictor

        self.policy = policy
        self.budget = budget
        self.spec = spec
        self.acceptance: Optional[float] = None  # last measured per-token acceptance (das budgets)
        # A positive prior: with nothing observed yet every request predicts the same length, so
        # placement balances request counts (all-zero predictions would all tie on engine 0).
        prior = float(max_new_tokens) / 2 if max_new_tokens else 1.0
        self.predictor = LengthPredictor(prior=prior, max_len=max_new_tokens)
        self.outstanding: list[float] = []

    @property
    def active(self) -> bool:
        return self.policy != "contiguous"

    def plan(self, problem_ids: Sequence[str], num_engines: int) -> Optional[Plan]:
        """None means: keep NeMo-RL's contiguous sharding (contiguous placement with uniform budgets,
        or fewer requests than engines)."""
        from nemo_rl_specdec.scheduling.placement import Request, engine_loads, place

        n = len(problem_ids)
        if (not self.active and self.budget == "uniform") or n < max(1, num_engines):
            return None
        reqs = [Request(i, pid, float(self.predictor.predict(pid))) for i, pid in enumerate(problem_ids)]
        assignment = place(reqs, num_engines, self.policy)
        if any(not eng for eng in assignment):
            return None
        contiguous = place(reqs, num_engines, "contiguous")
        stats = {
            "predicted_imbalance": imbalance(engine_loads(reqs, assignment)),
            "contiguous_predicted_imbalance": imbalance(engine_loads(reqs, contiguous)),
        }
        plan = Plan(assignment, restore_permutation(assignment), stats)
        if self.budget != "uniform" and self.spec is not None:
            from nemo_rl_specdec.scheduling.budget import engine_budgets

            preds = [r.predicted_len for r in reqs]
            sc = self.spec.scheduling
            plan.budgets = engine_budgets(preds, assignment, self.spec.num_speculative_tokens, self.budget,
                                          long_fraction=sc.long_fraction, short_fraction=sc.short_fraction,
                                          acceptance=self.acceptance or 0.7)
            plan.predicted = [p if b is not None else None for p, b in zip(preds, plan.budgets)]
        return plan

    def observe(self, problem_ids: Sequence[str], generation_lengths: Sequence[float]) -> None:
        self.predictor.observe_many(zip(problem_ids, (float(x) for x in generation_lengths)))

    # -- per request (async engines): least outstanding predicted tokens first

    def pick(self, problem_id: str, num_engines: int) -> tuple[int, float]:
        if len(self.outstanding) != num_engines:
            self.outstanding = [0.0] * num_engines
        # at least 1: with no history yet (predictions 0) this degrades to least-outstanding-requests
        predicted = max(1.0, float(self.predictor.predict(problem_id)))
        engine = min(range(num_engines), key=lambda j: (self.outstanding[j], j))
        self.outstanding[engine] += predicted
        return engine, predicted

    def release(self, engine: int, predicted: float) -> None:
        if 0 <= engine < len(self.outstanding):
            self.outstanding[engine] = max(0.0, self.outstanding[engine] - predicted)
