"""Time of one engine step, target verification plus drafting.

Two forms of the target forward, chosen by the scenario's `hardware` block:

- **linear** (the DAS cost model plus KV reads):

      t_target = c_base + c_seq * requests + c_tok * tokens + c_ctx * sum_i ctx_i

- **roofline** (from the model's shape and the GPU's data sheet):

      t_target = max(bytes / bandwidth, flops / peak) + overhead + per_seq * requests
                 [+ eager] [+ all-reduce]
      bytes    = weights + expert bytes touched + kv_bytes_per_token * sum_i ctx_i
      flops    = flops_per_token * padded(tokens) + attn_flops_per_ctx * sum_i (1 + d_i) * ctx_i

  A step of n tokens in a mixture-of-experts layer with E experts, a of them active per token,
  touches E * (1 - (1 - a/E)**n) experts in expectation (each expert is missed by one token
  with probability 1 - a/E); their bytes are read once per step. The draft tokens a request
  verifies are consecutive tokens of one sequence, whose routing overlaps: with
  `expert_correlation` rho each draft token counts as 1 - rho independent tokens there. `padded(tokens)` rounds up to
  the next CUDA-graph capture size (`capture_sizes`); past the largest one the step runs
  eagerly and pays `eager_overhead_s`. With tensor parallelism over tp GPUs the bytes and
  flops are split tp ways and every layer does two ring all-reduces of the step's
  activations: 2 * layers * (latency + 2 (tp-1)/tp * tokens * hidden * act_bytes / link_bw).
  `per_seq` is host time per request in the step (scheduling, input preparation, sampling).

Here tokens = verified tokens (1 + d_i per request) + prefill tokens, and ctx_i is request i's
context (prompt + generated so far): the KV cache is read once per request per step however
many tokens are verified, which is why speculation pays off most while a step is memory-bound.

Drafting, when any request drafts (d_i > 0), by drafter kind:

- model (eagle3, mtp, draft_model): max_i d_i sequential forwards of the drafter, each over
  the drafting requests' tokens (one per request) and their contexts;
- block (dflash, dspark): one forward over all sum_i d_i draft positions at once;
- list (suffix, ngram): host time per drafting request, no forward;

plus, for every kind, `step_overhead_s` per speculative step (rejection sampling, and for list
drafters the device-to-host sync of the sampled tokens) and the linear terms
`fwd_base_s * forwards + tok_s * sum d_i + ctx_s * sum_i ctx_i d_i + per_request_s * #drafting`.
A drafter forward uses the roofline of its own `drafter.model` shape when one is given.

Contexts grow between steps, so `step_cost` returns a `StepTime`: the current step's time as
a constant, a linear growth per step, and maxima of two growing lines (the roofline's memory
and compute sides). `StepTime.total(n)` sums n consecutive steps exactly.

`CostModel.step_cost` is the one step-cost function: pricing (`cost/price.py`), the simulator, the
per-step rules, `best_drafts` and the scheduling bound all call it with a step's description
(`Step`: each decode request's context and drafts, the prefill tokens, the draft forwards it ran
and whether a history proposer ran). `CostModel.cost(step)` gives the same time in its three
terms (`StepCost`: target, draft forwards, host proposer); `CostModel.split` the per-step rules'
linear view of it (`drafters/machinery/step_judge.py`); `CostModel.draft_forwards` a model
drafter's forwards split into the first (run at every step) and the rest (a step may skip them);
`CostModel.request_s` one request's share of a step of the linear form (the DAS budgets).

The host term (a history proposer's CPU time: ``spec_step_overhead + draft_per_request x
requests`` for a list drafter) was measured on one host; ``host_speed`` (the host's speed relative
to the one the constants were fitted on) divides it, and only it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np


def vllm_capture_sizes(max_capture_size: int = 512) -> tuple[int, ...]:
    """CUDA-graph capture sizes as in vLLM's defaults: 1, 2, 4, then every multiple of 8 below
    256, then every multiple of 16 from 256 up to `max_capture_size`."""
    sizes = [1, 2, 4] + list(range(8, min(256, max_capture_size + 1), 8))
    sizes += list(range(256, max_capture_size + 1, 16))
    return tuple(s for s in sizes if s <= max_capture_size)


@dataclass(frozen=True)
class ModelShape:
    """What one forward of a model reads and computes (per engine, before the tp split)."""

    weight_bytes: float                 # read by every forward (for MoE: everything but the experts)
    flops_per_token: float              # 2 x active parameters
    kv_bytes_per_token: float = 0.0     # KV cache per context token
    attn_flops_per_ctx: float = 0.0     # attention FLOPs per (query token, context token)
    num_layers: int = 0
    hidden_size: int = 0
    activation_bytes: int = 2
    num_experts: int = 0
    active_experts: int = 0
    expert_bytes: float = 0.0           # all experts' bytes, all layers
    expert_correlation: float = 0.0     # routing overlap of a request's consecutive draft tokens

    def experts_touched_fraction(self, tokens: float) -> float:
        """Expected share of experts read by a step of `tokens` tokens: 1 - (1 - a/E)**n."""
        if not self.num_experts or tokens <= 0:
            return 0.0
        return 1.0 - (1.0 - self.active_experts / self.num_experts) ** tokens

    @property
    def total_weight_bytes(self) -> float:
        return self.weight_bytes + self.expert_bytes


@dataclass(frozen=True)
class Roofline:
    """One engine's GPUs: effective bandwidth and FLOP rate per GPU, fixed overhead per
    forward, tensor-parallel degree and link, and the CUDA-graph capture sizes."""

    mem_bw_Bps: float
    flops_per_s: float
    overhead_s: float = 0.0
    tp: int = 1
    allreduce_bw_Bps: float = math.inf
    allreduce_latency_s: float = 0.0
    capture_sizes: tuple[int, ...] = ()
    eager_overhead_s: float = 0.0
    overhead_per_seq_s: float = 0.0

    def padded(self, tokens: float) -> tuple[float, bool]:
        """(tokens the forward computes, whether it runs eagerly)."""
        if not self.capture_sizes:
            return tokens, False
        i = int(np.searchsorted(self.capture_sizes, tokens - 1e-9))
        if i >= len(self.capture_sizes):
            return tokens, True
        return float(self.capture_sizes[i]), False

    def forward(self, shape: ModelShape, tokens: float, ctx_sum: float, ctx_growth: float,
                attn_ctx: float, attn_growth: float, draft_tokens: float = 0.0,
                overhead: bool = True) -> tuple[float, tuple[float, float, float, float]]:
        """(constant part, (mem0, mem_slope, flop0, flop_slope)) of one forward of `tokens`
        tokens, `draft_tokens` of them drafts: its time at the j-th following step is
        const + max(mem0 + mem_slope j, flop0 + flop_slope j). `overhead=False` leaves out
        the engine step's fixed overhead (a drafter forward has its own, fwd_base_s)."""
        n, eager = self.padded(tokens)
        bw = self.mem_bw_Bps * self.tp
        fl = self.flops_per_s * self.tp
        routed = tokens - shape.expert_correlation * draft_tokens
        byts = shape.weight_bytes + shape.expert_bytes * shape.experts_touched_fraction(routed)
        mem0 = (byts + shape.kv_bytes_per_token * ctx_sum) / bw
        mem1 = shape.kv_bytes_per_token * ctx_growth / bw
        flop0 = (shape.flops_per_token * n + shape.attn_flops_per_ctx * attn_ctx) / fl
        flop1 = shape.attn_flops_per_ctx * attn_growth / fl
        const = (self.overhead_s if overhead else 0.0) + (self.eager_overhead_s if eager else 0.0)
        if self.tp > 1 and shape.num_layers:
            msg = tokens * shape.hidden_size * shape.activation_bytes
            const += 2 * shape.num_layers * (self.allreduce_latency_s
                                             + 2 * (self.tp - 1) / self.tp * msg / self.allreduce_bw_Bps)
        return const, (mem0, mem1, flop0, flop1)


def _line_sum(c0: float, c1: float, lo: int, hi: int) -> float:
    """sum_{j=lo}^{hi-1} (c0 + c1 j)."""
    if hi <= lo:
        return 0.0
    return (hi - lo) * c0 + c1 * (hi * (hi - 1) - lo * (lo - 1)) / 2.0


@dataclass
class StepTime:
    """Time of the j-th of a run of identical steps: t0 + slope j + sum of max(a, b) lines."""

    t0: float
    slope: float = 0.0
    maxes: list = field(default_factory=list)     # (a0, a1, b0, b1)

    def add(self, other: StepTime) -> StepTime:
        """This time plus `other`'s (in place)."""
        self.t0 += other.t0
        self.slope += other.slope
        self.maxes += other.maxes
        return self

    def at(self, j: int) -> float:
        return self.t0 + self.slope * j + sum(max(a0 + a1 * j, b0 + b1 * j) for a0, a1, b0, b1 in self.maxes)

    def total(self, n: int) -> float:
        """Time of n consecutive steps (exact for the piecewise-linear maxima)."""
        out = _line_sum(self.t0, self.slope, 0, n)
        for a0, a1, b0, b1 in self.maxes:
            d0, d1 = a0 - b0, a1 - b1            # a wins where d0 + d1 j >= 0
            if d1 == 0:
                out += _line_sum(a0, a1, 0, n) if d0 >= 0 else _line_sum(b0, b1, 0, n)
                continue
            q = -d0 / d1                         # may overflow to +-inf when d1 is tiny
            m = n if q >= n else 0 if q <= 0 else int(math.ceil(q))
            first, second = ((b0, b1), (a0, a1)) if d1 > 0 else ((a0, a1), (b0, b1))
            out += _line_sum(*first, 0, m) + _line_sum(*second, m, n)
        return out

    def steps_within(self, budget_s: float) -> int:
        """The smallest n >= 1 whose n steps take at least `budget_s` (the n-th step is the
        first to end at or after that moment)."""
        if budget_s <= self.at(0):
            return 1
        lo, hi = 1, 2
        while self.total(hi) < budget_s:
            lo, hi = hi, hi * 2
        while hi - lo > 1:                       # total(lo) < budget <= total(hi)
            mid = (lo + hi) // 2
            if self.total(mid) < budget_s:
                lo = mid
            else:
                hi = mid
        return hi


# the linear form's terms (CostModel fields) and their columns: a step's time is `linear_columns(...) @ coef`
LINEAR_TERMS = ("c_base", "c_seq", "c_tok", "c_ctx", "draft_fwd_base", "draft_fwd_seq")


def linear_columns(requests, verified_tokens, ctx_sum, forwards=0.0) -> np.ndarray:
    """The linear form's columns (`LINEAR_TERMS` order) of a step of `requests` decode requests that
    processes `verified_tokens` tokens over summed context `ctx_sum` and runs `forwards` draft
    forwards over its requests; arrays broadcast (a grid of steps)."""
    n, tok, ctx, f = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in
                                           (requests, verified_tokens, ctx_sum, forwards)))
    return np.stack([np.ones_like(n), n, tok, ctx, f, f * n], axis=-1)


@dataclass(frozen=True)
class Step:
    """A step's description, what `CostModel` prices: each decode request's context before the step
    and the draft tokens it verifies (fractional: expected drafts), the prompt tokens prefilled in
    the same forward, the draft forwards the step ran (None: a model drafter runs as many as its
    longest draft, over the requests that draft; a block drafter one over every draft position;
    counted forwards run over every request), whether a history proposer ran for its requests
    (None: when any request drafts), and each request's context growth per step (the simulator's
    runs of identical steps; None: none)."""

    ctx: np.ndarray
    drafts: np.ndarray
    prefill_tokens: float = 0.0
    forwards: float | None = None
    proposer: bool | None = None
    rate: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @classmethod
    def of(cls, ctx, drafts, prefill_tokens: float = 0.0, forwards: float | None = None,
           proposer: bool | None = None, rate=None) -> Step:
        c = np.asarray(ctx, dtype=float)
        d = np.asarray(drafts, dtype=float)
        if c.shape != d.shape:
            raise ValueError(f"drafts: {d.size} entries for {c.size} requests; allowed: one per request")
        r = np.zeros(c.size) if rate is None else np.asarray(rate, dtype=float)
        return cls(c, d, float(prefill_tokens), forwards, proposer, r)


@dataclass(frozen=True)
class StepCost:
    """One step's time in its three terms: the target forward, the draft side (a model or block
    drafter's forwards, a speculative step's fixed cost) and the host proposer (a history drafter's
    CPU time, at the host speed it was asked for)."""

    target_s: float
    draft_s: float
    proposer_s: float

    @property
    def total_s(self) -> float:
        return self.target_s + self.draft_s + self.proposer_s


@dataclass(frozen=True)
class CostModel:
    c_base: float = 0.0
    c_tok: float = 0.0
    c_ctx: float = 0.0
    draft_fwd_base: float = 0.0
    draft_tok: float = 0.0
    draft_ctx: float = 0.0
    draft_per_request: float = 0.0
    spec_step_overhead: float = 0.0
    draft_kind: str = "list"                     # list | model | block
    roofline: Roofline | None = None
    target: ModelShape | None = None
    draft_shape: ModelShape | None = None
    c_seq: float = 0.0                           # linear form: cost per request in the step
    draft_fwd_seq: float = 0.0                   # cost per request per draft forward

    @classmethod
    def from_linear(cls, coef, draft_kind: str = "model") -> CostModel:
        """The linear form with the constants `coef` (`LINEAR_TERMS` order; the draft terms may be
        left out), as the engine's online fit gives them."""
        values: dict[str, Any] = dict(zip(LINEAR_TERMS, (float(c) for c in coef), strict=False))
        return cls(draft_kind=draft_kind, **values)

    def without_drafter(self) -> CostModel:
        """The same target with no drafter: no draft forwards (nor the draft's prefill), no proposer."""
        return replace(self, draft_kind="list", draft_fwd_base=0.0, draft_tok=0.0, draft_ctx=0.0,
                       draft_per_request=0.0, spec_step_overhead=0.0, draft_shape=None, draft_fwd_seq=0.0)

    @property
    def linear_coef(self) -> np.ndarray:
        return np.asarray([getattr(self, t) for t in LINEAR_TERMS], dtype=float)

    @classmethod
    def from_scenario(cls, sc) -> CostModel:
        hw, dr = sc.hardware, sc.drafter
        roof = hw.roofline_model()
        return cls(hw.c_base_s or 0.0, hw.c_tok_s or 0.0, hw.c_ctx_s, dr.fwd_base_s, dr.tok_s, dr.ctx_s,
                   dr.per_request_s, dr.step_overhead_s, dr.kind, roof,
                   sc.model.shape() if (roof is not None and sc.model is not None) else None,
                   dr.model.shape() if (roof is not None and dr.model is not None) else None,
                   hw.c_seq_s)

    def step_cost(self, drafts: np.ndarray, ctx: np.ndarray, rate: np.ndarray | None = None,
                  prefill_tokens: float = 0.0, forwards: float | None = None, proposer: bool | None = None,
                  host_speed: float = 1.0) -> StepTime:
        """This step's time and its growth over the following identical steps (contexts grow
        by `rate` tokens per step). drafts, ctx, rate: one entry per request; drafts may be
        fractional (a list drafter's expected drafts when it finds a match only sometimes).
        `forwards`: the draft forwards the step ran (None: the drafter kind's own count, see
        `Step`); `proposer`: whether a history proposer ran for the step's requests (None: when
        any request drafts); `host_speed`: the host's speed relative to the one the proposer's
        constants were measured on."""
        target, draft, host = self.parts(Step.of(ctx, drafts, prefill_tokens, forwards, proposer, rate), host_speed)
        target.add(draft)
        target.t0 += host
        return target

    def cost(self, step: Step, host_speed: float = 1.0) -> StepCost:
        """`step`'s time now, in its three terms (module doc); their sum is `step_cost(...).at(0)`."""
        target, draft, host = self.parts(step, host_speed)
        return StepCost(target.at(0), draft.at(0), host)

    def parts(self, step: Step, host_speed: float = 1.0) -> tuple[StepTime, StepTime, float]:
        """(target forward, draft side, host proposer) of `step`."""
        if not host_speed > 0:
            raise ValueError(f"host_speed: {host_speed!r}; allowed: a number > 0 (the host's speed relative to the "
                             "one the proposer's constants were measured on)")
        drafts, ctx, rate = step.drafts, step.ctx, step.rate
        n = len(drafts)
        d_sum = float(np.sum(drafts))
        tokens = n + d_sum + step.prefill_tokens
        ctx_sum, growth = float(np.sum(ctx)), float(np.sum(rate))
        target = StepTime(0.0)
        if self.roofline is not None:
            assert self.target is not None, "a roofline prices the target from its shape"
            w = 1.0 + drafts
            const, lines = self.roofline.forward(self.target, tokens, ctx_sum, growth,
                                                 float(ctx @ w), float(rate @ w), draft_tokens=d_sum)
            target.t0 += const + self.roofline.overhead_per_seq_s * n
            target.maxes.append(lines)
        else:
            target.t0 += float(linear_columns(n, tokens, ctx_sum) @ self.linear_coef)
            target.slope += self.c_ctx * growth
        draft, host = StepTime(0.0), 0.0
        drafting = bool(n and np.max(drafts) > 0)
        if self.draft_kind == "list":
            ran = drafting if step.proposer is None else step.proposer
            if ran and n:
                host = (self.spec_step_overhead + self.draft_per_request * n) / host_speed
            if drafting:
                draft.t0 += self.draft_tok * d_sum + self.draft_ctx * float(ctx @ drafts)
                draft.slope += self.draft_ctx * float(rate @ drafts)
        elif drafting or step.forwards or step.prefill_tokens > 0:
            self._add_drafting(draft, step)
        return target, draft, host

    def _add_drafting(self, st: StepTime, step: Step) -> None:
        """A model or block drafter's side of `step`: its forwards on the roofline of its shape, plus
        the linear terms (module doc). A model drafter's first forward runs over every target token of
        the step (each decode request's verified tokens and the prefilled prompt tokens: vLLM's
        EAGLE/MTP proposer feeds it the target's hidden states of all of them), the later ones over one
        token per drafting request; a block drafter's one forward over every draft position and the
        prefilled tokens. A step that prefills runs the draft's forward over the prompt even when no
        request drafts (the draft's own KV of the prompt)."""
        drafts, ctx, rate = step.drafts, step.ctx, step.rate
        on = drafts > 0
        n, n_on, d_sum = len(drafts), int(np.count_nonzero(on)), float(np.sum(drafts))
        prefill = float(step.prefill_tokens)
        first = None   # (tokens, ctx_sum, ctx growth, attention ctx, its growth) of a model drafter's first forward
        if self.draft_kind == "model":
            if step.forwards is None:
                forwards = float(math.ceil(np.max(drafts) - 1e-9)) if n else 0.0
                forwards = max(forwards, 1.0 if prefill > 0 else 0.0)
            else:
                forwards = float(step.forwards)
                on, n_on = np.ones(n, dtype=bool), n   # counted forwards run over every request of the step
            tokens_each = float(n_on)
            w = 1.0 + drafts
            first = (n + d_sum + prefill, float(ctx.sum()), float(rate.sum()), float(ctx @ w), float(rate @ w))
        else:
            if step.forwards is None:
                forwards = 1.0 if d_sum > 0 or prefill > 0 else 0.0
                tokens_each = d_sum + prefill
            else:
                forwards = float(min(1, step.forwards))
                tokens_each = float(step.forwards) * n + prefill
        spec = self.spec_step_overhead if d_sum > 0 else 0.0
        st.t0 += (spec + self.draft_fwd_base * forwards + self.draft_fwd_seq * forwards * n_on
                  + self.draft_tok * d_sum + self.draft_ctx * float(ctx @ drafts))
        st.slope += self.draft_ctx * float(rate @ drafts)
        if not forwards or self.roofline is None or self.draft_shape is None:
            return
        c_on, r_on = float(ctx[on].sum()), float(rate[on].sum())
        rest = forwards
        if first is not None:
            const, lines = self.roofline.forward(self.draft_shape, *first, overhead=False)
            st.t0 += const
            st.maxes.append(lines)
            rest -= 1.0
        if rest and tokens_each:
            const, (m0, m1, f0, f1) = self.roofline.forward(self.draft_shape, tokens_each, c_on, r_on,
                                                            c_on * tokens_each / max(1, n_on),
                                                            r_on * tokens_each / max(1, n_on), overhead=False)
            st.t0 += rest * const
            st.maxes.append((rest * m0, rest * m1, rest * f0, rest * f1))

    def split(self, requests: int, ctx_sum: float, draft_tokens: float, host_speed: float = 1.0) -> tuple[float, float]:
        """The per-step rules' view of a decode step of `requests` requests at summed context `ctx_sum`
        whose drafts hold `draft_tokens` tokens: (t0, c_tok), the step without drafts (the history
        proposer's host time included: it runs either way) and the cost of one verified draft token,
        the secant of the target forward from no drafts to those tokens, so that t0 + c_tok x
        draft_tokens is this function's price of the step with every draft verified (contexts taken
        alike: the rule sees the step's sums). A model drafter's own forwards are not in it: the
        rules that weigh them price them with `cost` (`forwards`)."""
        b = max(1, int(requests))
        ctx = np.full(b, float(ctx_sum) / b)
        t0 = self.cost(Step.of(ctx, np.zeros(b), proposer=True), host_speed)
        if not draft_tokens > 0:
            return t0.target_s + t0.proposer_s, 0.0
        tk = self.cost(Step.of(ctx, np.full(b, float(draft_tokens) / b), proposer=True), host_speed)
        return t0.target_s + t0.proposer_s, max(0.0, tk.target_s - t0.target_s) / float(draft_tokens)

    def draft_forwards(self, ctx, k: int) -> tuple[float, float]:
        """A model drafter's forwards in a step of requests at contexts `ctx` that drafts `k` tokens each,
        split as the hybrid's rule weighs them: (the first, which the engine runs at every step, since it
        writes the drafter's KV of the step's verified tokens; the k - 1 after it, which a step may
        skip). Both are this function's draft term (`cost`), the first of a step of one forward and
        a draft token each, the rest the step of k forwards less that first."""
        c = np.asarray(ctx, dtype=float)
        first = self.cost(Step.of(c, np.ones(c.size), forwards=1)).draft_s
        return first, self.cost(Step.of(c, np.full(c.size, float(k)), forwards=k)).draft_s - first

    def request_s(self, drafts, ctx) -> np.ndarray:
        """What one decode request adds to a step of the linear form with a list drafter, for a grid of
        draft tokens and contexts (arrays broadcast): its verified tokens (1 + d), its context and its
        draft tokens; the step's fixed cost (c_base) is not in it. It is `cost(Step.of([ctx], [d]))`'s
        total at c_base = 0 and no host term, all grid points at once: the budget policies that
        separate a step over its requests price with it (`scheduling/budget.py` `das_budgets`)."""
        if self.roofline is not None or self.draft_kind != "list" or self.draft_per_request \
                or self.spec_step_overhead:
            raise ValueError("request_s: a request's share of a step is the linear form's, with a list drafter "
                             "and no host term (roofline, draft_kind, draft_per_request, spec_step_overhead)")
        d, c = np.broadcast_arrays(np.asarray(drafts, dtype=float), np.asarray(ctx, dtype=float))
        out = linear_columns(1.0, 1.0 + d, c) @ replace(self, c_base=0.0).linear_coef + self.draft_tok * d
        return out + self.draft_ctx * c * d if self.draft_ctx else out

    def mean_step_time(self, batch: int, drafts: float, ctx: float) -> float:
        """Time of one step of `batch` requests each drafting `drafts` tokens at context `ctx`
        (used to choose k by batch size and per-request budgets)."""
        if batch < 1:
            return 0.0
        d = np.full(batch, float(drafts))
        return self.step_cost(d, np.full(batch, float(ctx)), np.zeros(batch)).at(0)

    def linearised(self, batch: int, ctx: float) -> tuple[float, float, float, float]:
        """(c_base, c_tok, c_draft per draft token, c_ctx per context token) of this model
        around `batch` requests at context `ctx`: finite differences of `mean_step_time`, for
        the budget policies that take a linear cost model."""
        if self.roofline is None:
            return (self.c_base + self.c_seq * max(1, batch), self.c_tok, self.draft_tok + self.draft_ctx * ctx,
                    self.c_ctx)
        b = max(1, batch)
        t1 = self.mean_step_time(b, 0.0, ctx)
        t2 = self.mean_step_time(b, 1.0, ctx)
        c_ctx = max(0.0, (self.mean_step_time(b, 0.0, 2 * ctx + 1) - t1) / (b * (ctx + 1)))
        # one more request costs a token and a read of its context; c_tok is the token alone
        c_tok = max(0.0, (self.mean_step_time(2 * b, 0.0, ctx) - t1) / b - c_ctx * ctx)
        c_draft = max(0.0, (t2 - t1) / b - c_tok)
        return max(1e-12, t1 - c_tok * b - c_ctx * b * ctx), c_tok, c_draft, c_ctx


__all__ = ["LINEAR_TERMS", "CostModel", "ModelShape", "Roofline", "Step", "StepCost", "StepTime",
           "linear_columns", "vllm_capture_sizes"]
