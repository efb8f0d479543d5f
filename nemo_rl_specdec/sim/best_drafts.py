"""Adaptive verification: each step verifies the number of drafts that maximises expected
committed tokens per second of that step.

`best_drafts` owns the rule; the engine simulator applies it with
`speculation.scheduling.k: per_step`. At each step it evaluates d = 0..k under
`CostModel.step_cost`, with the requests in flight, their current contexts and their own
acceptance curves:

    d* = argmax_d  sum_i (1 + coverage * (A_i(d) - 1)) / t_step(d for every request)

Ties go to the smaller d, and d* = 0 turns speculation off for that step.

`scheduling.k: auto` is vLLM's static `num_speculative_tokens_per_batch_size` table. It
makes the same choice once per batch size, at a typical context. `per_step` re-evaluates at
every simulated event, at the contexts the requests have reached. Neither can verify a
different prefix per request chosen by the drafter's confidence (DSpark's adaptive mode):
that needs per-request, per-step acceptance, which the simulator does not have
(docs/simulator.md, C5).
"""
from __future__ import annotations

import numpy as np

from nemo_rl_specdec.cost.model import CostModel


def best_drafts(cost: CostModel, ctx: np.ndarray, A: np.ndarray, k: int, coverage: float = 1.0) -> int:
    """Drafts per request (0..k) for a decode step of these requests. ctx: each request's
    context; A: one row per request, A[i, d] = expected tokens committed per step with d drafts
    (d = 0..k at least). Prefill tokens in the step are left out: they would dilute the
    marginal cost of a draft."""
    n = len(ctx)
    if n == 0 or k <= 0:
        return 0
    zeros = np.zeros(n)
    best, best_rate = 0, -1.0
    for d in range(k + 1):
        t = cost.step_cost(np.full(n, coverage * d), ctx, zeros).at(0)
        committed = float(np.sum(1.0 + coverage * (A[:, d] - 1.0)))
        rate = committed / t
        if rate > best_rate * (1 + 1e-12):
            best, best_rate = d, rate
    return best


__all__ = ["best_drafts"]
