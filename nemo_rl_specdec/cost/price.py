"""A rollout's time on a GPU, from its trace and a hardware profile.

    nemo-rl-specdec price TRACE.json --hardware h100_qwen3_8b [--baseline NOSPEC.json] [--json OUT]

Every step of the trace (`cost/trace.py`) is priced by the profile's cost model (`cost/profile.py`,
the simulator's `CostModel`): the target forward over the step's verified and prefilled tokens
and its requests' contexts on the measured roofline; the drafter's forwards (k sequential ones for
a model drafter, one over every draft position for a block drafter) on the same roofline from the
draft's shape; and for a history drafter its proposer's host time, ``step_overhead_s +
per_request_s * requests`` for every decode step (vLLM runs the proposer for every running request
of every step, on the step's critical path), from the profile's constants. A hybrid trace (a
history drafter on every step, a model drafter's forwards as each step counts them) is priced
from its two parts' entries: the history proposer's host time on every decode step, and the
model part's draft forwards the step ran over every request of the step (`model_forward_s`); a
model drafter's step that counts its forwards (``model_forwards``: a rule skipped some) is priced
the same way, from those forwards. The rollout time is the sum over steps, so the same trace and
profile always give the same figure.

The baseline is ``--baseline`` (a no-speculation trace of the same requests), or for a replay
trace its own run without drafts (`Trace.without_drafts`). The trace's measured proposer time is
printed beside the profile's (the profile's constants are fitted on such traces:
``--fit-proposer`` prints the fit).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from nemo_rl_specdec.cost.profile import HardwareProfile
from nemo_rl_specdec.cost.trace import HYBRID, Trace, TraceError

OUTLIER_MADS = 3.0
# batch-size bins of the proposer-share report: [lo, hi)
BINS = ((1, 2), (2, 5), (5, 17), (17, 65), (65, 257), (257, 10 ** 9))


@dataclass
class Priced:
    hardware: str
    drafter: str | None
    rollout_s: float
    target_s: float                 # what the same steps' target forwards cost
    draft_s: float                  # draft forwards (model and block drafters)
    proposer_s: float               # history proposers' host time (profile constants)
    measured_proposer_s: float | None
    steps: int                      # target forwards (engine steps)
    generated_tokens: int
    tokens_per_forward: float       # per request per forward, as metrics.py counts them
    step_s: list = field(default_factory=list, repr=False)
    rows: list = field(default_factory=list, repr=False)

    def as_dict(self, steps: bool = False) -> dict:
        d = asdict(self)
        if not steps:
            d.pop("step_s")
            d.pop("rows")
        return d


def _hybrid_parts(trace: Trace, profile: HardwareProfile, drafter: str | None) -> tuple[str, str]:
    """(history entry, model entry) of a hybrid trace, checked against the profile."""
    if drafter is not None:
        raise TraceError(f"drafter: {drafter!r}; a hybrid trace is priced from its parts {trace.parts} "
                         "(name no drafter)")
    parts = trace.parts or {}
    hist, model = profile.drafter(parts["history"]), profile.drafter(parts["model"])
    if hist.kind != "list" or not (hist.per_request_s or hist.step_overhead_s):
        raise TraceError(f"parts.history: {profile.name}'s {parts['history']!r} is not a history drafter's entry with "
                         "its proposer's host time (per_request_s, step_overhead_s)")
    if model.kind not in ("model", "block"):
        raise TraceError(f"parts.model: {profile.name}'s {parts['model']!r} is a {model.kind} drafter; allowed: a "
                         "model or block drafter's entry")
    return parts["history"], parts["model"]


def model_forward_s(profile: HardwareProfile, key: str, forwards: int, ctx) -> float:
    """The model (or block) drafter `key`'s draft forwards for a step whose requests are at contexts
    `ctx`: `forwards` sequential forwards over every request (a block drafter: one over `forwards`
    positions of each), on `profile`'s roofline; 0 when none runs."""
    c = np.asarray(ctx, dtype=float)
    if not forwards or not c.size:
        return 0.0
    d, zero = np.full(c.size, float(forwards)), np.zeros(c.size)
    return profile.cost_model(key).step_cost(d, c, zero).at(0) - profile.cost_model(None).step_cost(d, c, zero).at(0)


def _drafter_key(trace: Trace, profile: HardwareProfile, drafter: str | None) -> str | None:
    if trace.kind in ("none", HYBRID):
        return None
    key = drafter or trace.drafter
    if key is None:
        raise TraceError("drafter: the trace names no drafter; name the profile's entry (price --drafter NAME)")
    d = profile.drafter(key)
    if d.kind != trace.kind:
        raise TraceError(f"kind: the trace's drafter is a {trace.kind} drafter; {profile.name}'s {key!r} is a "
                         f"{d.kind} drafter")
    if d.kind == "list" and not (d.per_request_s or d.step_overhead_s):
        raise TraceError(f"{profile.name}: drafters.{key}: a history drafter's entry needs its proposer's host time "
                         "(per_request_s, step_overhead_s; fit them with price --fit-proposer)")
    return key


def price(trace: Trace, profile: HardwareProfile, drafter: str | None = None) -> Priced:
    """The trace's rollout time on `profile` (module doc)."""
    key = _drafter_key(trace, profile, drafter)
    hist = model = None
    if trace.kind == HYBRID:
        hist, model = _hybrid_parts(trace, profile, drafter)
    target = profile.cost_model(None)
    cm = profile.cost_model(key) if key is not None else target
    if trace.kind == "list":   # the proposer is priced below (profile_proposer), for every decode step
        from dataclasses import replace

        cm = replace(cm, draft_per_request=0.0, spec_step_overhead=0.0)
    total = t_target = t_draft = t_prop = 0.0
    step_s, rows = [], []
    for s in trace.steps:
        n = len(s.rids)
        ctx = np.asarray(s.ctx, dtype=float)
        drafts = np.asarray(s.drafts, dtype=float)
        zero = np.zeros(n)
        tt = target.step_cost(drafts, ctx, zero, float(s.prefill_tokens)).at(0)
        t_all = cm.step_cost(drafts, ctx, zero, float(s.prefill_tokens)).at(0)
        if hist is not None:   # the target verifies every draft; the model part ran its forwards or not
            t_all = tt + model_forward_s(profile, model, s.model_forwards, ctx)
        elif s.model_forwards:   # a model drafter whose step says the forwards it ran (a rule skipped some)
            t_all = tt + model_forward_s(profile, key, s.model_forwards, ctx)
        tp = profile_proposer(profile, hist or key, n)
        t_target += tt
        t_draft += t_all - tt
        t_prop += tp
        step_s.append(t_all + tp)
        rows.append(n)
        total += t_all + tp
    return Priced(profile.name, key if hist is None else trace.drafter, total, t_target, t_draft, t_prop,
                  trace.proposer_s, trace.target_forwards, trace.generated_tokens, trace.tokens_per_forward(),
                  step_s, rows)


def speedup(spec: Trace, profile: HardwareProfile, baseline: Trace | None = None,
            drafter: str | None = None) -> dict:
    """Priced rollout time of `spec` and of its baseline, and the ratio baseline / spec."""
    base = baseline if baseline is not None else spec.without_drafts()
    if base.kind != "none":
        raise TraceError(f"baseline kind: {base.kind!r}; allowed: 'none' (a trace without speculation)")
    if base.generated_tokens != spec.generated_tokens:
        raise TraceError(f"baseline: {base.generated_tokens} generated tokens against the trace's "
                         f"{spec.generated_tokens}; allowed: a rollout of the same requests to the same lengths")
    p_spec, p_base = price(spec, profile, drafter), price(base, profile)
    return {"hardware": profile.name, "drafter": p_spec.drafter, "baseline": p_base.as_dict(),
            "spec": p_spec.as_dict(), "speedup": p_base.rollout_s / p_spec.rollout_s}


def proposer_share(traces: list, profile: HardwareProfile, drafter: str | None = None) -> list[dict]:
    """Per batch-size bin over the history drafter's `traces`: the measured proposer time per
    request-step (µs) and its share of the priced step, the target's and drafts' forwards on
    `profile` plus the measured proposer time."""
    acc: dict = {}
    for t in traces:
        if t.kind not in ("list", HYBRID):
            raise TraceError(f"kind: {t.kind!r}; a proposer share is a history drafter's (kind 'list' or 'hybrid')")
        p = price(t, profile, drafter)
        key = p.drafter if t.kind == "list" else (t.parts or {})["history"]
        for i, s in enumerate(t.steps):
            n = len(s.rids)
            if not n:
                continue
            b = next(j for j, (lo, hi) in enumerate(BINS) if lo <= n < hi)
            a = acc.setdefault(b, [0, 0, 0.0, 0.0])
            a[0] += 1
            a[1] += n
            a[2] += s.proposer_s or 0.0
            a[3] += p.step_s[i] - profile_proposer(profile, key, n)
    out = []
    for b in sorted(acc):
        lo, hi = BINS[b]
        steps, rows, meas, device = acc[b]
        out.append({"batch": f"{lo}-{hi - 1}" if hi < 10 ** 9 else f">={lo}", "steps": steps, "rows": rows,
                    "proposer_us_per_row": 1e6 * meas / rows,
                    "share_of_step": meas / (device + meas) if device + meas > 0 else 0.0})
    return out


def profile_proposer(profile: HardwareProfile, key: str | None, rows: int) -> float:
    """A history proposer's host time for a decode step of `rows` requests, from the profile's entry
    `key` (0 for other drafters and for a step without decode requests)."""
    d = profile.drafter(key) if key is not None else None
    if d is None or d.kind != "list" or rows == 0:
        return 0.0
    return d.step_overhead_s + d.per_request_s * rows


def fit_proposer(traces: list) -> dict:
    """(step_overhead_s, per_request_s) of a history proposer: non-negative least squares of its
    measured time per decode step on the step's requests, over the traces' steps, refitted once
    without the steps further than `OUTLIER_MADS` robust deviations out."""
    from scipy.optimize import nnls

    x, y = [], []
    for t in traces:
        if t.kind != "list":
            raise TraceError(f"kind: {t.kind!r}; the proposer fit reads history drafters' traces")
        for s in t.steps:
            if s.rids:
                x.append([1.0, float(len(s.rids))])
                y.append(float(s.proposer_s))
    if len(y) < 2 or len({r[1] for r in x}) < 2:
        raise TraceError("steps: need decode steps of at least two batch sizes to fit the proposer")
    X, Y = np.asarray(x), np.asarray(y)
    coef, _ = nnls(X, Y)
    res = Y - X @ coef
    dev = np.abs(res - np.median(res))
    keep = dev <= OUTLIER_MADS * 1.4826 * np.median(dev)   # a first call's JIT compile, a descheduled thread
    if np.median(dev) > 0 and keep.sum() >= 2 and len({r[0] for r in X[keep][:, 1:]}) >= 2 and not keep.all():
        X, Y = X[keep], Y[keep]
        coef, _ = nnls(X, Y)
    pred = X @ coef
    ss = float(((Y - Y.mean()) ** 2).sum())
    return {"step_overhead_s": float(coef[0]), "per_request_s": float(coef[1]), "steps": len(y), "kept": len(Y),
            "r2": 1.0 - float(((Y - pred) ** 2).sum()) / ss if ss > 0 else 1.0}


class PricedStepCost:
    """The per-step rules' step cost (`drafters/machinery/step_judge.py` reads ``split``) from a hardware profile
    instead of the engine's online fit, so a replayed rule decides on the costs of that GPU: ``t0``
    is the step's target forward without drafts plus the proposer's host time, ``c_tok`` the cost
    of one more verified draft token, the secant from no drafts to `k` drafts per request (the
    roofline turns compute-bound as drafts grow, so the first draft token alone would understate
    long drafts)."""

    def __init__(self, profile: HardwareProfile, drafter: str, k: int):
        self.profile, self.drafter, self.k = profile, drafter, max(1, int(k))
        self.target = profile.cost_model(None)
        self.samples = 0
        self.coef = True   # always ready: nothing to fit
        self.r2 = None

    def split(self, requests: int, ctx_sum: int) -> tuple[float, float]:
        b = max(1, int(requests))
        ctx = ctx_sum / b
        t0 = self.target.mean_step_time(b, 0.0, ctx)
        tk = self.target.mean_step_time(b, float(self.k), ctx)
        return t0 + profile_proposer(self.profile, self.drafter, b), (tk - t0) / (self.k * b)

    def add(self, *args, **kwargs) -> None:
        self.samples += 1   # a step the rule saw; the profile's costs do not change with it

    def metrics(self) -> dict:
        return {"samples": self.samples, "priced_on": self.profile.name}


__all__ = ["BINS", "Priced", "PricedStepCost", "fit_proposer", "model_forward_s", "price", "proposer_share", "speedup"]
