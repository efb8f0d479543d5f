"""Per-step draft lengths for list drafters: `scheduling.budget: adaptive`, and the per-step
off switch `speculative_decoding.auto_disable`.

At every engine step the drafter has a draft for each request (up to its cap) and, for every
draft token j of request i, a calibrated probability g_ij that the target accepts it. The step
commits, in expectation, 1 + g_i1 + ... + g_id tokens of request i when it verifies d of its
drafts, and costs

    t = t0 + c_tok * (draft tokens verified)

with t0 the step's time without drafts and c_tok the cost of one more verified token, both from
the engine's online step-cost fit (`cost/online.py`). `draft_lengths` chooses the d_i
that maximise committed tokens per second of the step:

    max  sum_i (1 + sum_{j <= d_i} g_ij)  /  (t0 + c_tok * sum_i d_i)

A token can only be accepted if the one before it was, so g_ij cannot rise with j; a curve that
does (calibration noise) is cut to its running minimum. Every draft token costs the same, so the
best set of m tokens is the m most valuable ones, and (with non-increasing g_ij) it is a prefix
of every request's draft; the ratio rises while the next token's value per second beats the
ratio so far, then falls. The greedy below therefore stops at the optimum (a brute-force test
checks it). When no token pays for itself the step drafts nothing: speculation is off for that
step, whatever k is.

`drafts_pay` is the all-or-nothing form of the same rule, for `auto_disable` under the other
budgets: the step keeps every draft its budget allowed, or none when the step is predicted to
commit fewer tokens per second with them than without.

`StepJudge` is what a list proposer in an engine (DAS, our n-gram) holds to apply either rule:
it samples the step time between the proposer's calls into the step-cost fit, cuts each step's
drafts, counts what it did (into the proposer's counters, and steps turned off per batch-size
bin) and logs every switch between drafting and not with the numbers behind it. Withholding a
step's drafts saves their verification but not the proposer's own time; so once `OFF_STREAK`
judged steps in a row of one batch-size bin kept nothing, the bin is off: the proposer skips
drafting there (`skip`), except one probe step in `PROBE_EVERY`, which drafts, is judged, and
turns the bin back on when its drafts pay. Skipped steps are not step-cost samples (the
proposer's time is part of what the fit measures).

Every request's tokens count the same. A weight favouring the requests predicted to set the
makespan leaves out that a request denied drafts stays in the batch longer, and each of those
steps costs its per-request time and delays the requests queued behind it.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from nemo_rl_specdec.cost.online import StepCostFit, StepCostSource

log = logging.getLogger("nemo_rl_specdec")

UNFIT_WARN_STEPS = 512  # decode steps after which a step-cost fit that never became ready is reported once
OFF_STREAK = 8  # judged steps in a row with no draft kept, in one batch-size bin, that turn the bin off
PROBE_EVERY = 16  # in a bin that is off, one step in this many still computes (and withholds) its drafts


def gain_matrix(gains: np.ndarray | Sequence[Sequence[float] | np.ndarray]) -> tuple[np.ndarray, int]:
    """(values, draft tokens): `gains` as an (n, k) array clipped to [0, 1] and cut to each row's
    running minimum, with 0 where a row has no token, and the number of real draft tokens. A 2-D
    array marks "no token" with NaN (rows are padded at their end); a sequence of rows may be ragged."""
    if isinstance(gains, np.ndarray) and gains.ndim == 2:
        a = np.array(gains, dtype=float)
    else:
        rows = [np.asarray(g, dtype=float).ravel() for g in gains]
        a = np.full((len(rows), max((len(g) for g in rows), default=0)), np.nan)
        for i, g in enumerate(rows):
            a[i, :len(g)] = g
    real = ~np.isnan(a)
    a[~real] = 0.0
    np.clip(a, 0.0, 1.0, out=a)
    return np.minimum.accumulate(a, axis=1) if a.size else a, int(real.sum())


def _check(gains: np.ndarray | Sequence[Sequence[float] | np.ndarray], t0: float, c_tok: float,
           requests: int | None) -> int:
    if not t0 > 0 or not c_tok >= 0:
        raise ValueError(f"step cost: need t0 > 0 and c_tok >= 0, got t0={t0!r}, c_tok={c_tok!r}")
    if requests is None:
        return len(gains)
    if requests < len(gains):
        raise ValueError(f"requests={requests!r}: the step has at least the {len(gains)} requests with drafts")
    return int(requests)


def draft_lengths(gains: np.ndarray | Sequence[Sequence[float] | np.ndarray], t0: float, c_tok: float,
                  requests: int | None = None) -> list[int]:
    """Draft tokens to verify per request (a prefix of each request's draft; see module doc).
    gains[i][j]: probability that request i's draft token j + 1 is accepted (rows of any length,
    or a NaN-padded 2-D array); t0 > 0 seconds: the step without drafts; c_tok >= 0 seconds per
    verified draft token; requests: the step's requests (default len(gains)), those without a
    row in `gains` committing one token each."""
    n = _check(gains, t0, c_tok, requests)
    a, _ = gain_matrix(gains)
    rows_n, k = a.shape
    if not a.size:
        return [0] * rows_n
    v = a.ravel()
    row, pos = np.divmod(np.arange(v.size), k)
    order = np.lexsort((row, pos, -v))  # most valuable first; ties: earlier position, then earlier request
    vs = v[order]
    committed = n + np.cumsum(vs) - vs          # before taking token m: n + vs[0] + ... + vs[m - 1]
    seconds = t0 + c_tok * np.arange(vs.size)
    take = (vs > 0) & (vs * seconds > c_tok * committed)  # v / c_tok > committed / seconds
    m = vs.size if take.all() else int(np.argmin(take))  # the greedy stops at the first token that does not pay
    return np.bincount(row[order[:m]], minlength=rows_n).tolist()


def drafts_pay(gains: np.ndarray | Sequence[Sequence[float] | np.ndarray], t0: float, c_tok: float,
               requests: int | None = None) -> bool:
    """Whether verifying every draft of the step commits more tokens per second than verifying
    none (arguments as for `draft_lengths`)."""
    n = _check(gains, t0, c_tok, requests)
    a, tokens = gain_matrix(gains)
    if not tokens:
        return False
    committed = n + float(a.sum())
    return committed * t0 > n * (t0 + c_tok * tokens)  # committed / seconds beats n / t0


def batch_bin(requests: int) -> str:
    """Batch-size bin of `StepJudge.off_by_batch`: 1, 2, 3-4, 5-8, ... (powers of two)."""
    if requests <= 2:
        return str(requests)
    hi = 1 << (requests - 1).bit_length()
    return f"{hi // 2 + 1}-{hi}"


class StepJudge:
    """The per-step rule of one list proposer (module doc). `counters` is the proposer's counter
    dict: `<rule>_steps`, `<rule>_off_steps`, `<rule>_cut_tokens` are added to it."""

    def __init__(self, name: str, counters: dict, adaptive: bool, auto_disable: bool):
        self.name, self.counters = name, counters
        self.adaptive, self.auto_disable = bool(adaptive), bool(auto_disable)
        for rule in ("adaptive", "auto_disable"):
            for what in ("steps", "off_steps", "cut_tokens"):
                counters.setdefault(f"{rule}_{what}", 0)
        self.fit: StepCostSource = StepCostFit()  # a replay sets a profile's prices (`PricedStepCost`)
        self.off_by_batch: dict = {}  # steps the rule turned speculation off, by batch-size bin
        self._last: tuple | None = None  # (start time, requests, verified tokens, context) of the last call
        self._drafting = True  # whether the last judged step drafted (switches are logged)
        self._unfit_warned = False
        self._streak: dict = {}  # batch-size bin -> judged steps in a row that kept no draft
        self._seen: dict = {}  # batch-size bin -> steps of the bin while it was off (for the probes)
        counters.setdefault("skipped_steps", 0)

    @property
    def active(self) -> bool:
        return self.adaptive or self.auto_disable

    def choose(self, gains: np.ndarray | Sequence[Sequence[float] | np.ndarray], lengths: list, requests: int,
               ctx_sum: int) -> list | None:
        """Draft tokens to keep of each pending draft (`lengths` tokens each; `gains` their calibrated
        acceptance, a NaN-padded matrix or ragged rows), or None: keep every draft (the rule is off,
        or the step-cost fit is still in its warm-up). `requests`: the step's requests, with or
        without a draft; `ctx_sum`: their summed context length."""
        if not self.active or not lengths:
            return None
        cost = self.fit.split(requests, ctx_sum, float(sum(lengths)))
        if cost is None:
            return None
        t0, c_tok = cost
        if self.adaptive:
            rule, keep = "adaptive", draft_lengths(gains, t0, c_tok, requests)
        else:
            rule = "auto_disable"
            keep = list(lengths) if drafts_pay(gains, t0, c_tok, requests) else [0] * len(lengths)
        c = self.counters
        c[rule + "_steps"] += 1
        c[rule + "_cut_tokens"] += int(sum(lengths) - sum(keep))
        drafting = any(keep)
        b = batch_bin(requests)
        self._streak[b] = 0 if drafting else self._streak.get(b, 0) + 1
        if not drafting:
            c[rule + "_off_steps"] += 1
            self.off_by_batch[b] = self.off_by_batch.get(b, 0) + 1
        if drafting != self._drafting:
            self._drafting = drafting
            full, tokens = gain_matrix(gains)
            log.info("%s %s: speculation %s at %d requests: all drafts would commit %.3g tokens per ms against "
                     "%.3g without them (step %.3g ms, %.3g ms per draft token; fit on %d steps, R^2 %s)",
                     self.name, rule, "on" if drafting else "off", requests,
                     (requests + float(full.sum())) / (1e3 * (t0 + c_tok * tokens)), requests / (1e3 * t0),
                     1e3 * t0, 1e3 * c_tok, self.fit.samples, "n/a" if self.fit.r2 is None else f"{self.fit.r2:.2f}")
        return keep

    def skip(self, requests: int) -> bool:
        """Whether the proposer should not draft at all this step: its batch-size bin is off and this
        is not a probe step (module doc)."""
        b = batch_bin(requests)
        if not self.active or self._streak.get(b, 0) < OFF_STREAK:
            return False
        self._seen[b] = self._seen.get(b, 0) + 1
        if self._seen[b] % PROBE_EVERY == 0:
            return False
        self.counters["skipped_steps"] += 1
        return True

    def called(self, start: float, requests: int, verified_tokens: int, ctx_sum: int, prefilled: bool,
               skipped: bool = False) -> None:
        """The proposer was called at `start` and proposed for a step of `requests` requests that will
        verify `verified_tokens` tokens. The time since the last call is the step that ran in
        between; it is a sample unless it prefilled a request (`prefilled`), or the proposer skipped
        drafting in either call (`skipped`: the proposer's time, part of every sample, is missing)."""
        last, self._last = self._last, (start, requests, verified_tokens, ctx_sum, skipped)
        if last is None or prefilled or skipped or last[4]:
            return
        self.fit.add(last[1], last[2], last[3], start - last[0])
        if self.active and not self._unfit_warned and not self.fit.ready and self.fit.samples >= UNFIT_WARN_STEPS:
            self._unfit_warned = True
            log.warning("%s %s: the step-cost fit is not ready after %d decode steps (the steps' draft-token counts "
                        "did not vary enough to tell a draft token's cost), so every draft is kept; the stats' "
                        "step_cost shows the fit", self.name, "adaptive" if self.adaptive else "auto_disable",
                        self.fit.samples)

    def state_dict(self) -> dict:
        """What a checkpoint carries: the step-cost fit and which batch-size bins the rule turned off."""
        return {"fit": self.fit.state_dict(), "off_by_batch": dict(self.off_by_batch), "streak": dict(self._streak),
                "seen": dict(self._seen), "drafting": self._drafting}

    def load_state_dict(self, state: dict) -> None:
        self.fit.load_state_dict(state["fit"])
        self.off_by_batch, self._streak = dict(state["off_by_batch"]), dict(state["streak"])
        self._seen, self._drafting = dict(state["seen"]), bool(state["drafting"])
        self._last = None  # the time since the last call before the resume is no step

    def stats(self) -> dict:
        return {"adaptive": self.adaptive, "auto_disable": self.auto_disable,
                "off_by_batch": dict(self.off_by_batch), "off_bins": sorted(b for b, n in self._streak.items()
                                                                            if n >= OFF_STREAK),
                "step_cost": self.fit.metrics()}


__all__ = ["StepJudge", "batch_bin", "draft_lengths", "drafts_pay", "gain_matrix"]
