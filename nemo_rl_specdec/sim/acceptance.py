"""Acceptance curves for the simulator: how many drafted tokens a step commits, by draft depth.

A curve is the *unconditional* acceptance of draft positions 1, 2, ... (the share of drafts
whose j-th token was accepted), as `scheduling.budget.acceptance_curve` takes it. It is built
from one of the scenario's forms:

- `alpha` (+ `decay`): the j-th position is accepted, given the (j-1)-th was, with probability
  c_j = alpha * decay**(j-1); decay = 1 is the geometric shorthand alpha**j;
- `conditional`: c_1, c_2, ... given directly; the curve is their running product;
- `per_position`: the unconditional curve itself (measured);
- `mean_accepted_length` at `measured_at_k` (+ `decay`): alpha solved so that
  1 + a_1 + ... + a_k equals the measured figure;
- a bench JSON (`nemo-rl-specdec bench ... --json`): a result's `accepted_per_position`.

`acceptance.spread` gives each request its own alpha, drawn from a Beta distribution whose
mean is chosen so that the mean accepted length (at the measured k) is the scenario's: a
spread widens the distribution without moving its mean.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy import optimize, stats

from nemo_rl_specdec.scheduling.budget import expected_accepted

MAX_DEPTH = 64          # speculation.num_speculative_tokens is at most 64: curves are built this long
_QUANTILES = (np.arange(256) + 0.5) / 256


def decayed_curve(alpha: float, decay: float, depth: int = MAX_DEPTH) -> np.ndarray:
    """Unconditional acceptance of positions 1..depth with conditionals alpha * decay**(j-1)."""
    cond = np.clip(alpha * decay ** np.arange(depth, dtype=float), 0.0, 1.0)
    return np.cumprod(cond)


def from_conditional(conditional: Sequence[float]) -> list[float]:
    return [float(x) for x in np.cumprod(np.asarray(conditional, dtype=float))]


def mean_length(curve: np.ndarray, k: int) -> float:
    return 1.0 + float(np.sum(curve[:k]))


def solve_alpha(mean_accepted_length: float, k: int, decay: float = 1.0) -> float:
    """alpha whose curve (conditionals alpha * decay**(j-1)) commits `mean_accepted_length`
    tokens per step at k drafts."""
    if not 1 <= mean_accepted_length <= k + 1:
        raise ValueError(f"mean accepted length {mean_accepted_length} must be in [1, k+1={k + 1}]")
    if decay == 1.0:
        f = lambda a: float(expected_accepted(a, k)[k]) - mean_accepted_length  # noqa: E731
    else:
        f = lambda a: mean_length(decayed_curve(a, decay, k), k) - mean_accepted_length  # noqa: E731
    if f(1.0) < 0:
        raise ValueError(f"mean accepted length {mean_accepted_length} is out of reach at k={k} with decay={decay}")
    if f(0.0) >= 0:
        return 0.0
    return float(optimize.brentq(f, 0.0, 1.0, xtol=1e-13))


def curve_from_bench(path: str, result: str | None = None) -> list[float]:
    """`accepted_per_position` of a bench JSON result (by name; default the only result that
    has one), clipped to [0, 1] and made non-increasing (measured noise can break that by a
    hair: position j needs position j-1 accepted)."""
    data = json.loads(Path(path).read_text())
    rows = [r for r in data.get("results", []) if r.get("accepted_per_position")]
    if result is not None:
        rows = [r for r in rows if r.get("name") == result]
    if len(rows) != 1:
        names = [r.get("name") for r in data.get("results", []) if r.get("accepted_per_position")]
        raise ValueError(f"{path}: need exactly one result with accepted_per_position"
                         f"{'' if result is None else f' named {result!r}'}; results with one: {names}")
    return monotone_curve(rows[0]["accepted_per_position"])


def monotone_curve(values: Sequence[float]) -> list[float]:
    out = np.minimum.accumulate(np.clip(np.asarray(values, dtype=float), 0.0, 1.0))
    return [round(float(x), 6) for x in out]


def _beta(mean: float, std: float):
    var = std * std
    common = mean * (1 - mean) / var - 1
    return stats.beta(mean * common, (1 - mean) * common)


def spread_mean(alpha: float, decay: float, spread: float, k: int) -> float:
    """The Beta mean m whose per-request alphas (std `spread`) commit, on average over
    requests, as many tokens per step at k drafts as `alpha` does. Raises ValueError when no
    Beta distribution with that std keeps the mean accepted length."""
    target = mean_length(decayed_curve(alpha, decay, k), k)

    def f(m: float) -> float:
        if spread * spread >= m * (1 - m):
            return np.nan
        alphas = _beta(m, spread).ppf(_QUANTILES)
        return float(np.mean([mean_length(decayed_curve(a, decay, k), k) for a in alphas])) - target

    lo = 0.5 - np.sqrt(max(0.0, 0.25 - spread * spread)) + 1e-9
    hi = 1.0 - lo
    if not lo < hi or not (f(lo) <= 0 <= f(hi)):
        raise ValueError(f"a spread of {spread} around alpha={alpha:.3f} cannot keep the mean accepted length "
                         f"{target:.3f} (a Beta distribution on [0, 1] needs std**2 < mean * (1 - mean))")
    return float(optimize.brentq(f, lo, hi, xtol=1e-10))


def per_request_alphas(mean: float, spread: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """n alphas from Beta(mean, std=spread), stratified so their sample mean stays close to the
    distribution's."""
    u = (rng.permutation(n) + rng.uniform(size=n)) / n
    return _beta(mean, spread).ppf(u)


def tables(alphas, decay: float, k: int) -> np.ndarray:
    """A(d) for d = 0..k: one row per alpha of `alphas`, each with conditionals alpha * decay**(j-1)."""
    return np.stack([np.concatenate([[1.0], 1.0 + np.cumsum(decayed_curve(a, decay, k))])
                     for a in np.atleast_1d(alphas)])
