"""Per-request speculation budgets, and k by batch size.

A budget is the number of draft tokens a request may get in one step (0..k). List drafters
(suffix, ngram, custom_class) can honour a different budget per request; model drafters
(eagle3, draft_model, mtp) cannot, and use `k_by_batch_size_schedule` instead, which becomes
vLLM's `num_speculative_tokens_per_batch_size`.

Acceptance is described either by one number alpha — the probability that a draft token is
accepted given the previous one was (geometric decay: position j is accepted with
probability alpha**j) — or by a measured curve `[a_1, a_2, ...]` of *unconditional*
per-position acceptance probabilities (what vLLM's `spec_decode_num_accepted_tokens_per_pos`
divided by `spec_decode_num_drafts` gives). With d drafts the expected number of tokens a
request commits per step (accepted drafts plus the bonus token) is

    A(d) = 1 + a_1 + ... + a_d        (geometric: A(d) = (1 - alpha**(d+1)) / (1 - alpha)).

A curve shorter than k is extended with its last conditional ratio a_m / a_(m-1).

Policies (`assign_budgets`):
- `uniform`: every request gets k.
- `length_aware`: requests are classed by predicted remaining length. The longest
  `long_fraction` are "long" and get k; the shortest `short_fraction` are "short" and get 0;
  the rest are "medium" and get `medium_k` (default ceil(k/2)). Classes are cut by value, so
  equal predictions share a class: with no information (all predictions equal) everyone is
  "long", i.e. the policy falls back to `uniform`.
- `das`: the closed form derived in `das_budgets` (after DAS, "Beat the long tail:
  Distribution-Aware Speculative Decoding for RL Training").
- `adaptive`: nothing is set at submission (every request may draft up to k); the drafter cuts
  each draft at every engine step (`drafters/machinery/step_judge.py`). Only a drafter that returns
  per-request draft lengths (DAS) can do that; validation refuses it for the others.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from nemo_rl_specdec.cost.model import CostModel

BUDGETS = ("uniform", "length_aware", "das", "adaptive")
CLASSES = ("long", "medium", "short")

Acceptance = float | Sequence[float]


def set_at_submission(policy: str) -> bool:
    """Whether `policy` gives requests budgets when they are submitted (length_aware, das); under
    uniform every request may draft k, and adaptive is chosen inside the engine at every step."""
    return policy in ("length_aware", "das")


# --------------------------------------------------------------------------- acceptance

def acceptance_curve(acceptance: Acceptance, k: int) -> np.ndarray:
    """Unconditional acceptance probability of draft positions 1..k, as an array of length k."""
    if k < 0:
        raise ValueError(f"k={k!r}: expected >= 0")
    if isinstance(acceptance, (int, float, np.floating)):
        a = float(acceptance)
        if not 0 <= a <= 1:
            raise ValueError(f"acceptance alpha={a!r}: expected 0 <= alpha <= 1")
        return a ** np.arange(1, k + 1, dtype=float)
    curve = [float(x) for x in acceptance]
    if not curve:
        raise ValueError("acceptance curve is empty: give alpha or at least one per-position rate")
    for j, x in enumerate(curve):
        if not 0 <= x <= 1:
            raise ValueError(f"acceptance curve position {j + 1}: {x!r} not in [0, 1]")
        if j and x > curve[j - 1] + 1e-12:
            raise ValueError(
                f"acceptance curve position {j + 1}: {x!r} > position {j}'s {curve[j - 1]!r}; "
                "unconditional per-position acceptance can only fall (position j needs j-1 accepted)"
            )
    if len(curve) >= k:
        return np.asarray(curve[:k], dtype=float)
    ratio = curve[-1] / curve[-2] if len(curve) >= 2 and curve[-2] > 0 else (curve[-1] if len(curve) == 1 else 0.0)
    out = list(curve)
    while len(out) < k:
        out.append(out[-1] * ratio)
    return np.asarray(out, dtype=float)


def expected_accepted(acceptance: Acceptance, k: int) -> np.ndarray:
    """A(d) for d = 0..k: expected tokens committed per step with d drafts (bonus included)."""
    return np.concatenate([[1.0], 1.0 + np.cumsum(acceptance_curve(acceptance, k))])


# --------------------------------------------------------------------------- classes

def classify(predicted_remaining: Sequence[float], long_fraction: float = 0.25,
             short_fraction: float = 0.25) -> list[str]:
    """'long' / 'medium' / 'short' per request (see module doc; cut by value, ties share)."""
    if not 0 < long_fraction <= 1:
        raise ValueError(f"long_fraction={long_fraction!r}: expected 0 < x <= 1")
    if not 0 <= short_fraction < 1:
        raise ValueError(f"short_fraction={short_fraction!r}: expected 0 <= x < 1")
    if long_fraction + short_fraction > 1:
        raise ValueError("long_fraction + short_fraction must be <= 1")
    v = np.asarray(predicted_remaining, dtype=float)
    n = len(v)
    if n == 0:
        return []
    n_long = max(1, math.ceil(long_fraction * n - 1e-9))
    n_short = math.floor(short_fraction * n + 1e-9)
    desc = np.sort(v)[::-1]
    long_thr = desc[n_long - 1]
    short_thr = np.sort(v)[n_short - 1] if n_short > 0 else -np.inf
    out = []
    for x in v:
        if x >= long_thr:
            out.append("long")
        elif x <= short_thr:
            out.append("short")
        else:
            out.append("medium")
    return out


def length_aware_budgets(predicted_remaining: Sequence[float], k: int, long_fraction: float = 0.25,
                         short_fraction: float = 0.25, medium_k: int | None = None) -> list[int]:
    """long -> k, medium -> medium_k (default ceil(k/2)), short -> 0."""
    if medium_k is None:
        medium_k = math.ceil(k / 2)
    if not 0 <= medium_k <= k:
        raise ValueError(f"medium_k={medium_k!r}: expected 0 <= medium_k <= k={k}")
    per_class = {"long": k, "medium": medium_k, "short": 0}
    return [per_class[c] for c in classify(predicted_remaining, long_fraction, short_fraction)]


# --------------------------------------------------------------------------- DAS closed form

def das_budgets(predicted_remaining: Sequence[float], k: int, acceptance: Acceptance = 0.7,
                c_base: float = 1.0, c_tok: float = 1.0 / 64, c_draft: float = 0.0,
                c_req: float | Sequence[float] | np.ndarray = 0.0) -> list[int]:
    """Budgets that minimise one engine's time until its last active request finishes.

    Model. The engine's active requests i = 1..n still have R_i tokens to go (predicted).
    Request i gets d_i drafts per step and commits A(d_i) tokens per step in expectation, so it
    stays in the batch for s_i = R_i / A(d_i) steps. A step costs

        t = c_base + c_tok * (tokens verified) + c_draft * (draft tokens) + sum_i c_req_i,

    where request i contributes 1 + d_i verified tokens and d_i draft tokens while it is in
    the batch. This is the DAS cost model t_fwd = c_base + c_tok * n_tokens, plus a
    per-draft-token drafting cost and an optional per-request cost c_req_i that does not grow
    with the tokens verified (reading request i's KV cache: proportional to its context).
    The batch runs for S = max_i s_i steps, so the engine's total time is

        T = c_base * max_i R_i / A(d_i)  +  sum_i R_i * w_i(d_i),
        w_i(d) = (c_req_i + c_tok * (1 + d) + c_draft * d) / A(d).

    For a target makespan of S steps, request i must have A(d_i) >= R_i / S, and apart from
    that its cheapest choice is the feasible d with the smallest w_i:

        d_i(S) = argmin { w_i(d) : d in d_min_i(S)..k },   d_min_i(S) = min{ d : A(d) >= R_i / S }
        (geometric alpha: d_min_i(S) = ceil( log(1 - (1 - alpha) * R_i / S) / log(alpha) ) - 1).

    Without per-request costs (c_req = 0), w is non-decreasing in d (A(d) = 1 + a_1 + ... +
    a_d >= (d + 1) * a_(d+1) for a non-increasing curve), so d_i(S) = d_min_i(S): drafts pay
    only by shortening the makespan, requests that finish within S steps anyway (R_i <= S)
    get none, and the longer a request the more drafts it gets. With c_req_i > 0 (long
    contexts), drafting also saves KV reads, and a long-context request may draft even off the
    critical path. T(S) is piecewise increasing in S between the breakpoints S = R_i / A(d),
    so the optimum is at a breakpoint with S >= max_i R_i / A(k): we evaluate T at every such
    breakpoint and keep the best (ties: the larger S, i.e. fewer drafts). When c_base
    dominates the step (memory-bound decode, small batches, the long tail), S* is the
    smallest feasible makespan and the longest requests get the full k; when the per-token
    cost dominates (large compute-bound batches), S* grows and drafts go only to the requests
    that set the makespan.

    Only the ratios of the costs to c_base matter.
    """
    if k < 0:
        raise ValueError(f"k={k!r}: expected >= 0")
    if c_base <= 0 or c_tok < 0 or c_draft < 0:
        raise ValueError(f"cost model: need c_base > 0, c_tok >= 0, c_draft >= 0 (got {c_base}, {c_tok}, {c_draft})")
    R = np.asarray(predicted_remaining, dtype=float)
    n = len(R)
    if n == 0:
        return []
    if np.any(R < 0) or np.any(~np.isfinite(R)):
        raise ValueError("predicted remaining lengths must be finite and >= 0")
    creq = np.broadcast_to(np.asarray(c_req, dtype=float), (n,))
    if np.any(creq < 0):
        raise ValueError("c_req must be >= 0")
    if k == 0 or R.max() <= 0:
        return [0] * n
    A = expected_accepted(acceptance, k)
    ds = np.arange(k + 1)
    pos = R > 0
    Rp, cr = R[pos], creq[pos]
    # a request's share of a step, from the one step-cost function's linear form (cost/model.py): c_tok per
    # verified token, c_draft per draft token, and c_req_i as the form's context term (a context of c_req_i
    # at c_ctx = 1: the cost of reading request i's KV cache)
    share = CostModel(c_tok=c_tok, c_ctx=1.0, draft_tok=c_draft).request_s(ds[None, :], cr[:, None])
    w = share / A[None, :]   # (m, k+1)
    # best feasible choice when at least d drafts are required: suffix argmin of w over d' >= d
    best_from = np.empty_like(w, dtype=int)
    best_from[:, k] = k
    for d in range(k - 1, -1, -1):
        nxt = best_from[:, d + 1]
        take_d = w[:, d] <= w[np.arange(len(Rp)), nxt]   # ties: the smaller d
        best_from[:, d] = np.where(take_d, d, nxt)
    s_min = Rp.max() / A[k]
    cands = np.unique((Rp[:, None] / A[None, :]).ravel())
    cands = cands[(cands >= s_min * (1 - 1e-12)) & (cands <= Rp.max() * (1 + 1e-12))]
    rows = np.arange(len(Rp))[None, :]
    Ts, Ds = [], []
    chunk = max(1, 2_000_000 // max(1, len(Rp)))
    for lo in range(0, len(cands), chunk):
        S = cands[lo:lo + chunk]
        need = Rp[None, :] / S[:, None] * (1 - 1e-12)                  # A(d) must reach this
        dmin = np.minimum(np.searchsorted(A, need, side="left"), k)     # smallest feasible d
        d = best_from[rows, dmin]
        makespan = (Rp[None, :] / A[d]).max(axis=1)
        Ts.append(c_base * makespan + (Rp[None, :] * w[rows, d]).sum(axis=1))
        Ds.append(d)
    T = np.concatenate(Ts)
    D = np.concatenate(Ds)
    # candidates are in increasing S: among the (near-)minimal T take the last, i.e. the largest S
    best = int(np.flatnonzero(T <= T.min() * (1 + 1e-12))[-1])
    out = np.zeros(n, dtype=int)
    out[pos] = D[best]
    return [int(x) for x in out]


# --------------------------------------------------------------------------- dispatcher

def assign_budgets(predicted_remaining: Sequence[float], k: int, policy: str = "uniform", *,
                   long_fraction: float = 0.25, short_fraction: float = 0.25,
                   medium_k: int | None = None, acceptance: Acceptance = 0.7,
                   c_base: float = 1.0, c_tok: float = 1.0 / 64, c_draft: float = 0.0,
                   c_req: float | Sequence[float] | np.ndarray = 0.0) -> list[int]:
    """Draft budget per request under `policy` (one of BUDGETS). The keyword arguments after
    `medium_k` are the acceptance and cost model used by `das` (see `das_budgets`)."""
    if policy not in BUDGETS:
        raise ValueError(f"budget policy {policy!r}: expected one of {list(BUDGETS)}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
        raise ValueError(f"k={k!r}: expected an int >= 0")
    n = len(predicted_remaining)
    if policy in ("uniform", "adaptive"):  # adaptive: the drafter cuts per step
        return [int(k)] * n
    if policy == "length_aware":
        return length_aware_budgets(predicted_remaining, k, long_fraction, short_fraction, medium_k)
    return das_budgets(predicted_remaining, k, acceptance, c_base, c_tok, c_draft, c_req)


def engine_budgets(predicted_remaining: Sequence[float], assignment: Sequence[Sequence[int]], k: int,
                   policy: str = "uniform", *, fixed: Sequence[int | None] | None = None,
                   **kwargs) -> list[int | None]:
    """Budgets for a batch placed on engines: `assign_budgets` run separately over each
    engine's requests (an engine's makespan is set by its own requests; this is what a
    data-parallel worker can compute locally).

    `predicted_remaining[i]` and the result are indexed by request; `assignment[j]` lists the
    request indices on engine j. `fixed[i]`, when not None, is a budget the caller already chose
    for request i: it is kept as is and the request is left out of its engine's classing.
    Under `uniform` and `adaptive` nothing is assigned (None = the drafter's k). `kwargs` go to
    `assign_budgets`.
    """
    n = len(predicted_remaining)
    if fixed is not None and len(fixed) != n:
        raise ValueError(f"fixed: {len(fixed)} entries for {n} requests")
    out: list[int | None] = list(fixed) if fixed is not None else [None] * n
    seen = sorted(i for idxs in assignment for i in idxs)
    if seen != list(range(n)):
        raise ValueError(f"assignment must list every request index 0..{n - 1} exactly once")
    if policy not in BUDGETS:
        raise ValueError(f"budget policy {policy!r}: expected one of {list(BUDGETS)}")
    if not set_at_submission(policy):
        return out
    for idxs in assignment:
        free = [i for i in idxs if out[i] is None]
        if free:
            for i, b in zip(
                free, assign_budgets([predicted_remaining[i] for i in free], k, policy, **kwargs), strict=True
            ):
                out[i] = int(b)
    return out


# --------------------------------------------------------------------------- k by batch size

def k_for_batch(batch: int, k: int, acceptance: Acceptance = 0.7, c_base: float = 1.0,
                c_tok: float = 1.0 / 64, c_draft: float = 0.0, c_draft_fwd: float = 0.0,
                step_time: Callable[[int, int], float] | None = None) -> int:
    """The k in 0..k that maximises tokens per second for a batch of `batch` requests:
    batch * A(d) / (c_base + c_tok * batch * (1 + d) + c_draft * batch * d + c_draft_fwd * d).
    `c_draft_fwd` is a fixed cost per draft forward (model drafters run d forwards per step).
    `step_time(batch, d)`, when given, replaces that linear step time (e.g. the simulator's
    roofline). Ties go to the smaller d."""
    A = expected_accepted(acceptance, k)
    d = np.arange(k + 1)
    if step_time is None:   # the one step-cost function in its linear form (cost/model.py)
        cost = CostModel(c_base=c_base, c_tok=c_tok, draft_tok=c_draft, draft_fwd_base=c_draft_fwd, draft_kind="model")
        t = np.array([cost.mean_step_time(batch, float(x), 0.0) for x in d])
    else:
        t = np.array([step_time(batch, int(x)) for x in d])
    thr = batch * A / t
    return int(np.flatnonzero(thr >= thr.max() * (1 - 1e-12))[0])


def k_by_batch_size_schedule(max_batch: int, k: int, acceptance: Acceptance = 0.7, c_base: float = 1.0,
                             c_tok: float = 1.0 / 64, c_draft: float = 0.0,
                             c_draft_fwd: float = 0.0,
                             step_time: Callable[[int, int], float] | None = None) -> list[tuple[int, int, int]]:
    """vLLM's `num_speculative_tokens_per_batch_size`: [(lo, hi, k), ...] covering 1..max_batch.

    Each batch size gets the throughput-optimal k of `k_for_batch` under the cost model
    t = c_base + c_tok * tokens (+ drafting), or `step_time(batch, d)` when given; only the
    ratios of the costs matter. The default c_tok / c_base = 1/64 says a step of 64 tokens
    costs twice a step of one. Small batches are memory-bound and get the full k; as the batch
    grows, verification costs more and k falls, down to 0 (speculation off) for large batches.
    Ranges are inclusive, ascending, start at 1.
    """
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch={max_batch!r}: expected an int >= 1")
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k={k!r}: expected an int >= 0")
    if step_time is None and (c_base <= 0 or c_tok < 0 or c_draft < 0 or c_draft_fwd < 0):
        raise ValueError("cost model: need c_base > 0 and non-negative c_tok, c_draft, c_draft_fwd")
    return schedule_ranges([k] + [k_for_batch(b, k, acceptance, c_base, c_tok, c_draft, c_draft_fwd, step_time)
                                  for b in range(1, max_batch + 1)])


def schedule_ranges(lookup: Sequence[int]) -> list[tuple[int, int, int]]:
    """vLLM's [(lo, hi, k), ...] form of a dense lookup (index = batch size, index 0 unused), equal
    k values of neighbouring batch sizes merged into one range."""
    out: list[list[int]] = []
    for b in range(1, len(lookup)):
        if out and out[-1][2] == lookup[b]:
            out[-1][1] = b
        else:
            out.append([b, b, int(lookup[b])])
    return [tuple(x) for x in out]  # type: ignore[misc]


