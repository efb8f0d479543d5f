"""The hybrid drafter's per-step rule: history drafts only, or the model half's draft forward too.

At every engine step each request may have a history draft (DAS: its tokens' calibrated
acceptance g^h_ij) and, if the model half runs its draft forward(s) this step, a model draft
(its acceptance by draft position g^m_ij). Gains mean what they mean in `step_judge`: the
probability that draft token j is accepted, so a row cannot rise (it is cut to its running
minimum). The step costs

    t = t0 + c_tok * (draft tokens verified) [+ F when the model forward runs]

with F = `model_forward_s`, the priced cost of the model half's draft forward(s) for the batch.
`choose` returns the better of two options, by expected committed tokens per second of the step:

- **history only**: no model forward; the history drafts cut by `step_judge.draft_lengths`;
- **model forward**: every request takes one of its two drafts, the prefixes cut jointly.

The second option is a choice over 2^n assignments of rows to requests, each with its optimal
prefixes. It is solved exactly by Dinkelbach's method: for a rate lambda, the step's
`committed - lambda * seconds` separates over requests, and request i's best contribution is
max over its two rows of sum_j max(g_ij - lambda * c_tok, 0) (a prefix, the rows being
non-increasing). Starting from lambda = the rate with no drafts, each round takes every
request's best row at lambda, sets lambda to the rate of those rows with their optimal
prefixes (`draft_lengths`, F added to t0), and stops when lambda no longer rises; lambda rises
strictly in every other round, and the assignments are finite, so it stops, at the optimum
over all assignments and prefixes (a brute-force test checks it). "The better of its two
drafts" is therefore the row whose optimal prefix adds more to the step's
`committed - rate * seconds` at the step's optimal rate, not the longer or likelier draft.

Ties go to history (no model forward; per request, the history row), which costs no draft
forward. A request whose chosen prefix is empty is `none`: it verifies nothing this step.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nemo_rl_specdec.drafters.machinery.step_judge import draft_lengths, gain_matrix

SOURCES = ("history", "model", "none")


@dataclass(frozen=True)
class HybridChoice:
    source: list[str]      # per request: "history", "model" or "none"
    lengths: list[int]     # per request: draft tokens to verify (a prefix of the chosen half's draft)
    run_model: bool        # whether this step runs the model half's draft forward(s)


def _rate(rows: np.ndarray, lengths: Sequence[int], n: int, seconds: float, c_tok: float) -> float:
    taken = sum(float(rows[i, :d].sum()) for i, d in enumerate(lengths))
    return (n + taken) / (seconds + c_tok * sum(lengths))


def _rows(gains: np.ndarray | Sequence[Sequence[float] | np.ndarray], n: int, name: str) -> list:
    if len(gains) != n:
        raise ValueError(f"{name}: one row per request, {n} requests, got {len(gains)} rows")
    a, _ = gain_matrix(gains)
    return [a[i][a[i] > 0] if a.size else np.zeros(0) for i in range(n)]  # the running minimum: zeros only trail


def choose(history_gains: np.ndarray | Sequence[Sequence[float] | np.ndarray],
           model_gains: np.ndarray | Sequence[Sequence[float] | np.ndarray],
           t0: float, c_tok: float, model_forward_s: float,
           requests: int | None = None) -> HybridChoice:
    """history_gains[i]: calibrated acceptance probability of each token of request i's history draft
    (a possibly empty row); model_gains[i]: the model half's acceptance probability by draft position
    for request i (length k); t0, c_tok: the step's cost without drafts and per verified draft token
    (as in step_judge.draft_lengths); model_forward_s: the priced cost of the model half's draft
    forward(s) for this step's batch. Returns, of the two options 'history drafts only, no model
    forward' and 'run the model forward, each request takes the better of its two drafts', the one
    with more expected committed tokens per second, drafts cut as step_judge.draft_lengths cuts them.
    Rows may be ragged sequences or NaN-padded 2-D arrays; `requests` (default: the rows) counts
    the step's requests, those without rows committing one token each (module doc)."""
    n_rows = len(history_gains)
    if not model_forward_s >= 0:
        raise ValueError(f"model_forward_s: need >= 0 seconds, got {model_forward_s!r}")
    if len(model_gains) == n_rows and not any(len(r) for r in model_gains):   # no model draft: history's cut alone
        lengths = draft_lengths(history_gains, t0, c_tok, requests)
        return HybridChoice(source=["history" if d else "none" for d in lengths], lengths=[int(d) for d in lengths],
                            run_model=False)
    hist = _rows(history_gains, n_rows, "history_gains")
    model = _rows(model_gains, n_rows, "model_gains")
    h_len = draft_lengths(hist, t0, c_tok, requests)  # checks t0, c_tok and requests
    n = n_rows if requests is None else int(requests)
    width = max([len(r) for r in hist + model], default=0)

    def matrix(rows: Sequence[np.ndarray]) -> np.ndarray:
        m = np.zeros((n_rows, width))
        for i, r in enumerate(rows):
            m[i, :len(r)] = r
        return m

    h, m = matrix(hist), matrix(model)
    best_source, best_len = ["history"] * n_rows, h_len
    run = False
    if any(len(r) for r in model):
        seconds = t0 + model_forward_s
        lam = n / seconds  # the rate of the model forward with no draft verified
        m_len, m_pick = [0] * n_rows, np.zeros(n_rows, dtype=bool)
        while True:
            excess = lam * c_tok  # a token pays at rate lam when its gain exceeds this
            pick = np.maximum(m - excess, 0).sum(axis=1) > np.maximum(h - excess, 0).sum(axis=1)
            rows = np.where(pick[:, None], m, h)
            lengths = draft_lengths(rows, seconds, c_tok, n)
            rate = _rate(rows, lengths, n, seconds, c_tok)
            if not rate > lam * (1 + 1e-12):
                break
            lam, m_len, m_pick = rate, lengths, pick
        if lam > _rate(h, h_len, n, t0, c_tok):
            best_len, run = m_len, True
            best_source = ["model" if p else "history" for p in m_pick]
    source = [s if d else "none" for s, d in zip(best_source, best_len, strict=True)]
    return HybridChoice(source=source, lengths=[int(d) for d in best_len], run_model=run)


__all__ = ["SOURCES", "HybridChoice", "choose"]
