"""An in-process engine's steps as a `Trace` (`cost/trace.py`): what each step verified, prefilled and
accepted, and the proposer's thread time, read from vLLM's own scheduler and drafter.

`StepTracer(llm)` wraps three methods of one in-process engine (`VLLM_ENABLE_V1_MULTIPROCESSING=0`,
the uni executor), each on its instance only:

- the scheduler's ``schedule``: before it runs, every request's computed tokens; after, the step's
  requests (``num_scheduled_tokens``) and the drafts scheduled for verification
  (``scheduled_spec_decode_tokens``). A request whose computed tokens were short of its prompt is
  prefilled (its chunk counts as prefill tokens; the step that ends its prompt samples its first
  token); the others decode, from the context they had;
- the scheduler's ``update_from_output``: the tokens each request appended in the step (its
  output length before and after, so tokens dropped at a stop are not counted), matched to the
  step by its scheduler output, also when vLLM's async scheduling hands outputs back a step late;
- the model runner's drafter's ``propose`` (when there is one): its thread time, charged to the
  step it ran in; with a proposer of ours beside the model's (``vllm_compat.draft_beside``), its
  ``propose`` instead: the host time it reports (its own work, not the model's forwards) and the
  model's draft forwards it ran (k, or 1 on a step that skipped the draft forwards: the KV forward
  still runs).

`take(...)` returns the steps since the last `take` as a Trace with ``source: engine``.
"""
from __future__ import annotations

import threading
import time

from nemo_rl_specdec.cost.trace import Trace, TraceStep
from nemo_rl_specdec.engine.vllm_compat import beside_proposer


class StepTracer:
    def __init__(self, llm):
        core = llm.llm_engine.engine_core.engine_core
        self.scheduler = core.scheduler
        self._steps: list = []
        # id(scheduler output) -> (TraceStep, decode rows {rid: index}, requests, their outputs before)
        self._open: dict = {}
        self._proposer_s = 0.0
        self._forwards = 0
        self._ids: dict = {}   # vLLM request id -> the trace's (first seen, first numbered)
        self._lock = threading.Lock()
        sched = self.scheduler
        schedule, update = sched.schedule, sched.update_from_output

        def traced_schedule(*args, **kwargs):
            before = {rid: (r.num_computed_tokens, r.num_prompt_tokens) for rid, r in sched.requests.items()}
            out = schedule(*args, **kwargs)
            self._opened(out, before)
            return out

        def traced_update(scheduler_output, model_runner_output, *args, **kwargs):
            result = update(scheduler_output, model_runner_output, *args, **kwargs)
            self._closed(scheduler_output)
            return result

        sched.schedule, sched.update_from_output = traced_schedule, traced_update
        llm.collective_rpc(self._wrap_proposer)

    def _wrap_proposer(self, worker) -> None:
        beside = beside_proposer(worker)
        if beside is not None:  # it times its own host work and counts the model's forwards it ran
            inner_beside = beside.propose

            def propose_beside(*args, **kwargs):
                try:
                    return inner_beside(*args, **kwargs)
                finally:
                    with self._lock:
                        self._proposer_s += beside.last_host_s
                        self._forwards += beside.last_forwards

            beside.propose = propose_beside  # type: ignore[method-assign]  # timed in place, per worker
            return
        drafter = getattr(worker.model_runner, "drafter", None)  # vLLM's proposer, or ours in its slot
        if drafter is None:
            return
        inner = drafter.propose

        def propose(*args, **kwargs):
            c0 = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                with self._lock:
                    self._proposer_s += time.thread_time() - c0

        drafter.propose = propose

    def _opened(self, out, before: dict) -> None:
        step = TraceStep()
        rows, reqs, outputs = {}, {}, {}
        spec = getattr(out, "scheduled_spec_decode_tokens", {}) or {}
        for rid, n in out.num_scheduled_tokens.items():
            req = self.scheduler.requests.get(rid)
            if req is None or rid not in before:
                continue
            computed, prompt = before[rid]
            reqs[rid] = req
            outputs[rid] = len(req.output_token_ids)
            if computed < prompt:   # a prefill chunk
                step.prefill_tokens += min(int(n), prompt - computed)
                if computed + n >= prompt:
                    step.prefill_requests += 1
                continue
            rows[rid] = len(step.rids)
            step.rids.append(self._ids.setdefault(rid, len(self._ids)))
            step.ctx.append(int(computed))
            step.drafts.append(len(spec.get(rid, ())))
            step.accepted.append(0)
        self._open[id(out)] = (step, rows, reqs, outputs)

    def _closed(self, out) -> None:
        got = self._open.pop(id(out), None)
        if got is None:
            return
        step, rows, reqs, outputs = got
        for rid, req in reqs.items():
            made = len(req.output_token_ids) - outputs[rid]
            if rid in rows:
                i = rows[rid]
                step.accepted[i] = max(0, min(made - 1, step.drafts[i]))
        with self._lock:
            step.proposer_s, self._proposer_s = self._proposer_s, 0.0
            step.model_forwards, self._forwards = self._forwards, 0
        if step.rids or step.prefill_tokens:
            self._steps.append(step)

    def take(self, kind: str, k: int, drafter: str | None, meta: dict | None = None,
             parts: dict | None = None) -> Trace:
        """The steps since the last call, as a Trace. A drafter made of `parts` (the profile entries
        that price them) keeps its decode steps' proposer time and model forwards, a history drafter
        (kind list) its proposer time; other kinds record neither."""
        steps, self._steps, self._ids = self._steps, [], {}
        for s in steps:
            if (kind != "list" and parts is None) or not s.rids:
                s.proposer_s = None
            s.model_forwards = 0 if parts is None else min(s.model_forwards, k)
        return Trace(kind, k if kind != "none" else 0, steps, drafter, "engine", meta or {}, parts)


__all__ = ["StepTracer"]
