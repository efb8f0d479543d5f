"""The hybrid drafter's per-step choice between its history half and its model half.

Of two options for a step, the one with more expected committed tokens per second:

- history drafts only, no model forward: each request's history draft, cut by
  `step_judge.draft_lengths`;
- run the model half's draft forward(s) (`model_forward_s` more), each request taking the better
  (more expected accepted tokens) of its two drafts, cut the same way.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nemo_rl_specdec.drafters.machinery.step_judge import draft_lengths, gain_matrix

HISTORY, MODEL, NONE = "history", "model", "none"


@dataclass(frozen=True)
class HybridChoice:
    source: list[str]      # per request: "history", "model" or "none"
    lengths: list[int]     # per request: draft tokens to verify (a prefix of the chosen half's draft)
    run_model: bool        # whether this step runs the model half's draft forward(s)


def _rate(rows, t0: float, c_tok: float, extra_s: float, n: int) -> tuple[float, list[int]]:
    lengths = draft_lengths(rows, t0 + extra_s, c_tok, n) if len(rows) else []
    a, _ = gain_matrix(rows) if len(rows) else (np.zeros((0, 0)), 0)
    committed = n + sum(float(a[i, :d].sum()) for i, d in enumerate(lengths))
    return committed / (t0 + extra_s + c_tok * sum(lengths)), lengths


def choose(history_gains, model_gains, t0: float, c_tok: float, model_forward_s: float,
           requests: int | None = None) -> HybridChoice:
    """history_gains[i]: calibrated acceptance of each token of request i's history draft (a possibly
    empty row); model_gains[i]: the model half's acceptance by draft position for request i; t0,
    c_tok: the step's cost without drafts and per verified draft token; model_forward_s: the cost
    of the model half's draft forward(s) for this step's batch. Returns the better of the two
    options of the module doc."""
    n = len(history_gains) if requests is None else int(requests)
    if len(model_gains) != len(history_gains):
        raise ValueError(f"model_gains: {len(model_gains)} rows for {len(history_gains)} requests")
    hist = [np.asarray(g, dtype=float).ravel() for g in history_gains]
    model = [np.asarray(g, dtype=float).ravel() for g in model_gains]
    h_rate, h_len = _rate(hist, t0, c_tok, 0.0, n)
    h_ok = [gain_matrix([g])[0].sum() if g.size else 0.0 for g in hist]
    m_ok = [gain_matrix([g])[0].sum() if g.size else 0.0 for g in model]
    pick = [HISTORY if h > m else MODEL for h, m in zip(h_ok, m_ok, strict=True)]
    rows = [h if p == HISTORY else m for p, h, m in zip(pick, hist, model, strict=True)]
    m_rate, m_len = _rate(rows, t0, c_tok, max(0.0, float(model_forward_s)), n)
    if m_rate > h_rate and any(p == MODEL and d for p, d in zip(pick, m_len, strict=True)):
        return HybridChoice([p if d else NONE for p, d in zip(pick, m_len, strict=True)], m_len, True)
    return HybridChoice([HISTORY if d else NONE for d in h_len], h_len, False)


__all__ = ["HISTORY", "MODEL", "NONE", "HybridChoice", "choose"]
