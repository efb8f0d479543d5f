"""Per-step draft lengths for list drafters: `scheduling.budget: adaptive`.

At every engine step the drafter has a draft for each request (up to its cap) and, for every
draft token j of request i, a calibrated probability g_ij that the target accepts it. The step
commits, in expectation, 1 + g_i1 + ... + g_id tokens of request i when it verifies d of its
drafts, and costs

    t = t0 + c_tok * (draft tokens verified)

with t0 the step's time without drafts and c_tok the cost of one more verified token, both from
the engine's online step-cost fit (`scheduling/step_cost.py`). `draft_lengths` chooses the d_i
that maximise weighted committed tokens per second of the step:

    max  sum_i w_i (1 + sum_{j <= d_i} g_ij)  /  (t0 + c_tok * sum_i d_i)

A token can only be accepted if the one before it was, so g_ij cannot rise with j; a curve that
does (calibration noise) is cut to its running minimum. Every draft token costs the same, so the
best set of m tokens is the m most valuable ones, and (with non-increasing g_ij) it is a prefix
of every request's draft; the ratio rises while the next token's value per second beats the
ratio so far, then falls. The greedy below therefore stops at the optimum (a brute-force test
checks it). When no token pays for itself the step drafts nothing: speculation is off for that
step, whatever k is.

Weights (`makespan_weights`) tie the choice to the rollout's long tail: request i's tokens
count w_i = R_i / R_max, R_i its predicted remaining tokens and R_max the largest on the
engine. The request that sets the makespan counts fully; one that will finish long before
counts little and drafts only where drafting is nearly free. A request past its predicted
length is promoted (w = 1): the prediction was wrong and it is now the tail. Without
predictions every weight is 1 and the rule maximises committed tokens per second.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np


def draft_lengths(gains: Sequence[Sequence[float]], weights: Sequence[float], t0: float, c_tok: float) -> list[int]:
    """Draft tokens to verify per request (a prefix of each request's draft; see module doc).
    gains[i][j]: probability that request i's draft token j + 1 is accepted; weights[i] >= 0;
    t0 > 0 seconds; c_tok >= 0 seconds per verified draft token."""
    if not t0 > 0 or not c_tok >= 0:
        raise ValueError(f"step cost: need t0 > 0 and c_tok >= 0, got t0={t0!r}, c_tok={c_tok!r}")
    n = len(gains)
    if len(weights) != n:
        raise ValueError(f"{len(weights)} weights for {n} requests")
    value, rows, pos = [], [], []
    for i, (g, w) in enumerate(zip(gains, weights)):
        if not len(g) or w <= 0:
            continue
        v = np.minimum.accumulate(np.clip(np.asarray(g, dtype=float), 0.0, 1.0)) * float(w)
        value.append(v)
        rows.append(np.full(len(v), i))
        pos.append(np.arange(len(v)))
    out = [0] * n
    if not value:
        return out
    v, r, p = np.concatenate(value), np.concatenate(rows), np.concatenate(pos)
    order = np.lexsort((r, p, -v))  # most valuable first; ties: earlier position, then earlier request
    committed, seconds = float(np.sum(np.maximum(weights, 0.0))), float(t0)
    for idx in order:
        if v[idx] <= 0 or v[idx] * seconds <= c_tok * committed:  # v / c_tok <= committed / seconds
            break
        committed += float(v[idx])
        seconds += c_tok
        out[int(r[idx])] += 1
    return out


def makespan_weights(generated: Sequence[int], predicted: Sequence[Optional[float]]) -> list[float]:
    """w_i = R_i / R_max over the requests with a prediction (R_i = predicted - generated, at
    least 1); 1 for a request without a prediction or past its predicted length (promoted)."""
    rem = [None if p is None else float(p) - float(g) for g, p in zip(generated, predicted)]
    top = max((x for x in rem if x is not None and x > 0), default=None)
    if top is None:
        return [1.0] * len(rem)
    return [1.0 if x is None or x <= 0 else max(1.0, x) / max(1.0, top) for x in rem]


__all__ = ["draft_lengths", "makespan_weights"]
