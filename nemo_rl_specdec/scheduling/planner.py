"""Request planning for data-parallel engines: predict → place → budget, in one place.

`Planner` is what both the CPU engine group (`driver/group.py`) and the NeMo-RL adapter's
sharding (`adapter/sharding.py`, `adapter/generation.py`) plan a batch with:

1. predict each request's output length from its problem id (`LengthPredictor`: per problem id,
   an EMA of the lengths of its earlier rollouts; a request without a problem id, or an unseen
   problem, gets the cold-start prediction);
2. place the requests on engines (`scheduling/placement.py`: contiguous | round_robin |
   length_aware; a request without a problem id is its own group);
3. give each request a draft budget over its engine's share (`scheduling/budget.py`:
   uniform | length_aware | das, with the acceptance last measured and the cost model). A
   budget the caller fixed for a request is kept and is a cap: no predicted length goes with it,
   so a drafter never lifts it (`Plan.hints`).

Finished lengths go back with `observe`. For engines fed one request at a time (NeMo-RL's async
engine) `pick` sends a request to the engine with the fewest outstanding predicted tokens and
`release` takes it off when it finishes. Pure Python; no engine, no NeMo-RL.
"""
from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_rl_specdec.scheduling.budget import BUDGETS, engine_budgets
from nemo_rl_specdec.scheduling.placement import PLACEMENTS, Request, place, restore_order
from nemo_rl_specdec.scheduling.predictor import LengthPredictor

DEFAULT_ACCEPTANCE = 0.7  # per-token acceptance the das budget assumes until one is measured


@dataclass
class Plan:
    """One batch planned over engines. Lists indexed by request are in input order."""

    placement: str
    budget: str
    assignment: list[list[int]]   # per engine: request indices, in the order they are sent
    predicted: list[float]        # per request: predicted output tokens
    budgets: list[int | None]  # per request: max draft tokens; None = the drafter's k
    hints: list[float | None]  # per request: the predicted length sent with a planner-set budget

    @property
    def restore(self) -> list[int]:
        """For each request index, its row in the engine-ordered concatenation of the results."""
        rows, pos = [], 0
        for eng in self.assignment:
            rows.append(list(range(pos, pos + len(eng))))
            pos += len(eng)
        return restore_order(rows, self.assignment)

    @property
    def engine_of(self) -> list[int]:
        out = [0] * sum(len(eng) for eng in self.assignment)
        for j, idxs in enumerate(self.assignment):
            for i in idxs:
                out[i] = j
        return out

    def loads(self, lengths: Sequence[float] | None = None) -> list[float]:
        """Tokens per engine: of `lengths` (input order), else of the predictions."""
        lengths = self.predicted if lengths is None else lengths
        return [sum(float(lengths[i]) for i in eng) for eng in self.assignment]


class Planner:
    """predict → place → budget for batches on `num_engines` engines (see module doc).

    Args:
        predictor: the length predictor (its cold start and cap are the caller's choice).
        placement, budget: default policies (`placement.PLACEMENTS`, `budget.BUDGETS`).
        k: the drafter's num_speculative_tokens (what budgets are cut from).
        long_fraction, short_fraction: the length_aware budget's classes.
        cost_model: `c_base`, `c_tok`, `c_draft` for the das budget (default: budget.py's).
    `acceptance` (per-token rate, or per-position curve) is what the das budget assumes; None
    means DEFAULT_ACCEPTANCE. Callers set it from what they measured.
    """

    def __init__(self, predictor: LengthPredictor, *, placement: str = "contiguous", budget: str = "uniform",
                 k: int = 0, long_fraction: float = 0.25, short_fraction: float = 0.25,
                 cost_model: dict | None = None):
        check_policies(placement, budget)
        self.predictor = predictor
        self.placement, self.budget, self.k = placement, budget, int(k)
        self.long_fraction, self.short_fraction = long_fraction, short_fraction
        self.cost_model = dict(cost_model or {})
        self.acceptance: Any = None
        self.outstanding: list[float] = []

    @classmethod
    def for_spec(cls, spec: Any, predictor: LengthPredictor, cost_model: dict | None = None) -> Planner:
        """A planner with the policies of a speculative block (`SpecDecConfig`; its `scheduling` keys)."""
        sc = spec.scheduling
        return cls(predictor, placement=sc.placement, budget=sc.budget, k=spec.num_speculative_tokens,
                   long_fraction=sc.long_fraction, short_fraction=sc.short_fraction, cost_model=cost_model)

    # -- one batch

    def predict(self, problem_ids: Sequence[Hashable | None]) -> list[float]:
        """Predicted output tokens per request (the cold-start prediction where the id is None)."""
        p = self.predictor
        return [p.predict_remaining(pid, 0) if pid is not None else p.cold_prediction() for pid in problem_ids]

    def plan(self, problem_ids: Sequence[Hashable | None], num_engines: int, *, placement: str | None = None,
             budget: str | None = None, fixed: Sequence[int | None] | None = None) -> Plan:
        """Plan one batch. `placement` / `budget` override the defaults; `fixed[i]` is a budget the
        caller chose for request i (kept, never lifted)."""
        placement = placement or self.placement
        budget = budget or self.budget
        check_policies(placement, budget)
        preds = self.predict(problem_ids)
        keyed = [Request(i, pid if pid is not None else ("__request__", i), preds[i])
                 for i, pid in enumerate(problem_ids)]
        assignment = place(keyed, num_engines, placement)
        fixed = list(fixed) if fixed is not None else [None] * len(preds)
        budgets = engine_budgets(preds, assignment, self.k, budget, fixed=fixed, long_fraction=self.long_fraction,
                                 short_fraction=self.short_fraction,
                                 acceptance=self.acceptance or DEFAULT_ACCEPTANCE, **self.cost_model)
        hints = [preds[i] if b is not None and fixed[i] is None else None for i, b in enumerate(budgets)]
        return Plan(placement, budget, assignment, preds, budgets, hints)

    def state_dict(self) -> dict:
        """What NeMo-RL's checkpoint carries of the driver's planner: the lengths each problem produced
        (the predictor) and the acceptance last measured, which the budgets are made from."""
        acc = self.acceptance
        return {"predictor": self.predictor.to_dict(),
                "acceptance": None if acc is None else (float(acc) if isinstance(acc, (int, float)) else list(acc))}

    def load_state_dict(self, state: dict) -> None:
        self.predictor = LengthPredictor.from_dict(state["predictor"])
        self.acceptance = state["acceptance"]

    def observe(self, problem_ids: Sequence[Hashable], lengths: Sequence[float]) -> None:
        """Record finished rollouts' lengths per problem id (the next plans' predictions)."""
        self.predictor.observe_many(zip(problem_ids, (float(x) for x in lengths), strict=True))

    # -- one request at a time: least outstanding predicted tokens first

    def pick(self, problem_id: Hashable, num_engines: int) -> tuple[int, float]:
        """The engine for one request, and the predicted tokens booked on it (give back with `release`)."""
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


def check_policies(placement: str, budget: str) -> None:
    """Raise ValueError naming the value and the allowed ones for an unknown placement or budget policy."""
    for what, value, allowed in (("placement", placement, PLACEMENTS), ("budget", budget, BUDGETS)):
        if value not in allowed:
            raise ValueError(f"{what}={value!r}: expected one of {list(allowed)}")
