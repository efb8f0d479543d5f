"""Fit the target step-cost model t = c_base + c_tok * n_tokens to measured steps.

Samples are (tokens processed in one engine step, seconds that step took): from vLLM step
timings, or derived from a throughput run — a batch of B requests decoding without
speculation processes B tokens per step and takes B / (tokens per second) seconds; with k
drafts per request it verifies B * (k + 1) tokens and takes B * (mean accepted length) /
(tokens per second). `fit_cost_model` is an ordinary least-squares line constrained to
non-negative coefficients (a negative fixed or per-token cost is not physical: when the
unconstrained fit goes negative, that coefficient is pinned at 0 and the other refitted).
Scenarios fit with `pin=False`: a pinned coefficient is an error there, since a cost model
whose step time does not grow with tokens (or has no fixed part) is silently wrong about
speculation.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def _check(samples: Sequence[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
    try:
        arr = np.asarray([(float(n), float(t)) for n, t in samples], dtype=float)
    except (TypeError, ValueError):
        raise ValueError("samples must be a list of (n_tokens_in_step, seconds) pairs") from None
    if len(arr) < 2:
        raise ValueError(f"need at least 2 samples to fit c_base and c_tok, got {len(arr)}")
    n, t = arr[:, 0], arr[:, 1]
    if not np.all(np.isfinite(arr)) or np.any(n < 0) or np.any(t <= 0):
        raise ValueError("samples need n_tokens >= 0 and seconds > 0 (finite)")
    if np.ptp(n) == 0:
        raise ValueError("all samples have the same n_tokens: c_base and c_tok cannot be separated")
    return n, t


def fit_cost_model(samples: Sequence[Sequence[float]], pin: bool = True) -> tuple[float, float]:
    """(c_base, c_tok) in seconds from [(n_tokens_in_step, seconds), ...] (see module doc).
    With pin=False a fit that would pin a coefficient at 0 raises ValueError."""
    n, t = _check(samples)
    X = np.stack([np.ones_like(n), n], axis=1)
    (c_base, c_tok), *_ = np.linalg.lstsq(X, t, rcond=None)
    if not pin and c_tok <= 0:
        raise ValueError(f"the fit gives c_tok_s = {c_tok:.3g} <= 0 (step time does not grow with tokens): "
                         "add samples over a wider range of tokens per step")
    if not pin and c_base <= 0:
        raise ValueError(f"the fit gives c_base_s = {c_base:.3g} <= 0: add samples with few tokens per step")
    if c_tok < 0:
        c_base, c_tok = float(t.mean()), 0.0
    elif c_base < 0:
        c_base, c_tok = 0.0, float((n @ t) / (n @ n))
    return float(c_base), float(c_tok)


def fit_quality(samples: Sequence[Sequence[float]]) -> dict[str, float]:
    """The fit plus its R^2 and largest relative residual, for reports."""
    n, t = _check(samples)
    c_base, c_tok = fit_cost_model(samples)
    pred = c_base + c_tok * n
    ss_res = float(((t - pred) ** 2).sum())
    ss_tot = float(((t - t.mean()) ** 2).sum())
    return {
        "c_base_s": c_base,
        "c_tok_s": c_tok,
        "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0,
        "max_rel_residual": float(np.max(np.abs(pred - t) / t)),
    }


def samples_from_throughput(batch: int, tokens_per_s: float, k: int = 0,
                            mean_accepted_length: float = 1.0) -> tuple[float, float]:
    """One (n_tokens_in_step, seconds) sample from a decode throughput measurement: `batch`
    requests each verifying k + 1 tokens per step and committing `mean_accepted_length`."""
    if batch < 1 or tokens_per_s <= 0 or k < 0 or not 1 <= mean_accepted_length <= k + 1:
        raise ValueError("need batch >= 1, tokens_per_s > 0, k >= 0, 1 <= mean_accepted_length <= k + 1")
    return float(batch * (k + 1)), float(batch * mean_accepted_length / tokens_per_s)
