"""`SpecDecVllmGeneration`: NeMo-RL's `VllmGeneration` (driver side) with speculative decoding.

Built when first looked up by FQN (module `__getattr__`), so this module imports without
NeMo-RL; `run_grpo` rebinds `nemo_rl.algorithms.grpo.VllmGeneration` to it. Worker selection
is not changed here: the patched `resolve_generation_worker_cls` picks our worker actors.
On top of NeMo-RL's behaviour it:

- `__init__`: before any engine starts, runs the preflight in the worker actors' own Python
  (preflight.py: the drafter's libraries import, and the speculative_config fits that vLLM), and
  starts the rollout exchange the engines swap rollouts through (its name reaches the workers in
  the generation config);
- `generate`: places requests on the data-parallel engines with the configured policy
  (`scheduling.placement`), attaches each request's draft budget (`scheduling.budget`) and
  predicted length, marks validation batches so their rollouts never reach the drafter, then
  restores input order. Predictions come from the lengths each problem produced before;
- `generate_async` (async engines): sends each request to the engine with the fewest
  outstanding predicted tokens (unless NeMo-RL's fleet-health selector is attached) by setting
  `current_generate_dp_shard_idx`, which both supported NeMo-RL versions read before their first
  await;
- `finish_generation` (sync GRPO calls it when a rollout phase ends, before the policy trains): when
  training batches went through `generate` / `generate_async` since the last call, first has every
  engine swap its rollouts and stage them for a background rebuild of the DAS store (workers.py,
  `specdec_stage_generated`), then runs NeMo-RL's (sleep when colocated, else a prefix-cache reset);
  the refit then installs the rebuilt store instead of rebuilding it;
- NeMo-RL's checkpoint (adapter/checkpoint.py): `specdec_export_state` gives every engine's state to
  the save; at a resume, `__init__` restores it into the engines once they are up;
- `get_step_metrics`: NeMo-RL's `vllm/spec_*` counters plus our `specdec/*` metrics (versions,
  refresh time, acceptance by drafter lag, placement balance; see metrics.py).
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Any

from nemo_rl_specdec.adapter import api, checkpoint, metrics, payload, preflight, sharding, translate
from nemo_rl_specdec.lockstep import DrafterRefreshError

REQUIRED_OUTPUT_KEYS = ("output_ids", "generation_lengths", "unpadded_sequence_lengths", "logprobs")
RANK0_ONLY = ["tensor_parallel", "pipeline_parallel"]


class SpecDecGenerationState:
    """Driver-side state (no NeMo-RL): placement planner, acceptance-by-lag tracker, last placement stats."""

    def _specdec_setup(self, config: dict) -> None:
        self._specdec_spec = translate.enabled_spec(config)
        self._specdec_planner = sharding.planner_for(self._specdec_spec, config.get("max_new_tokens"))
        self._specdec_tracker = metrics.AcceptanceByLag()
        self._specdec_placement_stats: dict = {}
        self._specdec_warned_no_drafts = False
        self._specdec_validating = False
        self._specdec_stages = self._specdec_spec is not None and translate.rollouts_wanted(self._specdec_spec)
        self._specdec_stage_reports: list = []  # what each engine staged at the last finish_generation
        self._specdec_generated = False  # a training batch went through this object since finish_generation
        self._specdec_last_read: list[dict] = []  # each engine's counters at NeMo-RL's last read of them
        self._specdec_window_start: list[dict] | None = None  # ... at its snapshot_step_metrics

    def _specdec_mark(self, data: Any, budgets=None, predicted=None) -> Any:
        """Add the driver's per-row keys (validation marker, budgets) to a generation batch."""
        import torch

        n = len(data["input_ids"])
        self._specdec_generated |= not self._specdec_validating
        data[payload.NO_RECORD_KEY] = torch.full((n,), self._specdec_validating, dtype=torch.bool)
        if budgets is not None:
            data[payload.BUDGET_KEY] = torch.tensor([-1 if b is None else int(b) for b in budgets], dtype=torch.long)
            data[payload.PREDICTED_KEY] = torch.tensor([-1.0 if p is None else float(p) for p in predicted])
        return data

    def _specdec_merge_metrics(self, base: dict, reports: list[dict]) -> dict:
        enabled = self._specdec_spec is not None
        start, self._specdec_window_start = self._specdec_window_start, None
        counted = metrics.window(start or [], self._specdec_last_read)
        extra = metrics.step_metrics(base, reports, self._specdec_tracker, self._specdec_placement_stats, enabled,
                                     counted)
        self._specdec_placement_stats = {}
        rate = base.get("vllm/spec_acceptance_rate")
        if rate is not None:
            self._specdec_planner.acceptance = float(rate)
        hint = metrics.no_drafts_warning(base, enabled, counted)
        if hint and not self._specdec_warned_no_drafts:
            warnings.warn(hint, RuntimeWarning, stacklevel=3)
            self._specdec_warned_no_drafts = True
        return {**base, **extra}


@contextmanager
def validating(generation: Any):
    """While NeMo-RL validates, the generation's rollouts are marked and never reach the drafter."""
    before = getattr(generation, "_specdec_validating", None)
    if before is None:
        yield
        return
    generation._specdec_validating = True
    try:
        yield
    finally:
        generation._specdec_validating = before


def _ray_get(futures: Any) -> Any:
    import ray

    return ray.get(futures)


def _build_generation() -> type:
    base: Any = api.resolve(api.VLLM_GENERATION)

    class SpecDecVllmGeneration(SpecDecGenerationState, base):
        """NeMo-RL's VllmGeneration with length-aware placement and speculative-decoding metrics."""

        def __init__(self, cluster, config, name_prefix="vllm_policy", workers_per_node=None, defer_model_load=False):
            self._specdec_setup(config)
            self._specdec_exchange = None
            spec = self._specdec_spec
            if spec is not None:
                async_engine = bool((config.get("vllm_cfg") or {}).get("async_engine"))
                preflight.check(spec, config, translate.OUR_ASYNC_WORKER if async_engine else translate.OUR_SYNC_WORKER)
                if translate.rollouts_wanted(spec):
                    import uuid

                    from nemo_rl_specdec.adapter.exchange import exchange_actor_class

                    name = f"specdec_rollouts_{name_prefix}_{uuid.uuid4().hex[:8]}"
                    self._specdec_exchange = exchange_actor_class().options(name=name).remote()
                    config[translate.EXCHANGE_KEY] = name
            super().__init__(cluster, config, name_prefix=name_prefix, workers_per_node=workers_per_node,
                             defer_model_load=defer_model_load)
            session = checkpoint.session()
            if spec is not None and session is not None:
                session.attach_generation(self)
                saved = session.engines_state()
                if saved is not None:
                    self.specdec_restored = self._specdec_restore(saved)

        def specdec_export_state(self) -> dict:
            """This generation's part of NeMo-RL's checkpoint: every engine's (workers.py `_specdec_saved`),
            in engine order, and the driver's planner (the lengths each problem produced, the acceptance)."""
            futures = self.worker_group.run_all_workers_single_data("specdec_export_state",
                                                                    run_rank_0_only_axes=RANK0_ONLY)
            return {"engines": [r for r in _ray_get(futures) if r], "planner": self._specdec_planner.state_dict()}

        def _specdec_restore(self, saved: dict) -> list[dict]:
            """Engine i takes saved engine i's state (i modulo the saved engines, on a resume with more);
            the planner takes the saved one."""
            engines = saved["engines"]
            per_engine = [engines[i % len(engines)] for i in range(self.dp_size)]
            futures = self.worker_group.run_all_workers_multiple_data(
                "specdec_restore_state", run_rank_0_only_axes=RANK0_ONLY, saved=per_engine)
            self._specdec_planner.load_state_dict(saved["planner"])
            return [r for r in _ray_get(futures) if r]

        def generate(self, data, greedy=False):
            planner = self._specdec_planner
            if self._specdec_spec is None:
                return super().generate(data, greedy=greedy)
            pids = payload.problem_ids(data["input_ids"], data["input_lengths"])
            plan = sharding.shard(planner, pids, self.dp_size)
            if plan is None:
                out = super().generate(self._specdec_mark(data), greedy=greedy)
                planner.observe(pids, out["generation_lengths"].tolist())
                return out
            data = self._specdec_mark(data, *sharding.budgets_to_send(planner, plan))
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
            self._specdec_placement_stats = sharding.placement_stats(plan, lengths)
            return combined

        async def generate_async(self, data, greedy=False):
            planner = self._specdec_planner
            if self._specdec_spec is not None:
                data = self._specdec_mark(data)
            if (not sharding.reshards(planner) or getattr(self, "fleet_selector", None) is not None
                    or len(data["input_ids"]) != 1):
                async for item in super().generate_async(data, greedy=greedy):
                    yield item
                return
            pid = payload.problem_ids(data["input_ids"], data["input_lengths"])[0]
            engine, predicted = planner.pick(pid, self.worker_group.dp_size)
            # Both supported NeMo-RL versions read this attribute before the first await of the
            # call below (api.shard_index_is_read_synchronously), in this same task.
            self.current_generate_dp_shard_idx = engine
            try:
                async for item in super().generate_async(data, greedy=greedy):
                    planner.observe([pid], item[1]["generation_lengths"].tolist())
                    yield item
            finally:
                planner.release(engine, predicted)

        def finish_generation(self, *args, **kwargs):
            # Stage only after training batches went through this object: sync GRPO's rollout phases.
            # Async GRPO generates in its trajectory collector and calls this only after validation,
            # so there the refit hands the rollouts over (a staging would fence the store for a step).
            if self._specdec_stages and self._specdec_generated:
                futures = self.worker_group.run_all_workers_single_data("specdec_stage_generated",
                                                                        run_rank_0_only_axes=RANK0_ONLY)
                self._specdec_stage_reports = [r for r in _ray_get(futures) if r]
            self._specdec_generated = False
            return super().finish_generation(*args, **kwargs)

        def prepare_for_generation(self, *args, **kwargs):
            # NeMo-RL's own catches every error of its engines' wake-up and prints it: a drafter our
            # wake-up check could not bring back is raised here, named, before anything drafts with it
            out = super().prepare_for_generation(*args, **kwargs)
            if self._specdec_spec is not None:
                futures = self.worker_group.run_all_workers_single_data("specdec_wake_error",
                                                                        run_rank_0_only_axes=RANK0_ONLY)
                failed = [e for e in _ray_get(futures) if e]
                if failed:
                    raise DrafterRefreshError(f"the drafter check after the engines' wake-up failed on {len(failed)} "
                                              f"engine(s): {failed[0]}")
            return out

        def _get_raw_spec_counters(self):
            # NeMo-RL's own read (every engine's vLLM metrics, its spec counters summed), keeping each
            # engine's generated tokens from the same read: the two ends of NeMo-RL's metrics window
            futures = self.worker_group.run_all_workers_single_data("_get_raw_spec_counters",
                                                                    run_rank_0_only_axes=RANK0_ONLY)
            raw = list(_ray_get(futures))
            self._specdec_last_read = [metrics.counters_of(r) for r in raw]
            return api.resolve(api.AGGREGATE_SPEC_COUNTERS)(raw)

        def snapshot_step_metrics(self):
            super().snapshot_step_metrics()
            self._specdec_window_start = self._specdec_last_read

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
