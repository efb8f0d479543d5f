"""One engine's continuous-batching decode, simulated event by event.

The engine admits released requests (oldest release first, then submission order) while it
has fewer than `max_num_seqs` in flight; each step every active request verifies 1 + d_i
tokens and commits A_i(d_i) of them in expectation (its accepted drafts plus the bonus
token); a request leaves the batch when it has committed its response length, and the batch
drains — the long tail, where few requests are left and each step costs nearly c_base.

The simulation is a fluid (expected-value) model, advanced in jumps rather than step by step:
between two events — a request finishing, a request released, a pause (weight update), a
budget recomputation — every step has the same drafts and rates, so the engine advances
straight to the next event, with the step time growing linearly as contexts grow (see
`CostModel.step_cost`). Step counts stay integers: a request that needs 7.2 steps' worth of
tokens finishes at the end of its 8th step.

Budgets: with speculation on, each request gets d_i = min(budget_i, k(batch size)): budget_i
from `scheduling.budget.assign_budgets` over the predicted remaining lengths of the requests
in flight (recomputed whenever the batch changes, and every `interval` steps), k(batch size)
from the `k_by_batch_size` schedule.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

import numpy as np

from nemo_rl_specdec.scheduling.budget import assign_budgets, schedule_lookup
from nemo_rl_specdec.sim.costmodel import CostModel


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


@dataclass
class SpecPolicy:
    k: int
    budget: str = "uniform"
    long_fraction: float = 0.25
    short_fraction: float = 0.25
    medium_k: Optional[int] = None
    schedule: Optional[Sequence[Sequence[int]]] = None
    interval: int = 64
    acceptance: Union[float, Sequence[float]] = 0.7   # what the budget policy believes


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
    busy: list = field(default_factory=list)   # merged [start, end] intervals with requests in flight


class EngineSim:
    def __init__(self, engine_id: int, cost: CostModel, spec: Optional[SpecPolicy], max_num_seqs: int,
                 remaining: Callable[[SimRequest, float], float]):
        self.engine_id = engine_id
        self.cost = cost
        self.spec = spec if (spec is not None and spec.k > 0) else None
        self.max_num_seqs = max_num_seqs
        self.remaining = remaining          # (request, generated so far) -> predicted tokens to go
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
            heapq.heappush(self._queue, (release, self._seq, r))
            self._seq += 1
            self._pending[r.batch] = self._pending.get(r.batch, 0) + 1

    def add_pause(self, start: float, duration: float) -> None:
        if duration > 0:
            heapq.heappush(self._pauses, (start, duration))

    # ------------------------------------------------------------------ run
    def run_until_done(self, batch: int) -> Optional[float]:
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

    def _admit(self) -> None:
        new = []
        while (self._queue and self._queue[0][0] <= self.clock + 1e-12
               and len(self._active) + len(new) < self.max_num_seqs):
            _, _, r = heapq.heappop(self._queue)
            r.start = self.clock
            new.append(r)
        if not new:
            return
        self._active += new
        self._prog = np.concatenate([self._prog, np.zeros(len(new))])
        self._ctx = np.concatenate([self._ctx, [float(r.prompt_len) for r in new]])
        self._len = np.concatenate([self._len, [float(r.length) for r in new]])
        self._A = np.concatenate([self._A, np.stack([r.A for r in new])]) if len(self._A) else np.stack([r.A for r in new])
        self._budget = np.concatenate([self._budget, np.zeros(len(new), dtype=int)])
        self._prefill += sum(r.prompt_len for r in new)
        self._dirty = True

    def _budgets(self) -> np.ndarray:
        sp = self.spec
        n = len(self._active)
        if sp.budget == "uniform":
            return np.full(n, sp.k, dtype=int)
        rem = [self.remaining(r, float(g)) for r, g in zip(self._active, self._prog)]
        c = self.cost
        out = assign_budgets(
            rem, sp.k, sp.budget, long_fraction=sp.long_fraction, short_fraction=sp.short_fraction,
            medium_k=sp.medium_k, acceptance=sp.acceptance, c_base=c.c_base, c_tok=c.c_tok,
            c_draft=c.draft_tok + c.draft_ctx * float(self._ctx.mean()), c_req=c.c_ctx * self._ctx,
        )
        self.stats.budget_recomputes += 1
        return np.asarray(out, dtype=int)

    def _advance(self) -> None:
        n_act = len(self._active)
        sp = self.spec
        if sp is None:
            d = np.zeros(n_act, dtype=int)
        else:
            if self._dirty or self._since >= sp.interval:
                self._budget = self._budgets()
                self._dirty, self._since = False, 0
            d = np.minimum(self._budget, schedule_lookup(sp.schedule, n_act, sp.k))
        rate = self._A[np.arange(n_act), d]
        t0, slope = self.cost.step_cost(d, self._ctx, rate, self._prefill)

        left = self._len - self._prog
        n = int(np.min(np.ceil(left / rate - 1e-9)))
        if self._prefill:
            n = 1
        if sp is not None and sp.budget != "uniform":
            n = min(n, sp.interval - self._since)
        ext = math.inf
        if self._queue and n_act < self.max_num_seqs:
            ext = self._queue[0][0]
        if self._pauses:
            ext = min(ext, self._pauses[0][0])
        if ext < math.inf and ext > self.clock:
            n = min(n, CostModel.steps_within(ext - self.clock, t0, slope))
        n = max(1, n)
        dt = CostModel.time_of_steps(n, t0, slope)

        st = self.stats
        st.steps += n
        st.busy_s += dt
        st.verified_tokens += n * (n_act + float(d.sum()))
        st.draft_tokens += n * float(d.sum())
        drafting = d > 0
        committed = np.minimum(n * rate, left)
        st.committed_tokens += float(committed.sum())
        if drafting.any():
            st.spec_request_steps += float(np.minimum(n, np.ceil(left / rate - 1e-9))[drafting].sum())
            st.spec_committed += float(committed[drafting].sum())
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
            self._active = [r for r, k in zip(self._active, keep) if k]
            self._prog, self._ctx, self._len = self._prog[keep], self._ctx[keep], self._len[keep]
            self._A, self._budget = self._A[keep], self._budget[keep]
            self._dirty = True
