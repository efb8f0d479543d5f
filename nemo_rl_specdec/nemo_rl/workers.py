"""NeMo-RL vLLM worker actors with speculative decoding (sync and async engines).

`SpecDecVllmGenerationWorker` / `SpecDecVllmAsyncGenerationWorker` are Ray actors built on
NeMo-RL's `VllmGenerationWorkerImpl` / `VllmAsyncGenerationWorkerImpl` (the ModelOpt worker is
the precedent). They are created when first looked up by FQN (module `__getattr__`), so this
module imports without NeMo-RL, and NeMo-RL's `RayWorkerBuilder` finds them by FQN in the worker
venv. On top of NeMo-RL's behaviour they:

- inject our composite worker extension (`_create_engine`), and forward PYTHONPATH into vLLM's
  own TP workers (`extra_env_vars`) so it imports there;
- call `specdec_init(block)` in every vLLM worker once the engine is up (`post_init[_async]`);
- keep the rollouts they generate (suffix drafter, online drafters) and, right before every
  refit RPC, stage them with the next policy version into the engine (`specdec_stage_update`);
  the refit itself then refreshes the drafter in its finalize step (see extension.py);
- answer `specdec_report()` for the driver's step metrics.

A policy version here counts the weight updates an engine has received (1 = first refit).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from nemo_rl_specdec.nemo_rl import api, payload, translate

logger = logging.getLogger(__name__)

REFIT_CHECKPOINT_METHOD = "update_weights_from_checkpoint_engine"


class SpecDecWorkerState:
    """Engine-independent state of one worker actor (no NeMo-RL, no Ray); unit-tested directly."""

    def _specdec_setup(self, config: dict, stash_tokens: int = 16_000_000) -> None:
        self._specdec_spec = translate.enabled_spec(config)
        self._specdec_init_payload = translate.engine_init_payload(config)
        self._specdec_version = 0
        self._specdec_last_staged = 0
        want = False
        if self._specdec_spec is not None:
            source = config.get(translate.WEIGHT_SOURCE_KEY) or translate.drafter_weight_source(
                self._specdec_spec, False, bool(config.get("_mtp_weights_from_refit")))
            want = translate.wants_rollouts(self._specdec_spec, source)
        self._specdec_stash = payload.RolloutStash(stash_tokens) if want else None
        self._specdec_observe_errors = 0

    @property
    def specdec_enabled(self) -> bool:
        return self._specdec_spec is not None

    def _specdec_observe(self, data: Any, output: Any) -> None:
        """Keep a generation's rollouts for the next update. Never fails generation."""
        if self._specdec_stash is None:
            return
        try:
            self._specdec_stash.add(payload.extract_rollouts(
                data["input_ids"], data["input_lengths"], output["output_ids"], output["generation_lengths"],
                self._specdec_version,
            ))
        except Exception:  # a bug here must not cost the rollout; the drafter just misses it
            self._specdec_observe_errors += 1
            if self._specdec_observe_errors == 1:
                logger.exception("[specdec] could not record rollouts for the drafter (logged once)")

    def _specdec_next_payload(self) -> dict:
        rollouts = self._specdec_stash.drain() if self._specdec_stash is not None else []
        self._specdec_last_staged = len(rollouts)
        return payload.stage_payload(self._specdec_version + 1, rollouts)

    def _specdec_combine(self, per_rank: list) -> dict:
        """One report per engine from the per-TP/PP-rank `specdec_report` results."""
        per_rank = [r for r in (per_rank or []) if r]
        if not per_rank:
            return {}
        first = dict(per_rank[0])
        key = lambda r: ((r.get("state") or {}).get("policy_version"), (r.get("state") or {}).get("drafter_version"))
        first["ranks_agree"] = len({key(r) for r in per_rank}) == 1
        first["rollouts_staged"] = self._specdec_last_staged
        first["rollouts_dropped"] = self._specdec_stash.dropped if self._specdec_stash is not None else 0
        first["actor_policy_version"] = self._specdec_version
        return first


async def _maybe_await(x: Any) -> Any:
    while asyncio.iscoroutine(x) or isinstance(x, asyncio.Future):
        x = await x
    return x


def _build_sync_impl() -> type:
    base = api.resolve(api.SYNC_WORKER_IMPL)

    class SpecDecVllmGenerationWorkerImpl(SpecDecWorkerState, base):
        """NeMo-RL's sync vLLM worker with speculative decoding (see module docstring)."""

        def __init__(self, config, bundle_indices=None, fraction_of_gpus=1.0, seed=None,
                     extra_env_vars=None, defer_model_load=False):
            self._specdec_setup(config)
            super().__init__(config, bundle_indices=bundle_indices, fraction_of_gpus=fraction_of_gpus, seed=seed,
                             extra_env_vars=translate.extra_env_var_names(extra_env_vars),
                             defer_model_load=defer_model_load)

        def _create_engine(self, llm_kwargs):
            if self.specdec_enabled:
                translate.inject_extension(llm_kwargs)
            super()._create_engine(llm_kwargs)

        def post_init(self):
            result = super().post_init()
            if self.specdec_enabled and self.llm is not None:
                self.specdec_init_reports = self.llm.collective_rpc("specdec_init", args=(self._specdec_init_payload,))
            return result

        def generate(self, data, greedy=False):
            out = super().generate(data, greedy=greedy)
            self._specdec_observe(data, out)
            return out

        def _specdec_refit(self, call, *args):
            if not self.specdec_enabled or self.llm is None:
                return call(*args)
            staged = self._specdec_next_payload()
            self.llm.collective_rpc("specdec_stage_update", args=(staged,))
            ok = call(*args)
            if ok:
                self._specdec_version = staged["version"]
            return ok

        def update_weights_via_ipc_zmq(self):
            return self._specdec_refit(super().update_weights_via_ipc_zmq)

        def update_weights_from_collective(self):
            return self._specdec_refit(super().update_weights_from_collective)

        def nccl_reshard_refit(self):
            return self._specdec_refit(super().nccl_reshard_refit)

        def checkpoint_engine_rpc(self, checkpoint_method, method_args=()):
            if checkpoint_method != REFIT_CHECKPOINT_METHOD:
                return super().checkpoint_engine_rpc(checkpoint_method, method_args)
            return self._specdec_refit(super().checkpoint_engine_rpc, checkpoint_method, method_args)

        def specdec_report(self) -> dict:
            if not self.specdec_enabled or self.llm is None:
                return {}
            return self._specdec_combine(self.llm.collective_rpc("specdec_report"))

    return SpecDecVllmGenerationWorkerImpl


def _build_async_impl() -> type:
    base = api.resolve(api.ASYNC_WORKER_IMPL)

    class SpecDecVllmAsyncGenerationWorkerImpl(SpecDecWorkerState, base):
        """NeMo-RL's async vLLM worker with speculative decoding (see module docstring)."""

        def __init__(self, config, bundle_indices=None, fraction_of_gpus=1.0, seed=None,
                     extra_env_vars=None, defer_model_load=False):
            self._specdec_setup(config)
            super().__init__(config, bundle_indices=bundle_indices, fraction_of_gpus=fraction_of_gpus, seed=seed,
                             extra_env_vars=translate.extra_env_var_names(extra_env_vars),
                             defer_model_load=defer_model_load)

        def _create_engine(self, llm_kwargs):
            if self.specdec_enabled:
                translate.inject_extension(llm_kwargs)
            super()._create_engine(llm_kwargs)

        async def post_init_async(self):
            result = await super().post_init_async()
            if self.specdec_enabled and self.llm is not None:
                self.specdec_init_reports = await _maybe_await(
                    self.llm.collective_rpc("specdec_init", args=(self._specdec_init_payload,)))
            return result

        async def generate_async(self, data, greedy=False):
            async for item in super().generate_async(data, greedy=greedy):
                self._specdec_observe(data, item[1])
                yield item

        async def _specdec_refit(self, call, *args):
            if not self.specdec_enabled or self.llm is None:
                return await call(*args)
            staged = self._specdec_next_payload()
            await _maybe_await(self.llm.collective_rpc("specdec_stage_update", args=(staged,)))
            ok = await call(*args)
            if ok:
                self._specdec_version = staged["version"]
            return ok

        async def update_weights_via_ipc_zmq_async(self):
            return await self._specdec_refit(super().update_weights_via_ipc_zmq_async)

        async def update_weights_from_collective_async(self):
            return await self._specdec_refit(super().update_weights_from_collective_async)

        async def nccl_reshard_refit_async(self):
            return await self._specdec_refit(super().nccl_reshard_refit_async)

        async def checkpoint_engine_rpc_async(self, checkpoint_method, method_args=()):
            if checkpoint_method != REFIT_CHECKPOINT_METHOD:
                return await super().checkpoint_engine_rpc_async(checkpoint_method, method_args)
            return await self._specdec_refit(super().checkpoint_engine_rpc_async, checkpoint_method, method_args)

        async def specdec_report(self) -> dict:
            if not self.specdec_enabled or self.llm is None:
                return {}
            return self._specdec_combine(await _maybe_await(self.llm.collective_rpc("specdec_report")))

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
        cls.__module__, cls.__name__, cls.__qualname__ = __name__, name, name
    globals()[name] = cls
    return cls
