"""`scheduling.k: auto`: a model drafter's k by batch size, chosen and re-checked from the engine's steps.

vLLM fixes how many tokens a model drafter (draft_model, eagle3, mtp, dflash) drafts per batch size
(`num_speculative_tokens_per_batch_size`, expanded into a dense lookup that its scheduler reads at
every step). `KAuto` attaches to an in-process vLLM scheduler and owns, for that engine:

- **measurement**: each decode step's time against its requests, verified tokens, context and
  draft forwards (`StepCostFit(draft_forwards=True)`, the simulator's linear step form), and
  acceptance by draft position (`AcceptanceCalibration(positions=k)`), both read off the
  scheduler's own step inputs and outputs;
- **exploration**: the first `WARMUP_STEPS` scheduled steps cycle k over [k_min, k_max], then one
  step in `EXPLORE_EVERY`, so that the fit can tell a draft forward's cost from a verified token's
  and every position's acceptance keeps being measured;
- **choice**: per batch size b, the k in [k_min, k_max] with the most committed tokens per second,
  b * A(k) / t(b, k), with A(k) = 1 + a_1 + ... + a_k from the measured acceptance
  (`budget.expected_accepted`) and t the fitted step time at the recent context per request;
  k_min is 0 with `auto_disable` (speculation off where it loses), else 1;
- **re-check**: every `RECHECK_EVERY` decode steps, the schedule in force is compared with the
  best one at the batch sizes the engine ran (step-weighted); when it is predicted more than
  `SWITCH_REGRET` slower, the best schedule replaces vLLM's lookup at once. The switch is logged
  with the numbers behind it and counted (`metrics()`).

Changing k between steps is what vLLM's own per-batch-size schedule does; every draft is still
verified by rejection sampling, so what the policy samples is unchanged. The scheduler must run in
this process (our engines, NeMo-RL's sync vLLM worker); vLLM must have been started with a
per-batch-size schedule (`config.to_vllm_speculative_config` sets one for `k: auto`).
"""
from __future__ import annotations

import logging
import time
from collections import Counter, deque
from typing import Any

import numpy as np

from nemo_rl_specdec.cost.model import linear_columns
from nemo_rl_specdec.cost.online import StepCostFit
from nemo_rl_specdec.drafters.machinery.calibration import AcceptanceCalibration
from nemo_rl_specdec.scheduling.budget import expected_accepted, schedule_ranges

log = logging.getLogger("nemo_rl_specdec")

WARMUP_STEPS = 64      # scheduled steps that cycle k over its range before the first choice
EXPLORE_EVERY = 64     # afterwards, one scheduled step in this many drafts a k off the schedule (~1% of steps)
RECHECK_EVERY = 32     # decode steps between two re-checks of the schedule
SWITCH_REGRET = 0.05   # the schedule in force is replaced when predicted this much slower than the best
BATCH_MEMORY = 2048    # decode steps whose batch sizes weigh the re-check


class KAuto:
    """k by batch size for one engine's model drafter (module doc)."""

    def __init__(self, k_max: int, max_batch: int, allow_zero: bool = True, name: str = "engine"):
        if k_max < 1 or max_batch < 1:
            raise ValueError(f"k_max={k_max}, max_batch={max_batch}: both must be >= 1")
        self.k_max, self.k_min, self.max_batch, self.name = int(k_max), 0 if allow_zero else 1, int(max_batch), name
        self.fit = StepCostFit(draft_forwards=True)
        self.acceptance = AcceptanceCalibration(positions=self.k_max, sources=("model",), flush_every=64)
        self.lookup = [self.k_max] * (self.max_batch + 1)  # the schedule in force (vLLM's dense form)
        self._cycle = list(range(self.k_min, self.k_max + 1))
        self._explore = {k: [k] * (self.max_batch + 1) for k in self._cycle}
        self._pending: dict = {}  # id(scheduler output) -> (start, requests, verified, ctx_sum, forwards)
        self._batches: deque = deque(maxlen=BATCH_MEMORY)
        self._ctx_per_req: deque = deque(maxlen=256)
        self.scheduled = 0
        self.decode_steps = 0
        self.explore_steps = 0
        self.switches = 0
        self.rechecks = 0
        self.regret: float | None = None  # predicted loss of the schedule in force at the last re-check
        self.predicted_gain: float | None = None  # best schedule's tokens/s over k_max's, at the last re-check

    # ------------------------------------------------------------------ the scheduler hooks
    def attach(self, scheduler: Any) -> KAuto:
        """Wrap `scheduler.schedule` / `update_from_output` (instance attributes) of a vLLM scheduler."""
        if getattr(scheduler, "dynamic_sd_lookup", None) is None:
            raise RuntimeError("scheduling.k: auto needs vLLM started with a per-batch-size schedule "
                               "(num_speculative_tokens_per_batch_size); this scheduler has none")
        if len(scheduler.dynamic_sd_lookup) != self.max_batch + 1:
            raise RuntimeError(f"scheduler lookup covers {len(scheduler.dynamic_sd_lookup) - 1} batch sizes, "
                               f"KAuto was built for {self.max_batch}")
        schedule, update = scheduler.schedule, scheduler.update_from_output

        def scheduled(*args, **kwargs):
            start = time.perf_counter()
            scheduler.dynamic_sd_lookup = self._next_lookup()
            out = schedule(*args, **kwargs)
            self._scheduled(start, out)
            return out

        def updated(scheduler_output, model_runner_output):
            self._observe(scheduler_output, model_runner_output)
            result = update(scheduler_output, model_runner_output)
            self._step_done(scheduler_output)
            return result

        scheduler.schedule, scheduler.update_from_output = scheduled, updated
        scheduler.dynamic_sd_lookup = self.lookup
        return self

    def _next_lookup(self) -> list:
        n, self.scheduled = self.scheduled, self.scheduled + 1
        if n < WARMUP_STEPS or n % EXPLORE_EVERY == 0:  # the explored k cycles over the exploration steps
            k = self._cycle[self.explore_steps % len(self._cycle)]
            self.explore_steps += 1
            return self._explore[k]
        return self.lookup

    def _scheduled(self, start: float, out: Any) -> None:
        reqs = len(out.num_scheduled_tokens)
        if not reqs:
            return
        spec = sum(map(len, out.scheduled_spec_decode_tokens.values()))
        if out.total_num_scheduled_tokens != reqs + spec:  # a prefill ran in this step: not a decode sample
            return
        ctx = sum(out.scheduled_cached_reqs.num_computed_tokens)
        self._pending[id(out)] = (start, reqs, out.total_num_scheduled_tokens, ctx,
                                  max(int(out.num_spec_tokens_to_schedule), 1))

    def _observe(self, out: Any, runner_out: Any) -> None:
        """Acceptance by position of the drafts this step verified."""
        sampled, index = runner_out.sampled_token_ids, runner_out.req_id_to_index
        if not sampled:
            return
        for rid, draft in out.scheduled_spec_decode_tokens.items():
            i = index.get(rid)
            if draft and i is not None:
                self.acceptance.record(0, draft, max(len(sampled[i]) - 1, 0))

    def _step_done(self, out: Any) -> None:
        row = self._pending.pop(id(out), None)
        if row is None:
            return
        start, reqs, verified, ctx, forwards = row
        self.fit.add(reqs, verified, ctx, time.perf_counter() - start, forwards)
        self.decode_steps += 1
        self._batches.append(reqs)
        self._ctx_per_req.append(ctx / reqs)
        if self.decode_steps % RECHECK_EVERY == 0 and self.fit.coef is not None and self.scheduled > WARMUP_STEPS:
            self.recheck()

    # ------------------------------------------------------------------ the choice
    def curve(self) -> np.ndarray:
        """Measured acceptance of draft positions 1..k_max (made non-increasing, as it must be)."""
        self.acceptance.flush()
        return np.minimum.accumulate(np.clip(np.asarray(self.acceptance.rates[0]), 0.0, 1.0))

    def throughput(self) -> np.ndarray:
        """Predicted committed tokens per second, [batch size 1..max_batch, k 0..k_max]."""
        A = expected_accepted(list(self.curve()), self.k_max)
        b = np.arange(1, self.max_batch + 1, dtype=float)[:, None]
        d = np.arange(self.k_max + 1, dtype=float)[None, :]
        ctx = float(np.mean(self._ctx_per_req)) if self._ctx_per_req else 0.0
        f = np.maximum(d, 1.0)   # the first draft forward runs at k = 0 too
        # the one step-cost function's linear form (cost/model.py) with the fitted constants, over the grid
        model = self.fit.cost_model()
        if model is None:
            raise RuntimeError("k_auto: no step-cost fit yet; throughput is read after the first fit")
        t = linear_columns(b, b * (1 + d), ctx * b, f) @ model.linear_coef
        return b * A[None, :] / np.maximum(t, 1e-12)

    def recheck(self) -> None:
        """Compare the schedule in force with the best one; switch when it loses more than SWITCH_REGRET."""
        self.rechecks += 1
        thr = self.throughput()
        best = self.k_min + np.argmax(thr[:, self.k_min:], axis=1)  # ties: the smaller k
        seen = Counter(self._batches)
        bs = np.array(sorted(seen)) - 1
        w = np.array([seen[b + 1] for b in bs], dtype=float)
        cur = np.asarray(self.lookup[1:])
        in_force = float((w * thr[bs, cur[bs]]).sum())
        optimum = float((w * thr[bs, best[bs]]).sum())
        self.regret = 1.0 - in_force / optimum if optimum > 0 else 0.0
        self.predicted_gain = optimum / float((w * thr[bs, self.k_max]).sum())
        if self.regret <= SWITCH_REGRET:
            return
        old = schedule_ranges(self.lookup)
        self.lookup[1:] = best.tolist()  # in place: the scheduler holds this list
        self.switches += 1
        r2 = self.fit.r2
        log.info("%s k: auto: schedule %s -> %s: predicted %.1f%% more tokens per second at the batch sizes run "
                 "(%d decode steps, most common batch %d); acceptance by position %s; step-cost fit on %d steps, "
                 "R^2 %s", self.name, old, schedule_ranges(self.lookup), 100 * (optimum / in_force - 1),
                 sum(seen.values()), seen.most_common(1)[0][0], [round(float(a), 2) for a in self.curve()],
                 self.fit.samples, "n/a" if r2 is None else f"{r2:.2f}")

    # ------------------------------------------------------------------ reporting
    def _counts(self) -> dict:
        return {"k_min": self.k_min, "k_max": self.k_max, "decode_steps": self.decode_steps,
                "explore_steps": self.explore_steps, "rechecks": self.rechecks, "switches": self.switches,
                "regret": self.regret, "predicted_gain_vs_k_max": self.predicted_gain}

    def stats(self) -> dict:
        return {"schedule": [list(t) for t in schedule_ranges(self.lookup)], **self._counts(),
                "acceptance_by_position": [round(float(a), 4) for a in self.curve()],
                "step_cost": self.fit.metrics()}

    def metrics(self) -> dict:
        """Flat numeric metrics (NeMo-RL step metrics take these under `specdec/engine/k_auto/`)."""
        out = {f"k_auto/{k}": v for k, v in self._counts().items() if v is not None}
        seen = Counter(self._batches)
        if seen:
            n = sum(seen.values())
            out["k_auto/k_mean"] = sum(c * self.lookup[b] for b, c in seen.items()) / n
        out.update({f"k_auto/acceptance/pos{j + 1}": float(a) for j, a in enumerate(self.curve())})
        out.update({f"k_auto/step_cost/{k}": v for k, v in self.fit.metrics().items() if v is not None})
        return out


def attach_to_llm(llm: Any, spec: Any, name: str = "engine") -> KAuto | None:
    """A `KAuto` on the scheduler of a `vllm.LLM` whose engine core runs in this process, when the
    block asks for `scheduling.k: auto`; else None. Refuses an engine core in another process."""
    if not (spec.enabled and spec.scheduling.k == "auto"):
        return None
    core = getattr(getattr(llm.llm_engine, "engine_core", None), "engine_core", None)
    scheduler = getattr(core, "scheduler", None)
    if scheduler is None:
        raise RuntimeError("policy.generation.speculative_decoding.scheduling.k: auto needs vLLM's engine core in the "
                           "generation process (VLLM_ENABLE_V1_MULTIPROCESSING=0, as NeMo-RL's sync worker and our "
                           "engines run it); this engine's core runs elsewhere")
    if not scheduler.dynamic_sd_lookup:
        raise RuntimeError("scheduling.k: auto needs vLLM started with a per-batch-size schedule "
                           "(num_speculative_tokens_per_batch_size, set by config.to_vllm_speculative_config)")
    return KAuto(spec.num_speculative_tokens, len(scheduler.dynamic_sd_lookup) - 1,
                 allow_zero=bool(spec.auto_disable), name=name).attach(scheduler)


__all__ = ["KAuto", "attach_to_llm"]
