"""NeMo-RL vLLM worker actors with speculative decoding (sync and async engines).

`SpecDecVllmGenerationWorker` / `SpecDecVllmAsyncGenerationWorker` are Ray actors built on
NeMo-RL's `VllmGenerationWorkerImpl` / `VllmAsyncGenerationWorkerImpl` (the ModelOpt worker is
the precedent). They are created when first looked up by FQN (module `__getattr__`), so this
module imports without NeMo-RL, and NeMo-RL's `RayWorkerBuilder` finds them by FQN in the worker
venv. On top of NeMo-RL's behaviour they:

- check, before the engine starts, that the drafter's libraries import in this environment
  (`arctic_inference` for the suffix drafter);
- inject our composite worker extension (`_create_engine`), forward PYTHONPATH into vLLM's own TP
  workers, and give every request `extra_args` with its problem id (a hash of its prompt tokens)
  and, when the driver set them, its draft budget and predicted length;
- call `specdec_init(block)` in every vLLM worker once the engine is up, and join the rollout
  exchange;
- keep the rollouts they generate (never validation rollouts) and, when a generation phase ends
  (`specdec_stage_generated`, called by our VllmGeneration's `finish_generation` before NeMo-RL's
  sleep / prefix-cache reset), swap them with every other engine through the exchange and stage the
  whole step into every vLLM worker for the next policy version (`specdec_stage_refs`): the DAS store
  is rebuilt on a background thread while the policy trains, and is fenced (never read) until the
  refit installs it;
- right before every refit RPC, swap what is left (rollouts generated since, or the whole step when
  nothing was staged) and stage the update with the next policy version (`specdec_stage_update`):
  `STAGED_ROLLOUTS` when the store was staged (any later rollouts appended to it), else the refs as
  before, with the newest drafter the policy workers distilled when the drafter is trained online
  (the drafter board, exchange.py); the refit itself then refreshes the drafter (see extension.py);
- after every wake-up that brings weights back, have each vLLM worker prove its drafter is the
  pushed version and restore it from the last pushed state if a sleep discarded it
  (`specdec_verify_drafter`; NeMo-RL's refit restores only what it streams);
- answer `specdec_report()` for the driver's step metrics.

The async worker's vLLM engine core runs in a process vLLM spawns outside Ray, reached through
vLLM's msgpack: there the actor fetches the rollouts and drafter weights its refs hold and sends
those (`payload.for_engine_core`), since a Ray ref pickled on the way loses its owner.

Refit routes a NeMo-RL version lacks (e.g. `nccl_reshard_refit` on v0.7.0) are not overridden.
A policy version here counts the weight updates an engine has received (1 = first refit).
"""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import importlib
import inspect
import logging
import sys
import uuid
from dataclasses import replace
from typing import Any

from nemo_rl_specdec.adapter import api, payload, translate
from nemo_rl_specdec.adapter.host import Host
from nemo_rl_specdec.lockstep import STAGED_ROLLOUTS, DrafterRefreshError, LockstepState
from nemo_rl_specdec.rollouts import RolloutBatch, problem_id
from nemo_rl_specdec.scheduling.k_auto import KAuto, attach_to_llm
from nemo_rl_specdec.update import PolicyUpdate

logger = logging.getLogger(__name__)

REFIT_CHECKPOINT_METHOD = "update_weights_from_checkpoint_engine"

# Per-request extras (budget, predicted length) of the generate call running in this thread / task.
_REQUEST_EXTRAS: contextvars.ContextVar = contextvars.ContextVar("specdec_request_extras", default=None)


def request_extras(data: Any) -> list | None:
    """Per row: the draft budget and predicted length the driver attached (`payload.BUDGET_KEY`...)."""
    budgets, preds = data.get(payload.BUDGET_KEY), data.get(payload.PREDICTED_KEY)
    if budgets is None:
        return None
    budgets, preds = budgets.tolist(), (preds.tolist() if preds is not None else [None] * len(budgets))
    out = []
    for b, p in zip(budgets, preds, strict=True):
        e: dict[str, float] = {} if b is None or b < 0 else {"specdec_budget": int(b)}
        if e and p is not None and p >= 0:
            e["specdec_predicted_len"] = float(p)
        out.append(e)
    return out


def with_extra_args(prompts: Any, sampling_params: Any, extras: list | None) -> Any:
    """`sampling_params` as one clone per prompt whose `extra_args` carry the prompt's problem id
    and its row of `extras`; a single prompt (async engine) gets a single clone."""
    single = isinstance(prompts, dict) or not isinstance(prompts, (list, tuple))
    plist = [prompts] if single else list(prompts)
    sps = list(sampling_params) if isinstance(sampling_params, (list, tuple)) else [sampling_params] * len(plist)
    out = []
    for i, (p, sp) in enumerate(zip(plist, sps, strict=True)):
        extra = {}
        tokens = p.get("prompt_token_ids") if isinstance(p, dict) else None
        if tokens is not None:
            extra["problem_id"] = problem_id(tokens)
        if extras is not None and i < len(extras):
            extra.update(extras[i])
        sp = sp.clone()
        sp.extra_args = {**(sp.extra_args or {}), **extra}
        out.append(sp)
    return out[0] if single else out


def wrap_engine_generate(llm: Any) -> None:
    """Route every `llm.generate(prompt(s), sampling_params, ...)` through `with_extra_args`."""
    original = llm.generate

    @functools.wraps(original)
    def generate(*args, **kwargs):
        argv = list(args)
        p_at = "prompts" if "prompts" in kwargs else ("prompt" if "prompt" in kwargs else 0)
        prompts = kwargs[p_at] if isinstance(p_at, str) else argv[0]
        if "sampling_params" in kwargs:
            kwargs["sampling_params"] = with_extra_args(prompts, kwargs["sampling_params"], _REQUEST_EXTRAS.get())
        elif len(argv) > 1 and argv[1] is not None:
            argv[1] = with_extra_args(prompts, argv[1], _REQUEST_EXTRAS.get())
        return original(*argv, **kwargs)

    llm.generate = generate


def guard_sleep(llm: Any) -> None:
    """Before every `llm.sleep(level)` (NeMo-RL's colocated `finish_generation`), each vLLM worker checks
    that its drafter can come back from that level (`specdec_check_restorable`: at level 2, a drafter
    whose checkpoint is not a local path is refused by its key, before the sleep discards it)."""
    original = llm.sleep
    if inspect.iscoroutinefunction(original):
        @functools.wraps(original)
        async def sleep(level: int = 1, *args, **kwargs):
            await _maybe_await(llm.collective_rpc("specdec_check_restorable", args=(level,)))
            return await original(level, *args, **kwargs)
    else:
        @functools.wraps(original)
        def sleep(level: int = 1, *args, **kwargs):
            llm.collective_rpc("specdec_check_restorable", args=(level,))
            return original(level, *args, **kwargs)

    llm.sleep = sleep


def preflight(spec: Any) -> None:
    """The drafter's libraries import in this Python environment (raised before any engine starts)."""
    if spec is None or not translate.needs_arctic(spec):
        return
    try:
        importlib.import_module(translate.ARCTIC_MODULE)
    except ImportError as e:
        raise ImportError(translate.arctic_missing_message(f"this worker's Python ({sys.executable})", str(e),
                                                          spec.drafter)) from None


class SpecDecWorkerState:
    """Engine-independent state of one worker actor (no NeMo-RL); unit-tested directly."""

    def _specdec_setup(self, config: dict, stash_tokens: int = 16_000_000) -> None:
        self._specdec_spec = translate.enabled_spec(config)
        self._specdec_init_payload = translate.engine_init_payload(config)
        self._specdec_lockstep = LockstepState()  # its engine's, from every update's report
        self._specdec_k_auto: KAuto | None = None  # on the sync engine with scheduling.k: auto
        self._specdec_last_staged = 0  # rollouts this engine handed to the drafters for the last update
        self._specdec_pending_staged = 0  # ... and for the next one, so far
        self._specdec_staged_for: int | None = None  # the version a background rebuild is staged for
        self._specdec_last_stage: dict = {}  # the last end-of-generation staging: version, rollouts, seconds
        self._specdec_engine = uuid.uuid4().hex[:12]
        self._specdec_exchange_name = config.get(translate.EXCHANGE_KEY)
        want = False
        self._specdec_prompt_tail = None
        if self._specdec_spec is not None:
            preflight(self._specdec_spec)
            want = translate.rollouts_wanted(self._specdec_spec)
            self._specdec_prompt_tail = translate.rollout_prompt_tail(self._specdec_spec)
        if want and not self._specdec_exchange_name:
            raise RuntimeError(f"{translate.EXCHANGE_KEY} is missing from the generation config: the worker was not "
                               "created by nemo-rl-specdec's VllmGeneration, so its drafter would see no rollouts")
        self._specdec_stash = payload.RolloutStash(stash_tokens) if want else None
        self._specdec_observe_errors = 0
        self._specdec_observe_first = ""
        self._specdec_skipped_validation = 0
        self._specdec_distilled = translate.distills_in_policy(config, self._specdec_spec)
        self._specdec_drafter_seq = -1  # the newest policy-distilled drafter this engine applied
        self._specdec_distill_stats: dict = {}

    @contextlib.contextmanager
    def _specdec_wake_check(self):
        """Around the drafter check after a wake-up: why it failed is kept (`specdec_wake_error`), since
        NeMo-RL's VllmGeneration catches every error of its engines' wake-up and only prints it."""
        self._specdec_wake_failure = ""
        try:
            yield
        except Exception as e:
            self._specdec_wake_failure = f"{type(e).__name__}: {e}"
            raise

    def specdec_wake_error(self) -> str:
        """Why this engine's drafter check failed at its last wake-up ("" when it passed or did not run)."""
        return getattr(self, "_specdec_wake_failure", "")

    @property
    def specdec_enabled(self) -> bool:
        return self._specdec_spec is not None

    def _specdec_exchange(self) -> Any:
        import ray

        return ray.get_actor(self._specdec_exchange_name)

    def _specdec_join_ref(self) -> Any:
        """The exchange join call (a ref), or None when this engine's drafter takes no rollouts."""
        if self._specdec_stash is None:
            return None
        return self._specdec_exchange().join.remote(self._specdec_engine)

    def _specdec_observe(self, data: Any, output: Any) -> None:
        """Keep a generation's rollouts for the next update (validation rows never). Never fails generation."""
        if self._specdec_stash is None:
            return
        marked = data.get(payload.NO_RECORD_KEY)
        if marked is not None and bool(marked.any()):
            self._specdec_skipped_validation += len(marked)
            return
        try:
            self._specdec_stash.add(RolloutBatch.from_generation(
                data["input_ids"], data["input_lengths"], output["output_ids"], output["generation_lengths"],
                self._specdec_lockstep.policy_version, prompt_tail=self._specdec_prompt_tail))
        except Exception as e:  # the generation itself is fine: return it, fail the next refit instead
            self._specdec_observe_errors += 1
            if self._specdec_observe_errors == 1:
                self._specdec_observe_first = f"{type(e).__name__}: {e}"
                logger.exception("[specdec] could not record rollouts for the drafter; the next refit fails")

    @property
    def _specdec_next_version(self) -> int:
        """The policy version the next update brings this engine to."""
        return self._specdec_lockstep.policy_version + 1

    def _specdec_refreshes(self, version: int) -> bool:
        """Whether the update to `version` refreshes the drafter (refresh.every_n_steps; 1 = the first)."""
        assert self._specdec_spec is not None   # asked only of an engine with speculation on
        return (version - 1) % self._specdec_spec.refresh.every_n_steps == 0

    def _specdec_board_ref(self) -> Any:
        """A ref to the newest drafter the policy workers published that this engine has not applied
        ((seq, refs, stats) or None), or None when this run does not distil online."""
        if not self._specdec_distilled:
            return None
        from nemo_rl_specdec.adapter.exchange import drafter_board
        try:
            board = drafter_board()
        except ValueError:
            raise DrafterRefreshError(
                "refresh.mode=online distils the drafter in the policy workers, but this Ray job has no drafter "
                "board: the policy was not built by nemo-rl-specdec's launcher (python -m nemo_rl_specdec.run_grpo), "
                "so this engine's drafter would never be refreshed") from None
        return board.latest.remote(self._specdec_drafter_seq)

    def _specdec_stage(self, version: int, rollout_refs: Any, published: Any) -> PolicyUpdate:
        """The payload staged before the refit to `version`. A policy-distilled drafter is refreshed
        exactly when the trainer published a new one; other drafters follow refresh.every_n_steps."""
        refresh = published is not None if self._specdec_distilled else self._specdec_refreshes(version)
        refs = published[1] if published is not None else []
        return payload.stage_payload(version, rollout_refs, drafter_weights=refs[0] if refs else None,
                                     refresh_drafter=refresh, drafter_checkpoint=published is not None and not refs)

    def _specdec_stages_at_finish(self) -> bool:
        """Whether the end of generation stages the rollouts: a store rebuilt from them (refresh.mode
        rebuild) whose next update refreshes it (refresh.every_n_steps; off-cadence rollouts wait)."""
        return (self._specdec_stash is not None and self._specdec_spec is not None
                and self._specdec_spec.refresh.mode == "rebuild"
                and self._specdec_refreshes(self._specdec_next_version))

    def _specdec_stage_target(self, refs: list) -> int | None:
        """After the end-of-generation swap: the version to stage `refs` (all engines' rollouts) for, or
        None. Every engine sees the same refs, so all stage or none do (a validation phase: no refs);
        an engine whose drafter was disabled after a refresh error swaps but stages nothing."""
        if not refs or self._specdec_lockstep.disabled:
            return None
        return self._specdec_next_version

    def _specdec_staged(self, version: int, per_rank: list, t0: float) -> dict:
        """Record a staging into every vLLM worker of this engine (a failed rank's error is kept there and
        fails the refit to `version`); the refit then installs it."""
        import time

        self._specdec_staged_for = version
        reps = [r for r in per_rank or [] if r]
        self._specdec_last_stage = {"version": version,
                                    "rollouts": max((r.get("rollouts", 0) for r in reps), default=0),
                                    "stage_s": time.perf_counter() - t0,
                                    "errors": sum(1 for r in reps if r.get("error"))}
        return dict(self._specdec_last_stage)

    def _specdec_refit_rollouts(self, version: int, refs: Any) -> tuple[Any, Any]:
        """(the update's rollouts, refs still to stage before the refit): `STAGED_ROLLOUTS` when the
        store for `version` was staged when generation ended (rollouts generated since are appended to
        it), else the refs as they are (a refit that no end of generation staged)."""
        if self._specdec_staged_for != version:
            return refs, None
        return STAGED_ROLLOUTS, (refs or None)

    def _specdec_record_refit(self, ok: bool, version: int, per_rank: list, published: Any = None) -> None:
        """Record the engine's lockstep after a refit to `version` (its vLLM workers' report, rank 0's;
        the next generate checks it). A refit that succeeded left the engine at `version`, or its report
        says otherwise and the refit is refused."""
        reps = [r for r in (per_rank or []) if r]
        state = reps[0].get("state") if reps else None
        if not ok:  # the engine stays at its version, and refuses to generate until an update lands whole
            broken = (state or {}).get("policy_broken") or "its vLLM workers did not all apply it"
            self._specdec_lockstep = replace(self._specdec_lockstep,
                                             policy_broken=f"the refit to policy version {version} failed: {broken}")
            return
        self._specdec_lockstep = (LockstepState.of(state) if state
                                  else replace(self._specdec_lockstep, policy_version=version, policy_broken=""))
        if self._specdec_lockstep.policy_version != version:
            raise DrafterRefreshError(f"engine {self._specdec_engine}: the refit to policy version {version} "
                                      f"succeeded, but the engine reports {self._specdec_lockstep.policy_version}")
        self._specdec_staged_for = None
        self._specdec_last_staged, self._specdec_pending_staged = self._specdec_pending_staged, 0
        if published is not None:
            self._specdec_drafter_seq, self._specdec_distill_stats = published[0], dict(published[2])

    def _specdec_saved(self, per_rank: list) -> dict:
        """This engine's part of NeMo-RL's checkpoint (adapter/checkpoint.py): the actor's policy version,
        the rollouts it holds for the next update (async GRPO: generated since the last refit), and its
        vLLM workers' state (rank 0's; the ranks of one engine hold the same). A store rebuild staged
        for the next version is part of the workers' window (the proposer waits for it)."""
        from nemo_rl_specdec.drafter_state import from_bytes

        pending = self._specdec_stash.peek() if self._specdec_stash is not None else None
        return {"version": self._specdec_lockstep.policy_version,
                "pending": None if pending is None or not len(pending) else
                {k: getattr(pending, k) for k in RolloutBatch.__slots__},
                "worker": from_bytes(per_rank[0])}

    def _specdec_restore(self, saved: dict, per_rank: list) -> dict:
        """After the vLLM workers restored `saved["worker"]` (`per_rank`: their states): the actor
        continues from the saved version, with the saved rollouts waiting for the next update."""
        state = dict(per_rank[0])
        restored = state.pop("restored_entries", 0)
        lockstep = LockstepState.of(state)
        if lockstep.policy_version != int(saved["version"]):
            raise DrafterRefreshError(f"engine {self._specdec_engine}: the saved engine is at policy version "
                                      f"{saved['version']}, its restored vLLM workers at {lockstep.policy_version}")
        self._specdec_lockstep = lockstep
        if saved.get("pending") is not None and self._specdec_stash is not None:
            self._specdec_stash.add(RolloutBatch(**saved["pending"]))
        return {"version": lockstep.policy_version, "restored_entries": restored}

    def _specdec_check_lag(self) -> None:
        """Refuse to generate with a drafter that trails the policy more than refresh.max_policy_lag
        (`LockstepState.check`; names both versions)."""
        if self._specdec_spec is None:
            return
        r = self._specdec_spec.refresh
        assert r.mode is not None   # validation fills in the drafter's default
        self._specdec_lockstep.check(mode=r.mode, max_policy_lag=r.max_policy_lag, enabled=True,
                                     engine=f"engine {self._specdec_engine}")

    def _specdec_swap_ref(self) -> Any:
        """Put this engine's rollouts in the object store and start the swap (a ref to all engines' refs).
        Raises when a generation's rollouts could not be recorded: the drafter would miss them."""
        import ray

        from nemo_rl_specdec.rollouts import RolloutError

        if self._specdec_observe_errors:
            raise RolloutError(
                f"{self._specdec_observe_errors} generation batch(es) since the last refit could not be recorded "
                f"for the drafter (first: {self._specdec_observe_first}); a batch needs input_ids, input_lengths, "
                "output_ids and generation_lengths (NeMo-RL's GenerationDatumSpec / GenerationOutputSpec)")

        assert self._specdec_stash is not None   # an engine whose drafter takes rollouts keeps a stash
        batch = self._specdec_stash.drain()
        self._specdec_pending_staged += len(batch)
        refs = [ray.put(batch)] if len(batch) else []
        return self._specdec_exchange().swap.remote(self._specdec_engine, self._specdec_next_version, refs)

    def _specdec_combine(self, per_rank: list, counters: dict[str, float]) -> dict:
        """One report per engine from the per-TP/PP-rank `specdec_report` results, with the engine's
        `counters` (`SpecDecEngineHooks.specdec_counters`)."""
        per_rank = [r for r in (per_rank or []) if r]
        if not per_rank:
            return {}
        first = dict(per_rank[0])
        def key(r):
            return ((r.get("state") or {}).get("policy_version"), (r.get("state") or {}).get("drafter_version"))
        first["ranks_agree"] = len({key(r) for r in per_rank}) == 1
        first["rollouts_staged"] = self._specdec_last_staged
        first["rollouts_dropped"] = self._specdec_stash.dropped if self._specdec_stash is not None else 0
        first["rollout_record_errors"] = self._specdec_observe_errors
        first["validation_rollouts_skipped"] = self._specdec_skipped_validation
        first["actor_policy_version"] = self._specdec_lockstep.policy_version
        first["staged_for"] = self._specdec_staged_for
        first["last_stage"] = dict(self._specdec_last_stage)
        first["counters"] = counters
        if self._specdec_k_auto is not None:  # k by batch size, chosen in this process's vLLM scheduler
            state = dict(first.get("state") or {})
            state["metrics"] = {**(state.get("metrics") or {}), **self._specdec_k_auto.metrics()}
            first["state"] = state
        if self._specdec_distilled:
            first["distill"] = {**self._specdec_distill_stats, "drafter_seq": self._specdec_drafter_seq}
        return first


class SpecDecEngineHooks(SpecDecWorkerState, Host):
    """What the sync and async worker Impls share in front of NeMo-RL's: our state is set up before
    NeMo-RL's constructor runs, and the engine is created with our vLLM worker extension."""

    def __init__(self, config, bundle_indices=None, fraction_of_gpus=1.0, seed=None,
                 extra_env_vars=None, defer_model_load=False):
        self._specdec_setup(config)
        super().__init__(config, bundle_indices=bundle_indices, fraction_of_gpus=fraction_of_gpus, seed=seed,
                         extra_env_vars=translate.extra_env_var_names(extra_env_vars),
                         defer_model_load=defer_model_load)

    def specdec_counters(self) -> dict[str, float]:
        """This engine's cumulative generated, drafted and accepted tokens: vLLM's own counters, as
        NeMo-RL's worker reads them for its step metrics (`_get_raw_spec_counters`)."""
        from nemo_rl_specdec.adapter.metrics import counters_of

        return counters_of(self._get_raw_spec_counters())

    def _create_engine(self, llm_kwargs):
        if self.specdec_enabled:
            translate.inject_extension(llm_kwargs)
        super()._create_engine(llm_kwargs)
        if self.specdec_enabled:
            wrap_engine_generate(self.llm)


async def _maybe_await(x: Any) -> Any:
    while asyncio.iscoroutine(x) or isinstance(x, asyncio.Future) or type(x).__name__ == "ObjectRef":
        x = await x
    return x


def _wakes_weights(kwargs: dict) -> bool:
    """Whether a wake-up brings back weights (NeMo-RL wakes `weights` and `kv_cache` separately)."""
    tags = kwargs.get("tags")
    return tags is None or "weights" in tags


def _optional(base: type, name: str, make) -> dict:
    """{name: make()} when the NeMo-RL base class has `name` (a refit route of that version), else {}."""
    return {name: make()} if hasattr(base, name) else {}


def _build_sync_impl() -> type:
    base: Any = api.resolve(api.SYNC_WORKER_IMPL)

    class SpecDecVllmGenerationWorkerImpl(SpecDecEngineHooks, base):
        """NeMo-RL's sync vLLM worker with speculative decoding (see module docstring)."""

        def post_init(self):
            import ray

            result = super().post_init()
            if self.specdec_enabled and self.llm is not None:
                self.specdec_init_reports = self.llm.collective_rpc("specdec_init", args=(self._specdec_init_payload,))
                guard_sleep(self.llm)
                self._specdec_k_auto = attach_to_llm(self.llm, self._specdec_spec, f"engine {self._specdec_engine}")
                join = self._specdec_join_ref()
                if join is not None:
                    ray.get(join)
            return result

        def generate(self, data, greedy=False):
            self._specdec_check_lag()
            token = _REQUEST_EXTRAS.set(request_extras(data) if self.specdec_enabled else None)
            try:
                out = super().generate(data, greedy=greedy)
            finally:
                _REQUEST_EXTRAS.reset(token)
            self._specdec_observe(data, out)
            return out

        def specdec_stage_generated(self) -> dict:
            """A generation phase ended (our VllmGeneration's finish_generation): swap the rollouts and stage
            them into every vLLM worker for the next version, rebuilt in the background. {} when nothing
            was staged (no drafter that rebuilds, an off-cadence step, a validation phase)."""
            if not self.specdec_enabled or self.llm is None or not self._specdec_stages_at_finish():
                return {}
            import time

            import ray

            t0 = time.perf_counter()
            refs = ray.get(self._specdec_swap_ref())
            version = self._specdec_stage_target(refs)
            if version is None:
                return {}
            per_rank = self.llm.collective_rpc("specdec_stage_refs", args=(refs, version))
            return self._specdec_staged(version, per_rank, t0)

        def _specdec_refit(self, call, *args):
            if not self.specdec_enabled or self.llm is None:
                return call(*args)
            import ray

            version = self._specdec_next_version
            swap = self._specdec_stash is not None and self._specdec_refreshes(version)  # off-cadence: they wait
            rollouts, more = self._specdec_refit_rollouts(version, ray.get(self._specdec_swap_ref()) if swap else None)
            if more:  # generated after the store was staged: appended to it
                self.llm.collective_rpc("specdec_stage_refs", args=(more, version))
            board = self._specdec_board_ref()
            published = ray.get(board) if board is not None else None
            self.llm.collective_rpc("specdec_stage_update", args=(self._specdec_stage(version, rollouts, published),))
            ok = call(*args)
            self._specdec_record_refit(ok, version, self.llm.collective_rpc("specdec_report"), published)
            return ok

        def update_weights_via_ipc_zmq(self):
            return self._specdec_refit(super().update_weights_via_ipc_zmq)

        def update_weights_from_collective(self):
            return self._specdec_refit(super().update_weights_from_collective)

        def wake_up(self, **kwargs):
            result = super().wake_up(**kwargs)
            if self.specdec_enabled and self.llm is not None and _wakes_weights(kwargs):
                with self._specdec_wake_check():
                    self.specdec_wake_reports = self.llm.collective_rpc("specdec_verify_drafter", args=(True,))
            return result

        def specdec_report(self) -> dict:
            if not self.specdec_enabled or self.llm is None:
                return {}
            return self._specdec_combine(self.llm.collective_rpc("specdec_report"), self.specdec_counters())

        def specdec_export_state(self) -> dict:
            return self._specdec_saved(self.llm.collective_rpc("specdec_export_state"))

        def specdec_restore_state(self, saved: dict) -> dict:
            from nemo_rl_specdec.drafter_state import to_bytes

            return self._specdec_restore(saved, self.llm.collective_rpc("specdec_restore_state",
                                                                        args=(to_bytes(saved["worker"]),)))

    def nccl_reshard_refit(self):
        return self._specdec_refit(super(SpecDecVllmGenerationWorkerImpl, self).nccl_reshard_refit)

    def checkpoint_engine_rpc(self, checkpoint_method, method_args=()):
        parent = super(SpecDecVllmGenerationWorkerImpl, self).checkpoint_engine_rpc
        if checkpoint_method != REFIT_CHECKPOINT_METHOD:
            return parent(checkpoint_method, method_args)
        return self._specdec_refit(parent, checkpoint_method, method_args)

    for name, fn in {**_optional(base, "nccl_reshard_refit", lambda: nccl_reshard_refit),
                     **_optional(base, "checkpoint_engine_rpc", lambda: checkpoint_engine_rpc)}.items():
        fn.__qualname__ = f"SpecDecVllmGenerationWorkerImpl.{name}"
        setattr(SpecDecVllmGenerationWorkerImpl, name, fn)
    return SpecDecVllmGenerationWorkerImpl


def _build_async_impl() -> type:
    base: Any = api.resolve(api.ASYNC_WORKER_IMPL)

    class SpecDecVllmAsyncGenerationWorkerImpl(SpecDecEngineHooks, base):
        """NeMo-RL's async vLLM worker with speculative decoding (see module docstring)."""

        async def post_init_async(self):
            result = await super().post_init_async()
            if self.specdec_enabled and self.llm is not None:
                self.specdec_init_reports = await _maybe_await(
                    self.llm.collective_rpc("specdec_init", args=(self._specdec_init_payload,)))
                guard_sleep(self.llm)
                join = self._specdec_join_ref()
                if join is not None:
                    await join
            return result

        async def generate_async(self, data, greedy=False):
            self._specdec_check_lag()
            token = _REQUEST_EXTRAS.set(request_extras(data) if self.specdec_enabled else None)
            try:
                async for item in super().generate_async(data, greedy=greedy):
                    self._specdec_observe(data, item[1])
                    yield item
            finally:
                _REQUEST_EXTRAS.reset(token)

        async def specdec_stage_generated(self) -> dict:
            """A generation phase ended (see the sync worker's): swap, and stage a background rebuild."""
            if not self.specdec_enabled or self.llm is None or not self._specdec_stages_at_finish():
                return {}
            import time

            t0 = time.perf_counter()
            refs = await self._specdec_swap_ref()
            version = self._specdec_stage_target(refs)
            if version is None:
                return {}
            rollouts = await asyncio.to_thread(payload.resolve_rollouts, refs)  # module docstring: refs stay here
            return self._specdec_staged(
                version, await _maybe_await(self.llm.collective_rpc("specdec_stage_refs", args=(rollouts, version))),
                t0)

        async def _specdec_refit(self, call, *args):
            if not self.specdec_enabled or self.llm is None:
                return await call(*args)
            version = self._specdec_next_version
            swap = self._specdec_stash is not None and self._specdec_refreshes(version)  # off-cadence: they wait
            rollouts, more = self._specdec_refit_rollouts(version, await self._specdec_swap_ref() if swap else None)
            if more:  # generated after the store was staged: appended to it
                more = await asyncio.to_thread(payload.resolve_rollouts, more)
                await _maybe_await(self.llm.collective_rpc("specdec_stage_refs", args=(more, version)))
            board = self._specdec_board_ref()
            published = await board if board is not None else None
            staged = await asyncio.to_thread(payload.for_engine_core, self._specdec_stage(version, rollouts, published))
            await _maybe_await(self.llm.collective_rpc("specdec_stage_update", args=(staged,)))
            ok = await call(*args)
            self._specdec_record_refit(ok, version, await _maybe_await(self.llm.collective_rpc("specdec_report")),
                                       published)
            return ok

        async def update_weights_via_ipc_zmq_async(self):
            return await self._specdec_refit(super().update_weights_via_ipc_zmq_async)

        async def update_weights_from_collective_async(self):
            return await self._specdec_refit(super().update_weights_from_collective_async)

        async def wake_up_async(self, **kwargs):
            result = await super().wake_up_async(**kwargs)
            if self.specdec_enabled and self.llm is not None and _wakes_weights(kwargs):
                with self._specdec_wake_check():
                    self.specdec_wake_reports = await _maybe_await(
                        self.llm.collective_rpc("specdec_verify_drafter", args=(True,)))
            return result

        async def specdec_report(self) -> dict:
            if not self.specdec_enabled or self.llm is None:
                return {}
            return self._specdec_combine(await _maybe_await(self.llm.collective_rpc("specdec_report")),
                                        self.specdec_counters())

        async def specdec_export_state(self) -> dict:
            return self._specdec_saved(await _maybe_await(self.llm.collective_rpc("specdec_export_state")))

        async def specdec_restore_state(self, saved: dict) -> dict:
            from nemo_rl_specdec.drafter_state import to_bytes

            blob = await asyncio.to_thread(to_bytes, saved["worker"])
            return self._specdec_restore(saved, await _maybe_await(self.llm.collective_rpc("specdec_restore_state",
                                                                                           args=(blob,))))

    async def nccl_reshard_refit_async(self):
        return await self._specdec_refit(super(SpecDecVllmAsyncGenerationWorkerImpl, self).nccl_reshard_refit_async)

    async def checkpoint_engine_rpc_async(self, checkpoint_method, method_args=()):
        parent = super(SpecDecVllmAsyncGenerationWorkerImpl, self).checkpoint_engine_rpc_async
        if checkpoint_method != REFIT_CHECKPOINT_METHOD:
            return await parent(checkpoint_method, method_args)
        return await self._specdec_refit(parent, checkpoint_method, method_args)

    for name, fn in {**_optional(base, "nccl_reshard_refit_async", lambda: nccl_reshard_refit_async),
                     **_optional(base, "checkpoint_engine_rpc_async", lambda: checkpoint_engine_rpc_async)}.items():
        fn.__qualname__ = f"SpecDecVllmAsyncGenerationWorkerImpl.{name}"
        setattr(SpecDecVllmAsyncGenerationWorkerImpl, name, fn)
    return SpecDecVllmAsyncGenerationWorkerImpl


def _build_actor(name: str, impl_name: str, nsight_pattern: str) -> Any:
    import ray

    impl = globals().get(impl_name) or __getattr__(impl_name)
    nsight = api.resolve(api.NSIGHT_RUNTIME_ENV)
    cls = type(name, (impl,), {"__module__": __name__, "__qualname__": name, "__doc__": impl.__doc__})
    return ray.remote(runtime_env={**nsight(nsight_pattern)})(cls)


_BUILDERS = {
    "SpecDecVllmGenerationWorkerImpl": _build_sync_impl,
    "SpecDecVllmAsyncGenerationWorkerImpl": _build_async_impl,
    "SpecDecVllmGenerationWorker": lambda: _build_actor(
        "SpecDecVllmGenerationWorker", "SpecDecVllmGenerationWorkerImpl", "vllm_generation_worker"),
    "SpecDecVllmAsyncGenerationWorker": lambda: _build_actor(
        "SpecDecVllmAsyncGenerationWorker", "SpecDecVllmAsyncGenerationWorkerImpl", "vllm_async_generation_worker"),
}


def __getattr__(name: str) -> Any:
    builder = _BUILDERS.get(name)
    if builder is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = builder()
    if name.endswith("Impl"):
        # Importable names, so Ray's cloudpickle exports the actor class by reference: a method pickled
        # by value drags its globals along (a ContextVar cannot be pickled) and NeMo-RL's RayWorkerGroup
        # then fails to create the actor.
        cls.__module__, cls.__name__, cls.__qualname__ = __name__, name, name
        for attr, fn in vars(cls).items():
            if callable(fn) and getattr(fn, "__module__", None) == __name__:
                fn.__qualname__ = f"{name}.{attr}"
    globals()[name] = cls
    return cls
