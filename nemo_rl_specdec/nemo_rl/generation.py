"""`SpecDecVllmGeneration`: NeMo-RL's `VllmGeneration` (driver side) with speculative decoding.

Built when first looked up by FQN (module `__getattr__`), so this module imports without
NeMo-RL; `run_grpo` rebinds `nemo_rl.algorithms.grpo.VllmGeneration` to it. Worker selection
is not changed here: the patched `resolve_generation_worker_cls` picks our worker actors.
On top of NeMo-RL's behaviour it:

- `generate`: places requests on the data-parallel engines with the configured policy
  (`scheduling.placement`: `length_aware` = longest predicted first onto the least loaded engine,
  GRPO groups spread) instead of contiguous shards, then restores input order. Predictions
  come from the lengths each problem (hash of the prompt) produced before.
- `generate_async` (async engines): sends each request to the engine with the fewest
  outstanding predicted tokens (unless NeMo-RL's fleet-health selector is attached).
- `get_step_metrics`: NeMo-RL's `vllm/spec_*` counters plus our `specdec/*` metrics (versions,
  refresh time, acceptance by drafter lag, placement balance; see metrics.py).
"""
from __future__ import annotations

import contextvars
import warnings
from typing import Any

from nemo_rl_specdec.nemo_rl import api, metrics, payload, translate
from nemo_rl_specdec.nemo_rl.sharding import Planner

REQUIRED_OUTPUT_KEYS = ("output_ids", "generation_lengths", "unpadded_sequence_lengths", "logprobs")
RANK0_ONLY = ["tensor_parallel", "pipeline_parallel"]

# The engine chosen for the next `_next_dp_shard_idx()` call in this asyncio task (see generate_async).
_FORCED_SHARD: contextvars.ContextVar = contextvars.ContextVar("specdec_forced_shard", default=None)


class SpecDecGenerationState:
    """Driver-side state (no NeMo-RL): placement planner, acceptance-by-lag tracker, last placement stats."""

    def _specdec_setup(self, config: dict) -> None:
        self._specdec_spec = translate.enabled_spec(config)
        placement = self._specdec_spec.scheduling.placement if self._specdec_spec is not None else "contiguous"
        self._specdec_planner = Planner(placement, max_new_tokens=config.get("max_new_tokens"))
        self._specdec_tracker = metrics.AcceptanceByLag()
        self._specdec_placement_stats: dict = {}
        self._specdec_warned_no_drafts = False

    def _specdec_merge_metrics(self, base: dict, reports: list[dict]) -> dict:
        enabled = self._specdec_spec is not None
        extra = metrics.step_metrics(base, reports, self._specdec_tracker, self._specdec_placement_stats, enabled)
        self._specdec_placement_stats = {}
        hint = metrics.no_drafts_warning(base, enabled)
        if hint and not self._specdec_warned_no_drafts:
            warnings.warn(hint, RuntimeWarning, stacklevel=3)
            self._specdec_warned_no_drafts = True
        return {**base, **extra}


def _ray_get(futures: Any) -> Any:
    import ray

    return ray.get(futures)


def _build_generation() -> type:
    base = api.resolve(api.VLLM_GENERATION)

    class SpecDecVllmGeneration(SpecDecGenerationState, base):
        """NeMo-RL's VllmGeneration with length-aware placement and speculative-decoding metrics."""

        def __init__(self, cluster, config, name_prefix="vllm_policy", workers_per_node=None, defer_model_load=False):
            self._specdec_setup(config)
            super().__init__(cluster, config, name_prefix=name_prefix, workers_per_node=workers_per_node,
                             defer_model_load=defer_model_load)

        def generate(self, data, greedy=False):
            planner = self._specdec_planner
            if not planner.active:
                return super().generate(data, greedy=greedy)
            pids = payload.problem_ids(data["input_ids"], data["input_lengths"])
            plan = planner.plan(pids, self.dp_size)
            if plan is None:
                out = super().generate(data, greedy=greedy)
                planner.observe(pids, out["generation_lengths"].tolist())
                return out
            shards = [data.select_indices(indices) for indices in plan.assignment]
            future_bundle = self.worker_group.run_all_workers_sharded_data(
                "generate",
                data=shards,
                in_sharded_axes=["data_parallel"],
                replicate_on_axes=None,
                output_is_replicated=None,
                common_kwargs={"greedy": greedy},
            )
            results = self.worker_group.get_all_worker_results(future_bundle)
            batched = api.resolve(api.BATCHED_DATA_DICT)
            combined = batched.from_batches(results, pad_value_dict={"output_ids": self.cfg["_pad_token_id"]})
            combined = combined.select_indices(plan.restore)
            missing = [k for k in REQUIRED_OUTPUT_KEYS if k not in combined]
            if missing:
                raise ValueError(f"Missing required keys for GenerationOutputSpec: {missing}")
            lengths = combined["generation_lengths"].tolist()
            planner.observe(pids, lengths)
            self._specdec_placement_stats = {**plan.stats, **plan.actual_stats(lengths)}
            return combined

        async def generate_async(self, data, greedy=False):
            planner = self._specdec_planner
            if not planner.active or self.fleet_selector is not None or len(data["input_ids"]) != 1:
                async for item in super().generate_async(data, greedy=greedy):
                    yield item
                return
            pid = payload.problem_ids(data["input_ids"], data["input_lengths"])[0]
            engine, predicted = planner.pick(pid, self.worker_group.dp_size)
            # NeMo-RL picks the shard with `_next_dp_shard_idx()` synchronously inside the first
            # step of `generate_async`, in this same task: hand it our pick through a ContextVar.
            _FORCED_SHARD.set(engine)
            try:
                async for item in super().generate_async(data, greedy=greedy):
                    planner.observe([pid], item[1]["generation_lengths"].tolist())
                    yield item
            finally:
                _FORCED_SHARD.set(None)
                planner.release(engine, predicted)

        def _next_dp_shard_idx(self):
            forced = _FORCED_SHARD.get()
            if forced is not None:
                _FORCED_SHARD.set(None)
                return forced
            return super()._next_dp_shard_idx()

        def get_step_metrics(self):
            base = super().get_step_metrics()
            return self._specdec_merge_metrics(base, self._specdec_reports())

        def _specdec_reports(self) -> list[dict]:
            futures = self.worker_group.run_all_workers_single_data("specdec_report", run_rank_0_only_axes=RANK0_ONLY)
            return [r for r in _ray_get(futures) if r]

    return SpecDecVllmGeneration


def __getattr__(name: str) -> Any:
    if name == "SpecDecVllmGeneration":
        cls = _build_generation()
        cls.__module__, cls.__qualname__ = __name__, name
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
