"""Time of one engine step, target verification plus drafting.

Target forward (the DAS cost model, plus KV reads):

    t_target = c_base + c_tok * (verified tokens + prefill tokens) + c_ctx * sum_i ctx_i

where request i verifies 1 + d_i tokens (its d_i drafts and the bonus position) and ctx_i is
its context length (prompt + generated so far): each step reads every request's KV cache once,
however many tokens it verifies — which is why speculation pays off most for long contexts.

Drafting, when any request drafts (d_i > 0):

    t_draft = step_overhead + fwd_base * max_i d_i + tok * sum_i d_i
              + ctx * sum_i ctx_i * d_i + per_request * #{i : d_i > 0}

Model drafters (eagle3, draft_model, mtp) run max_i d_i sequential forwards (fwd_base each;
their KV reads are `ctx`); list drafters (suffix, ngram) look drafts up on the host
(`per_request`). Contexts grow between steps; `step_cost` returns the time of the current step
and its growth per step, so n identical steps take n * t0 + slope * n * (n - 1) / 2.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CostModel:
    c_base: float
    c_tok: float
    c_ctx: float = 0.0
    draft_fwd_base: float = 0.0
    draft_tok: float = 0.0
    draft_ctx: float = 0.0
    draft_per_request: float = 0.0
    spec_step_overhead: float = 0.0

    @classmethod
    def from_scenario(cls, sc) -> "CostModel":
        hw, dr = sc.hardware, sc.drafter
        return cls(hw.c_base_s, hw.c_tok_s, hw.c_ctx_s, dr.fwd_base_s, dr.tok_s, dr.ctx_s,
                   dr.per_request_s, dr.step_overhead_s)

    def step_cost(self, drafts: np.ndarray, ctx: np.ndarray, rate: np.ndarray,
                  prefill_tokens: float = 0.0) -> tuple[float, float]:
        """(t0, slope): this step's time and how much each following identical step adds
        (contexts grow by `rate` tokens per step). drafts, ctx, rate: one entry per request."""
        n = len(drafts)
        t0 = self.c_base + self.c_tok * (n + float(drafts.sum()) + prefill_tokens) + self.c_ctx * float(ctx.sum())
        slope = self.c_ctx * float(rate.sum())
        if n and drafts.max() > 0:
            t0 += (self.spec_step_overhead + self.draft_fwd_base * float(drafts.max())
                   + self.draft_tok * float(drafts.sum()) + self.draft_ctx * float(ctx @ drafts)
                   + self.draft_per_request * float(np.count_nonzero(drafts)))
            slope += self.draft_ctx * float(rate @ drafts)
        return t0, slope

    @staticmethod
    def time_of_steps(n: int, t0: float, slope: float) -> float:
        return n * t0 + slope * n * (n - 1) / 2.0

    @staticmethod
    def steps_within(budget_s: float, t0: float, slope: float) -> int:
        """The smallest n >= 1 whose n steps take at least `budget_s` (so the n-th step is the
        first to end at or after that moment)."""
        if budget_s <= t0:
            return 1
        if slope <= 0:
            return max(1, int(np.ceil(budget_s / t0 - 1e-12)))
        # n*t0 + slope*n*(n-1)/2 >= budget  <=>  (slope/2) n^2 + (t0 - slope/2) n - budget >= 0
        a, b = slope / 2.0, t0 - slope / 2.0
        n = (-b + np.sqrt(b * b + 4 * a * budget_s)) / (2 * a)
        n = max(1, int(np.ceil(n - 1e-9)))
        while n > 1 and CostModel.time_of_steps(n - 1, t0, slope) >= budget_s:
            n -= 1
        while CostModel.time_of_steps(n, t0, slope) < budget_s:
            n += 1
        return n
