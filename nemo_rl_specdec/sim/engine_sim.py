"""One engine's continuous-batching decode, simulated event by event.

The engine admits released requests (oldest release first, then submission order) while it
has fewer than `max_num_seqs` in flight and its KV cache has room: a request holds its context
plus k lookahead slots for the drafts it verifies (`kv_capacity` tokens per engine, None for
unlimited), and is admitted only if every request in flight can still take one step. When the
contexts grow past the capacity, the newest request is preempted (vLLM's recompute mode): it
goes back to the head of the queue keeping what it has generated, and pays prompt plus
generated tokens as prefill when it is admitted again. Each step every active request verifies 1 + d_i
tokens and commits A_i(d_i) of them in expectation (its accepted drafts plus the bonus
token); a list drafter finds a match for a share `coverage` of request-steps, so a request
drafting d_i commits 1 + coverage * (A_i(d_i) - 1) and verifies 1 + coverage * d_i tokens; a request leaves
the batch when it has committed its response length, and the batch drains — the long tail, where few requests
are left and each step costs nearly c_base.

The simulation is a fluid (expected-value) model, advanced in jumps rather than step by step:
between two events — a request finishing, a request released, a pause (weight update), a
budget recomputation — every step has the same drafts and rates, so the engine advances
straight to the next event, with the step time growing linearly as contexts grow (see
`CostModel.step_cost` and `StepTime`). Step counts stay integers: a request that needs 7.2 steps' worth of
tokens finishes at the end of its 8th step.

Budgets: with speculation on, each request gets d_i = min(budget_i, k(batch size)): budget_i
from `scheduling.budget.assign_budgets` over the predicted remaining lengths of the requests
in flight (recomputed whenever the batch changes, and every `interval` steps), k(batch size)
from the `k_by_batch_size` schedule, or with `per_step` the d of `sim.best_drafts.best_drafts`
for the requests in flight (re-chosen at every event). Budget `adaptive` then cuts each d_i at
every event with the engine's own rule (`drafters.machinery.step_judge.draft_lengths`): gains from the
request's acceptance curve (and response-position factor, times the coverage), t0 from the cost
model, and the cost of a draft token as the secant of the step time between no drafts and the
drafts the caps allow (a linear rule priced at the point it decides about). With `auto_disable`
(other budgets) the same inputs go to `drafters.machinery.step_judge.drafts_pay`: the event keeps its drafts
or drafts nothing; the steps judged and turned off are counted by batch-size bin
(`EngineStats.judged_by_batch`, `off_by_batch`).

A hybrid drafter (`HybridHalves`: a history half with its coverage and acceptance by position, and
the model half whose acceptance is each request's A) decides at every event with the engine's own
rule, `drafters.machinery.hybrid_choice.choose`: history drafts only, or the model half's forwards
too, each request taking the better of its two drafts. A request stands for `replicas` requests,
round(coverage * replicas) of them with a history draft, so the choice sees the expected mix; the
request then commits and verifies the mean of its replicas. The step pays the target's
verification, the model half's forwards over every request, and the history proposer's host time
on every step. As in the engine (`drafters/hybrid.py`), the model half's first forward runs at
every step, where the rule skips the model half too (it writes the head's KV and hidden states of
the verified tokens, which later drafts attend to): a skipped step pays 1 model forward, a step
that runs the model half `model_k`, and the rule weighs only the `model_k` - 1 it can skip (the
first is in its t0).
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from nemo_rl_specdec.config.schema import schedule_lookup
from nemo_rl_specdec.cost.model import CostModel, Step
from nemo_rl_specdec.drafters.machinery.hybrid_choice import choose
from nemo_rl_specdec.drafters.machinery.step_judge import batch_bin, draft_lengths, drafts_pay
from nemo_rl_specdec.scheduling.budget import assign_budgets
from nemo_rl_specdec.sim.best_drafts import best_drafts


@dataclass(eq=False)
class SimRequest:
    rid: int
    batch: int
    problem_id: str
    length: int
    prompt_len: int
    A: np.ndarray                     # expected tokens committed per step with d = 0..k drafts
    start: float = math.nan
    finish: float = math.nan
    done: float = 0.0                 # tokens generated before a preemption
    preemptions: int = 0
    release: float = 0.0
    seq: int = 0


@dataclass
class SpecPolicy:
    k: int
    budget: str = "uniform"
    long_fraction: float = 0.25
    short_fraction: float = 0.25
    medium_k: int | None = None
    schedule: None | str | Sequence[Sequence[int]] = None   # [(lo, hi, k), ...] or "per_step"
    interval: int = 64
    acceptance: float | Sequence[float] = 0.7   # what the budget policy believes
    auto_disable: bool = False   # the engines' all-or-nothing rule (drafters/machinery/step_judge.drafts_pay) per event


@dataclass(frozen=True)
class HybridHalves:
    """The hybrid drafter's halves (module doc): the history half's acceptance of positions 1.. given a
    draft and its coverage (its proposer's host time is the engine's cost model's host term), and the
    model half's draft depth and cost model (whose draft term prices its forwards)."""

    history: tuple
    coverage: float
    model_k: int
    model_cost: CostModel
    replicas: int = 20


@dataclass
class EngineStats:
    steps: int = 0
    busy_s: float = 0.0
    verified_tokens: float = 0.0
    draft_tokens: float = 0.0
    committed_tokens: float = 0.0
    spec_request_steps: float = 0.0      # request-steps that had drafts
    spec_committed: float = 0.0          # tokens committed in those request-steps
    budget_recomputes: int = 0
    preemptions: int = 0
    busy: list = field(default_factory=list)   # merged [start, end] intervals with requests in flight
    adaptive_steps: list = field(default_factory=list)  # (requests, drafts chosen) per per_step / adaptive decision
    judged_by_batch: dict = field(default_factory=dict)  # auto_disable: steps judged, by batch-size bin
    off_by_batch: dict = field(default_factory=dict)     # auto_disable: steps it turned off, by batch-size bin
    hybrid_model_steps: int = 0                          # hybrid: steps that ran the model half's forwards
    hybrid_request_steps: dict = field(default_factory=dict)  # hybrid: request-steps by source (history, model, none)


class EngineSim:
    def __init__(self, engine_id: int, cost: CostModel, spec: SpecPolicy | None, max_num_seqs: int,
                 remaining: Callable[[SimRequest, float], float], kv_capacity: float | None = None,
                 coverage: float = 1.0, by_response_position: Sequence[Sequence[float]] | None = None,
                 hybrid: HybridHalves | None = None):
        self.engine_id = engine_id
        self.hybrid = hybrid if self.spec_on(spec) else None
        self._sources: dict = {}
        self.cost = cost
        self.spec = spec if (spec is not None and spec.k > 0) else None
        self.max_num_seqs = max_num_seqs
        self.remaining = remaining          # (request, generated so far) -> predicted tokens to go
        self.kv_capacity = math.inf if kv_capacity is None else float(kv_capacity)
        self.lookahead = self.spec.k if self.spec is not None else 0
        self.coverage = coverage
        # acceptance by response position: segment starts and their factors on the accepted drafts
        pts = np.asarray(by_response_position, dtype=float) if by_response_position else None
        self._pos_starts = None if pts is None else np.append(pts[:, 0], math.inf)
        self._pos_factors = None if pts is None else pts[:, 1]
        self.clock = 0.0
        self.stats = EngineStats()
        self._queue: list = []              # heap of (release, seq, request)
        self._seq = 0
        self._pauses: list = []             # heap of (start, duration)
        self._active: list[SimRequest] = []
        self._prog = np.zeros(0)
        self._ctx = np.zeros(0)
        self._len = np.zeros(0)
        self._A = np.zeros((0, 1))
        self._budget = np.zeros(0, dtype=int)
        self._dirty = True
        self._since = 0
        self._prefill = 0.0
        self._pending: dict[int, int] = {}
        self._last_finish: dict[int, float] = {}

    # ------------------------------------------------------------------ inputs
    def add(self, requests: Sequence[SimRequest], release: float) -> None:
        for r in requests:
            r.release, r.seq = release, self._seq
            heapq.heappush(self._queue, (release, self._seq, r))
            self._seq += 1
            self._pending[r.batch] = self._pending.get(r.batch, 0) + 1

    def add_pause(self, start: float, duration: float) -> None:
        if duration > 0:
            heapq.heappush(self._pauses, (start, duration))

    # ------------------------------------------------------------------ run
    def run_until_done(self, batch: int) -> float | None:
        """Simulate until every request of `batch` on this engine has finished; returns the
        finish time of its last request (None if the engine got none of the batch)."""
        while self._pending.get(batch, 0) > 0:
            self._apply_pauses()
            self._admit()
            if not self._active:
                if not self._queue:
                    raise RuntimeError(f"engine {self.engine_id}: batch {batch} pending but nothing queued")
                nxt = self._queue[0][0]
                if self._pauses:
                    nxt = min(nxt, self._pauses[0][0])
                self.clock = max(self.clock, nxt)
                continue
            self._advance()
        return self._last_finish.get(batch)

    def _apply_pauses(self) -> None:
        while self._pauses and self._pauses[0][0] <= self.clock + 1e-12:
            start, dur = heapq.heappop(self._pauses)
            self.clock = max(self.clock, start) + dur

    def _kv_used(self, extra: float = 0.0, n_extra: int = 0) -> float:
        """KV slots held (contexts + lookahead) plus one bonus slot per request for its next
        step, with `extra` tokens of `n_extra` more requests."""
        n = len(self._active) + n_extra
        return float(self._ctx.sum()) + extra + n * (self.lookahead + 1)

    def _admit(self) -> None:
        new: list[SimRequest] = []
        need = 0.0
        while (self._queue and self._queue[0][0] <= self.clock + 1e-12
               and len(self._active) + len(new) < self.max_num_seqs):
            r = self._queue[0][2]
            r_need = r.prompt_len + r.done
            if self._kv_used(need + r_need, len(new) + 1) > self.kv_capacity + 1e-9:
                if not self._active and not new:
                    raise RuntimeError(f"engine {self.engine_id}: a request of {r_need:.0f} context tokens does "
                                       f"not fit in kv_capacity={self.kv_capacity:.0f} tokens")
                break
            heapq.heappop(self._queue)
            if math.isnan(r.start):
                r.start = self.clock
            new.append(r)
            need += r_need
        if not new:
            return
        self._active += new
        self._prog = np.concatenate([self._prog, [float(r.done) for r in new]])
        self._ctx = np.concatenate([self._ctx, [float(r.prompt_len + r.done) for r in new]])
        self._len = np.concatenate([self._len, [float(r.length) for r in new]])
        self._A = (
            np.concatenate([self._A, np.stack([r.A for r in new])]) if len(self._A) else np.stack([r.A for r in new])
        )
        self._budget = np.concatenate([self._budget, np.zeros(len(new), dtype=int)])
        self._prefill += need
        self._dirty = True

    def _preempt(self) -> None:
        """Preempt the newest requests until every request in flight can take its next step."""
        while len(self._active) > 1 and self._kv_used() > self.kv_capacity + 1e-9:
            r = self._active.pop()
            r.done = float(self._prog[-1])
            r.preemptions += 1
            self.stats.preemptions += 1
            heapq.heappush(self._queue, (r.release, r.seq, r))
            self._prog, self._ctx, self._len = self._prog[:-1], self._ctx[:-1], self._len[:-1]
            self._A, self._budget = self._A[:-1], self._budget[:-1]
            self._dirty = True
        if self._kv_used() > self.kv_capacity + 1e-9:
            raise RuntimeError(f"engine {self.engine_id}: one request's context outgrows "
                               f"kv_capacity={self.kv_capacity:.0f} tokens")

    def _budgets(self) -> np.ndarray:
        sp = self.spec
        assert sp is not None   # budgets are recomputed only with speculation on
        n = len(self._active)
        if sp.budget == "uniform":
            return np.full(n, sp.k, dtype=int)
        rem = [self.remaining(r, float(g)) for r, g in zip(self._active, self._prog, strict=True)]
        c_base, c_tok, c_draft, c_ctx = self.cost.linearised(n, float(self._ctx.mean()))
        out = assign_budgets(
            rem, sp.k, sp.budget, long_fraction=sp.long_fraction, short_fraction=sp.short_fraction,
            medium_k=sp.medium_k, acceptance=sp.acceptance, c_base=c_base, c_tok=c_tok,
            c_draft=c_draft, c_req=c_ctx * self._ctx,
        )
        self.stats.budget_recomputes += 1
        return np.asarray(out, dtype=int)

    def _rule_inputs(self, cap: np.ndarray, factors: np.ndarray | None) -> tuple[list, float, float]:
        """(gains, t0, price of a draft token) of the engines' per-step rule this event (module doc);
        `factors`: each request's response-position factor, or None."""
        n = len(self._active)
        g = np.diff(self._A, axis=1)                   # acceptance of draft position j, unconditional
        if factors is not None:
            g = g * factors[:, None]
        c = self.coverage                              # a share c of request-steps has a draft to verify
        # the one cost function's split of the step (cost/model.py): t0 with the proposer's host time,
        # and a draft token's cost as the secant of the target forward to the drafts the caps allow
        t0, per_tok = self.cost.split(n, float(self._ctx.sum()), c * float(np.sum(cap)))
        return [c * g[i, :int(cap[i])] for i in range(n)], t0, c * per_tok

    def _adaptive(self, cap: np.ndarray, factors: np.ndarray | None) -> np.ndarray:
        """`budget: adaptive`: each request's drafts this event, at most `cap`."""
        return np.asarray(draft_lengths(*self._rule_inputs(cap, factors)), dtype=int)

    def _pays(self, d: np.ndarray, factors: np.ndarray | None) -> bool:
        """`auto_disable`: whether this event's drafts are worth their verification."""
        return drafts_pay(*self._rule_inputs(d, factors))

    @staticmethod
    def spec_on(spec: SpecPolicy | None) -> bool:
        return spec is not None and spec.k > 0

    def _hybrid_step(self) -> tuple[np.ndarray, np.ndarray, bool]:
        """(tokens committed per step, draft tokens verified per step, whether the model half runs) of
        every request this event, by `hybrid_choice.choose` (module doc)."""
        h, sp = self.hybrid, self.spec
        assert h is not None and sp is not None   # run only for a hybrid drafter, with speculation on
        k = sp.k
        n = len(self._active)
        M = h.replicas
        with_history = int(round(h.coverage * M))
        # the one cost function: the target with the history proposer (t0, the secant to k drafts a request)
        t0, c_tok = self.cost.split(n, float(self._ctx.sum()), float(n * k))
        # the model half's first forward runs at every step; the rule can skip the model_k - 1 after it
        first, forward = h.model_cost.draft_forwards(self._ctx, h.model_k)
        t0 += first
        g_model = np.diff(self._A, axis=1)[:, :h.model_k]
        g_hist = list(h.history[:k])
        same = bool(np.all(g_model == g_model[:1]))
        people = 1 if same else n   # identical requests: one stands for all (the ratio scales by n)
        hist_rows = [g_hist] * with_history + [[]] * (M - with_history)
        rows_h = hist_rows * people
        rows_m = [list(g_model[i]) for i in range(people) for _ in range(M)]
        scale = M / n if same else M
        c = choose(rows_h, rows_m, t0 * scale, c_tok, forward * scale, requests=people * M)
        gains = {"history": np.asarray(g_hist), "none": np.zeros(0)}
        committed, drafts = np.zeros(people), np.zeros(people)
        for r, (src, d) in enumerate(zip(c.source, c.lengths, strict=True)):
            i = r // M
            g = g_model[i] if src == "model" else gains[src]
            committed[i] += 1.0 + float(g[:d].sum())
            drafts[i] += d
        self._sources = {}   # this event's request-steps per step, by source
        for src in c.source:
            self._sources[src] = self._sources.get(src, 0.0) + (n / people) / M
        rate, d_eff = committed / M, drafts / M
        if same:
            rate, d_eff = np.full(n, rate[0]), np.full(n, d_eff[0])
        return rate, d_eff, c.run_model

    def _advance(self) -> None:
        self._preempt()
        n_act = len(self._active)
        sp = self.spec
        starts, by_factor = self._pos_starts, self._pos_factors
        factors = None   # each request's response-position factor
        if starts is not None and by_factor is not None and sp is not None:   # each request's segment
            seg = np.searchsorted(starts, self._prog, side="right") - 1
            factors = by_factor[seg]
        by_position = factors is not None
        judged = None  # auto_disable: the batch-size bin of this event, when the rule judged it
        if sp is None:
            d = np.zeros(n_act, dtype=int)
        else:
            if self._dirty or self._since >= sp.interval:
                self._budget = self._budgets()
                self._dirty, self._since = False, 0
            if sp.schedule == "per_step":    # adaptive verification (sim/best_drafts.py)
                cap = best_drafts(self.cost, self._ctx, self._A, sp.k, self.coverage)   # decode economics
                self.stats.adaptive_steps.append((n_act, cap))
            else:
                assert not isinstance(sp.schedule, str)   # sim/step.py resolves `auto` to a table
                cap = schedule_lookup(sp.schedule, n_act, sp.k)
            d = np.minimum(self._budget, cap)
            if sp.budget == "adaptive":
                d = self._adaptive(d, factors)
                self.stats.adaptive_steps.append((n_act, int(d.sum())))
            elif sp.auto_disable and d.any():
                judged = batch_bin(n_act)
                if not self._pays(d, factors):
                    d = np.zeros_like(d)
        idx = np.arange(n_act)
        run_model = False
        if self.hybrid is not None:   # the hybrid's rule sets every request's drafts and the model forward
            rate, d_eff, run_model = self._hybrid_step()
            a_draft, d = rate, (d_eff > 0).astype(int)
        else:
            a_draft = self._A[idx, d]                                 # committed per step when drafting
            if by_position:
                a_draft = 1.0 + np.minimum(d, factors * (a_draft - 1.0))
            rate = 1.0 + self.coverage * (a_draft - 1.0)
            d_eff = self.coverage * d
        if self.hybrid is None:
            cost = self.cost.step_cost(d_eff, self._ctx, rate, self._prefill)
        else:   # the target and the history proposer, and the model half's forwards (its first on every step)
            cost = self.cost.step_cost(d_eff, self._ctx, rate, self._prefill, proposer=bool(n_act))
            if n_act:
                forwards = self.hybrid.model_k if run_model else 1
                step = Step.of(self._ctx, d_eff, self._prefill, forwards=forwards, rate=rate)
                cost.add(self.hybrid.model_cost.parts(step)[1])

        left = self._len - self._prog
        n = int(np.min(np.ceil(left / rate - 1e-9)))
        if starts is not None and by_position:   # until a request enters its next segment
            to_next = float(np.min(np.ceil((starts[seg + 1] - self._prog) / rate - 1e-9)))
            if math.isfinite(to_next):
                n = min(n, max(1, int(to_next)))
        if self._prefill:
            n = 1
        if sp is not None and sp.budget != "uniform":
            n = min(n, sp.interval - self._since)
        if math.isfinite(self.kv_capacity):   # steps until the next one would not fit
            n = min(n, int((self.kv_capacity - self._kv_used()) // float(rate.sum())) + 1)
        ext = math.inf
        if self._queue and n_act < self.max_num_seqs:
            ext = self._queue[0][0]
        if self._pauses:
            ext = min(ext, self._pauses[0][0])
        if ext < math.inf and ext > self.clock:
            n = min(n, cost.steps_within(ext - self.clock))
        n = max(1, n)
        dt = cost.total(n)

        st = self.stats
        st.steps += n
        if self.hybrid is not None:
            st.hybrid_model_steps += n if run_model else 0
            for src, per_step in self._sources.items():
                st.hybrid_request_steps[src] = st.hybrid_request_steps.get(src, 0.0) + n * per_step
        if judged is not None:
            st.judged_by_batch[judged] = st.judged_by_batch.get(judged, 0) + n
            if not d.any():
                st.off_by_batch[judged] = st.off_by_batch.get(judged, 0) + n
        st.busy_s += dt
        st.verified_tokens += n * (n_act + float(d_eff.sum()))
        st.draft_tokens += n * float(d_eff.sum())
        drafting = d > 0
        committed = np.minimum(n * rate, left)
        st.committed_tokens += float(committed.sum())
        if drafting.any():
            steps_i = np.minimum(n, np.ceil(left / rate - 1e-9))
            share = self.coverage * a_draft / rate             # of committed tokens, from drafting steps
            st.spec_request_steps += float((self.coverage * steps_i)[drafting].sum())
            st.spec_committed += float((committed * share)[drafting].sum())
        if st.busy and abs(st.busy[-1][1] - self.clock) < 1e-12:
            st.busy[-1][1] = self.clock + dt
        else:
            st.busy.append([self.clock, self.clock + dt])

        self.clock += dt
        self._prog = self._prog + n * rate
        self._ctx = self._ctx + n * rate
        self._since += n
        self._prefill = 0.0
        done = self._prog >= self._len - 1e-9
        if done.any():
            keep = ~done
            for i in np.flatnonzero(done):
                r = self._active[i]
                r.finish = self.clock
                self._pending[r.batch] -= 1
                self._last_finish[r.batch] = self.clock
            self._active = [r for r, k in zip(self._active, keep, strict=True) if k]
            self._prog, self._ctx, self._len = self._prog[keep], self._ctx[keep], self._len[keep]
            self._A, self._budget = self._A[keep], self._budget[keep]
            self._dirty = True
