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
from typing import Any

import numpy as np

from nemo_rl_specdec.cost.fit import nnls_fit
from nemo_rl_specdec.cost.model import CostModel, Step, StepCost
from nemo_rl_specdec.cost.profile import HardwareProfile
from nemo_rl_specdec.cost.trace import HYBRID, Trace, TraceError

# the host speeds every priced verdict is given at: the host the profile's proposer constants were fitted on,
# and a host twice as fast (a GPU node's CPU is faster than the development machines' two shared cores)
HOST_SPEEDS = (1.0, 2.0)
# where a priced step's host term comes from: the trace's own measured proposer times (what a verdict is given on),
# or the hardware profile's constants (the simulator's, and a comparison)
HOST_TERMS = ("measured", "profile")
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
    host: str = ""                  # the host the profile's proposer constants were fitted on
    host_speed: float = 1.0         # the host priced, relative to that one (the host term divides by it)
    host_term: str = "profile"      # the host term from the profile's constants or the measured times

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
    positions of each), on `profile`'s roofline; 0 when none runs (the draft term of the one cost
    function for that step)."""
    c = np.asarray(ctx, dtype=float)
    if not forwards or not c.size:
        return 0.0
    return profile.cost_model(key).cost(Step.of(c, np.full(c.size, float(forwards)), forwards=forwards)).draft_s


def check_host_speed(host_speed: float) -> float:
    """`host_speed`, or a TraceError naming it when it is not a number > 0."""
    if isinstance(host_speed, bool) or not isinstance(host_speed, (int, float)) or not host_speed > 0 \
            or host_speed == float("inf"):
        raise TraceError(f"host_speed: {host_speed!r}; allowed: a finite number > 0 (the host's speed relative to the "
                         "one the profile's proposer constants were fitted on)")
    return float(host_speed)


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


def step_of(trace: Trace, i: int) -> Step:
    """The description of the trace's step `i` that the cost function prices: its requests' contexts
    and drafts, its prefill, the draft forwards it counted (a hybrid's always; a model drafter's where
    a rule skipped some) and, for a history drafter, its proposer running for every decode request
    (vLLM runs it for every running request of every step, on the step's critical path)."""
    s = trace.steps[i]
    counted = trace.kind == HYBRID or (trace.kind == "model" and s.model_forwards)
    return Step.of(s.ctx, s.drafts, s.prefill_tokens, s.model_forwards if counted else None,
                   trace.kind in ("list", HYBRID) and bool(s.rids))


def step_costs(trace: Trace, profile: HardwareProfile, drafter: str | None = None,
               host_speed: float = 1.0, host: str = "profile") -> list[StepCost]:
    """Every step of the trace priced by `profile`'s cost function, in its three terms; a hybrid's
    host term is its history part's proposer, its draft term its model part's forwards. `host`: where
    the host term comes from (`HOST_TERMS`): ``profile``, the profile's constants; ``measured``, the
    trace's own proposer thread time of each step (the time measured in the run that made the trace),
    divided by `host_speed` as the constants are."""
    check_host_speed(host_speed)
    if host not in HOST_TERMS:
        raise TraceError(f"host: {host!r}; allowed: {', '.join(HOST_TERMS)} (the host term from the profile's "
                         "constants, or from the trace's measured proposer times)")
    key = _drafter_key(trace, profile, drafter)
    host_cm: CostModel | None
    if trace.kind == HYBRID:
        hist, model = _hybrid_parts(trace, profile, drafter)
        cm, host_cm = profile.cost_model(model), profile.cost_model(hist)
    else:
        cm = profile.cost_model(key)
        host_cm = cm if trace.kind == "list" else None
    measured = host == "measured" and trace.kind in ("list", HYBRID)
    out = []
    for i in range(len(trace.steps)):
        step = step_of(trace, i)
        c = cm.cost(step, host_speed)
        if host_cm is not None and host_cm is not cm:
            c = StepCost(c.target_s, c.draft_s, host_cm.cost(step, host_speed).proposer_s)
        if measured and trace.steps[i].rids:
            c = StepCost(c.target_s, c.draft_s, float(trace.steps[i].proposer_s or 0.0) / host_speed)
        out.append(c)
    return out


def price(trace: Trace, profile: HardwareProfile, drafter: str | None = None, host_speed: float = 1.0,
          host: str = "profile") -> Priced:
    """The trace's rollout time on `profile` (module doc); `host_speed`: the host's speed relative to
    the one the host term was measured on, dividing the host term only; `host`: the host term from the
    profile's constants or the trace's measured proposer times (`step_costs`)."""
    key = _drafter_key(trace, profile, drafter)
    costs = step_costs(trace, profile, drafter, host_speed, host)
    step_s = [c.total_s for c in costs]
    rows = [len(s.rids) for s in trace.steps]
    t_target, t_draft, t_prop = (sum(getattr(c, f) for c in costs) for f in ("target_s", "draft_s", "proposer_s"))
    total = sum(step_s)
    hist = (trace.parts or {}).get("history") if trace.kind == HYBRID else None
    return Priced(profile.name, key if hist is None else trace.drafter, total, t_target, t_draft, t_prop,
                  trace.proposer_s, trace.target_forwards, trace.generated_tokens, trace.tokens_per_forward(),
                  step_s, rows, profile.host, float(host_speed), host)


def speedup(spec: Trace, profile: HardwareProfile, baseline: Trace | None = None,
            drafter: str | None = None, host_speed: float = 1.0) -> dict:
    """Priced rollout time of `spec` and of its baseline, and the ratio baseline / spec."""
    base = baseline if baseline is not None else spec.without_drafts()
    if base.kind != "none":
        raise TraceError(f"baseline kind: {base.kind!r}; allowed: 'none' (a trace without speculation)")
    if base.generated_tokens != spec.generated_tokens:
        raise TraceError(f"baseline: {base.generated_tokens} generated tokens against the trace's "
                         f"{spec.generated_tokens}; allowed: a rollout of the same requests to the same lengths")
    p_spec, p_base = price(spec, profile, drafter, host_speed), price(base, profile, host_speed=host_speed)

    def bands(host: str) -> list:   # the verdict at each host speed: only the host term moves
        out = []
        for h in HOST_SPEEDS:
            ps = p_spec if h == host_speed and host == "profile" else price(spec, profile, drafter, h, host)
            out.append({"host_speed": h, "speedup": p_base.rollout_s / ps.rollout_s, "rollout_s": ps.rollout_s,
                        "proposer_s": ps.proposer_s})
        return out

    return {"hardware": profile.name, "drafter": p_spec.drafter, "host": profile.host, "host_speed": host_speed,
            "baseline": p_base.as_dict(), "spec": p_spec.as_dict(), "speedup": p_base.rollout_s / p_spec.rollout_s,
            "by_host_speed": bands("profile"), "measured_by_host_speed": bands("measured")}


def proposer_share(traces: list, profile: HardwareProfile, drafter: str | None = None) -> list[dict]:
    """Per batch-size bin over the history drafter's `traces`: the proposer's host time per request-step
    (µs) and its share of the priced step, from the profile's constants at each of `HOST_SPEEDS`
    (deterministic: `share_of_step` on the host they were fitted on, `share_of_step_2x` on a host twice
    as fast), and from the proposer's measured thread time in the traces (`measured_us_per_row`,
    `measured_share_of_step` and `measured_share_of_step_2x`, each step priced with its measured host
    term)."""
    acc: dict[int, dict[Any, Any]] = {}
    for t in traces:
        if t.kind not in ("list", HYBRID):
            raise TraceError(f"kind: {t.kind!r}; a proposer share is a history drafter's (kind 'list' or 'hybrid')")
        by_speed: dict = {h: step_costs(t, profile, drafter, h) for h in HOST_SPEEDS}
        by_speed.update({("measured", h): step_costs(t, profile, drafter, h, "measured") for h in HOST_SPEEDS})
        for i, s in enumerate(t.steps):
            n = len(s.rids)
            if not n:
                continue
            b = next(j for j, (lo, hi) in enumerate(BINS) if lo <= n < hi)
            a = acc.setdefault(b, {"steps": 0, "rows": 0, "measured": 0.0,
                                   **{h: [0.0, 0.0] for h in by_speed}})   # h: [proposer, step]
            a["steps"] += 1
            a["rows"] += n
            a["measured"] += s.proposer_s or 0.0
            for h, costs in by_speed.items():
                a[h][0] += costs[i].proposer_s
                a[h][1] += costs[i].total_s
    out = []
    for b in sorted(acc):
        lo, hi = BINS[b]
        a = acc[b]
        share = {h: a[h][0] / a[h][1] if a[h][1] > 0 else 0.0 for h in a if h not in ("steps", "rows", "measured")}
        out.append({"batch": f"{lo}-{hi - 1}" if hi < 10 ** 9 else f">={lo}", "steps": a["steps"], "rows": a["rows"],
                    "proposer_us_per_row": 1e6 * a[1.0][0] / a["rows"],
                    "measured_us_per_row": 1e6 * a["measured"] / a["rows"],
                    "share_of_step": share[1.0], "share_of_step_2x": share[2.0],
                    "measured_share_of_step": share[("measured", 1.0)],
                    "measured_share_of_step_2x": share[("measured", 2.0)], "host": profile.host})
    return out


def fit_proposer(traces: list) -> dict:
    """(step_overhead_s, per_request_s) of a history proposer: non-negative least squares of its
    measured time per decode step on the step's requests, over the traces' steps, refitted once
    without the steps further than `OUTLIER_MADS` robust deviations out."""
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
    X = np.asarray(x)
    fit = nnls_fit(X, y, refit=lambda keep: int(keep.sum()) >= 2 and len(set(X[keep, 1])) >= 2)
    return {"step_overhead_s": float(fit.coef[0]), "per_request_s": float(fit.coef[1]), "steps": len(y),
            "kept": fit.kept, "r2": fit.r2}


def proposer_gap(traces: list, profile: HardwareProfile, key: str) -> dict:
    """How far the profile's constants for the history proposer `key` are from the proposer time
    measured in `traces` (one configuration's traces of one run): the host term summed over the traces'
    decode steps from the constants and as measured, their ratio, the entry's constants, and the
    constants fitted on these traces (`fit_proposer`; None where the traces' steps cannot fit two)."""
    d = profile.drafter(key)
    constants = sum(c.proposer_s for t in traces for c in step_costs(t, profile, key))
    measured = sum(c.proposer_s for t in traces for c in step_costs(t, profile, key, host="measured"))
    try:
        fit: dict | None = fit_proposer(traces)
    except TraceError:
        fit = None
    return {"entry": key, "profile_proposer_s": constants, "measured_proposer_s": measured,
            "profile_over_measured": constants / measured if measured > 0 else None,
            "profile": {"step_overhead_s": d.step_overhead_s, "per_request_s": d.per_request_s}, "fit": fit}


class PricedStepCost:
    """The per-step rules' step cost (`cost/online.py` `StepCostSource`, what
    `drafters/machinery/step_judge.py` reads) from a hardware profile instead of the engine's online
    fit, so a replayed rule decides on the costs of that GPU: the one cost function's `CostModel.split`
    of the step, ``t0`` the step's target forward without drafts plus the proposer's host time,
    ``c_tok`` the secant of the target forward from no drafts to the drafts the step holds
    (`draft_tokens`; without them, `k` per request), so that ``t0 + c_tok x draft tokens`` is the
    priced step with every draft verified. Nothing is fitted: it is `ready` from the start, has no
    R^2, and counts the steps it is shown (`samples`)."""

    ready = True    # nothing to fit: the profile's costs answer from the first step
    r2: float | None = None

    def __init__(self, profile: HardwareProfile, drafter: str, k: int, host_speed: float = 1.0):
        self.profile, self.drafter, self.k = profile, drafter, max(1, int(k))
        self.host_speed = check_host_speed(host_speed)
        d = profile.drafter(drafter)
        # the rule weighs verification and the host proposer: a model drafter's forwards are priced apart
        self.cost = profile.cost_model(drafter if d.kind == "list" else None)
        self.samples = 0

    def split(self, requests: int, ctx_sum: int, draft_tokens: float | None = None) -> tuple[float, float]:
        b = max(1, int(requests))
        tokens = float(self.k * b) if draft_tokens is None else float(draft_tokens)
        return self.cost.split(b, ctx_sum, tokens, self.host_speed)

    def add(self, requests: int, verified_tokens: int, ctx_sum: int, seconds: float, forwards: int = 0) -> None:
        self.samples += 1   # a step the rule saw; the profile's costs do not change with it

    def metrics(self) -> dict:
        return {"samples": self.samples, "priced_on": self.profile.name}

    def state_dict(self) -> dict:
        return {"samples": self.samples}   # the profile's costs are not learned: only the steps seen

    def load_state_dict(self, state: dict) -> None:
        self.samples = int(state["samples"])


class PricedHybridCost(PricedStepCost):
    """The step costs a proposer beside a model drafter weighs (`drafters/hybrid.py` `HybridProposer.cost`:
    ``split`` and ``forward_s``) from a hardware profile instead of the engine's online fit.
    ``split(requests, ctx_sum)`` is `PricedStepCost`'s on `step_entry` (the history part's entry:
    its proposer's host time is in t0; a model entry: none) with the model part's first draft
    forward added to t0, which the engine runs at every step (it writes the drafter's KV of the
    verified tokens); ``forward_s(requests, k)`` is the model part's k - 1 forwards after it, the
    ones a step may skip (both `CostModel.draft_forwards`). The forwards are priced at the context of
    the last ``split`` (the step's mean, as `CostModel.split` takes contexts), which the proposer calls
    first in every step."""

    def __init__(self, profile: HardwareProfile, step_entry: str, model_entry: str, k: int, host_speed: float = 1.0):
        super().__init__(profile, step_entry, k, host_speed)
        self.model_entry = model_entry
        self.model_cost = profile.cost_model(model_entry)
        self._ctx = 0.0

    def _forwards(self, requests: int, k: int) -> tuple[float, float]:
        return self.model_cost.draft_forwards(np.full(max(1, int(requests)), self._ctx), k)

    def split(self, requests: int, ctx_sum: int, draft_tokens: float | None = None) -> tuple[float, float]:
        t0, c_tok = super().split(requests, ctx_sum, draft_tokens)
        self._ctx = float(ctx_sum) / max(1, int(requests))
        return t0 + self._forwards(requests, 1)[0], c_tok

    def forward_s(self, requests: int, k: int) -> float:
        return self._forwards(requests, k)[1]


__all__ = ["BINS", "HOST_SPEEDS", "HOST_TERMS", "Priced", "PricedHybridCost", "PricedStepCost",
           "check_host_speed", "fit_proposer", "model_forward_s", "proposer_gap",
           "price", "proposer_share", "speedup", "step_costs", "step_of"]
