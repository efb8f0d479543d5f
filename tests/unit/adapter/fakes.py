"""Stand-ins for NeMo-RL (it cannot be installed here; tests/adapter/ runs our adapter against its
real classes from a source checkout) and the NeMo-RL-shaped inputs the adapter receives.

Each stand-in's docstring names the NeMo-RL class or module it replaces and what of it the tests
need. `STAND_INS` maps NeMo-RL's module paths to them; the `fake_nemo_rl` fixture (conftest.py)
installs them. Builders (`spec`, `gen_cfg`, `run_dict`, `worker_cfg`, `batch`, ...) make the
generation configs, run dicts and batches NeMo-RL would hand the adapter."""
from __future__ import annotations

import asyncio
import importlib
import importlib.machinery
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from nemo_rl_specdec.adapter import api, extension, metrics, translate
from nemo_rl_specdec.config.run import SpecDecConfig
from nemo_rl_specdec.update import UpdateReport

REPO = Path(__file__).resolve().parents[3]


NEMO_RL_INSTALLED = api.nemo_rl_available()


def spec(**block) -> SpecDecConfig:
    """An enabled speculative block as the adapter validates it."""
    return SpecDecConfig.model_validate({"enabled": True, **block})


def gen_cfg(**block) -> dict:
    """Stands in for a composed `policy.generation` of a NeMo-RL run, with our block."""
    return {"backend": "vllm", "temperature": 1.0, "top_p": 1.0, "top_k": None, "max_new_tokens": 256,
            "vllm_cfg": {"async_engine": False, "precision": "bfloat16"}, "vllm_kwargs": {},
            "speculative_decoding": {"enabled": True, **block}}


def run_dict(gen: dict, **policy) -> dict:
    """Stands in for a composed NeMo-RL run dict around a generation config."""
    return {"policy": {"model_name": "Qwen/Qwen3-8B", "generation": gen, **policy}}


def write_file(path: Path, text: str) -> Path:
    """Write a (YAML) file, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def nrl_step(drafts, draft_tokens, accepted) -> dict:
    """Keys as NeMo-RL's compute_spec_decode_metrics returns them (prefix `vllm/`)."""
    length, rate = metrics.acceptance(drafts, draft_tokens, accepted)
    return {metrics.NRL_DRAFTS: drafts, metrics.NRL_DRAFT_TOKENS: draft_tokens, metrics.NRL_ACCEPTED: accepted,
            metrics.NRL_ACCEPTANCE_LENGTH: length, metrics.NRL_ACCEPTANCE_RATE: rate}


class RecordingEngineMixin:
    """Stands in for our engine mixin (nemo_rl_specdec.engine.worker_extension.SpecDecWorkerExtension,
    which needs a live vLLM worker): records the calls the NeMo-RL hooks make and keeps versions."""

    policy_version = 0
    drafter_version = 0
    fail_next = False

    def specdec_init(self, spec: dict) -> dict:
        self.calls = getattr(self, "calls", []) + [("init", spec)]
        return {"ok": True}

    def _specdec_num_layers(self):
        return None

    def specdec_verify_drafter(self, restore=True):
        self.verified = getattr(self, "verified", []) + [restore]
        return {"checked": True, "restored": False}

    refuses_level = None  # the sleep level this rank's drafter cannot come back from (a hub id at level 2)

    def specdec_check_restorable(self, level):
        self.checked_levels = getattr(self, "checked_levels", []) + [level]
        if self.refuses_level is not None and level >= self.refuses_level:
            from nemo_rl_specdec.config.run import ConfigError

            raise ConfigError(f"policy.generation.vllm_cfg.sleep_level: got {level} (fake rank)")
        return {"level": level, "source": None}

    def specdec_after_policy_weights(self, update, loaded_names=None, loaded_drafter=None):
        version = update.version
        self.calls = getattr(self, "calls", []) + [("after", list(loaded_names), version, update.drafter_weights,
                                                    update.rollouts)]
        self.checkpoint_claims = getattr(self, "checkpoint_claims", []) + [update.drafter_checkpoint]
        self.refreshes = getattr(self, "refreshes", []) + [update.refresh_drafter]
        self.log = getattr(self, "log", []) + ["specdec_after_policy_weights"]
        if self.fail_next:
            raise RuntimeError("drafter refresh exploded")
        self.policy_version = version
        if update.refresh_drafter:
            self.drafter_version = version
        return UpdateReport(policy_version=version, mode="rebuild", drafter_refreshed=update.refresh_drafter,
                            refresh_s=0.25, state={"policy_version": version, "drafter_version": version})

    def specdec_stage_rollouts(self, rollouts, version):
        self.staged = getattr(self, "staged", []) + [(version, sorted(r.prompt_token_ids.tolist() for r in rollouts))]
        return {"staged_version": version, "rollouts": len(rollouts), "appended": len(self.staged) > 1}

    def specdec_stage_failed(self, version, reason):
        self.stage_errors = getattr(self, "stage_errors", []) + [(version, reason)]

    def specdec_state(self) -> dict:
        return {"policy_version": self.policy_version, "drafter_version": self.drafter_version,
                "drafter_fingerprint": "f", "disabled": False}

    def specdec_export_state(self) -> bytes:
        from nemo_rl_specdec.drafter_state import to_bytes

        return to_bytes({"state": {"policy_version": self.policy_version, "drafter_version": self.drafter_version},
                         "proposer": None})

    def specdec_restore_state(self, blob: bytes) -> dict:
        from nemo_rl_specdec.drafter_state import from_bytes

        saved = from_bytes(blob)
        self.policy_version, self.drafter_version = saved["state"]["policy_version"], saved["state"]["drafter_version"]
        return {**self.specdec_state(), "restored_entries": 0}


class FakeHostExtension:
    """Stands in for NeMo-RL's VllmInternalWorkerExtension where NeMo-RL cannot be imported (CI):
    per-bucket `_load_weights` and the two refit RPCs, which load every bucket and return True, or
    False when loading raised, as v0.7.0's do (main adds a lifecycle hook we no longer use).
    tests/adapter/ composes our hooks with the real class on both versions."""

    def _load_weights(self, weights):
        self.loaded = getattr(self, "loaded", []) + [name for name, _ in weights]
        self.log = getattr(self, "log", []) + ["host_load"]

    def _get_drafter_model(self):
        owner = getattr(self.model_runner, "drafter", None)
        return getattr(owner, "model", None) if owner else None

    def update_weights_via_ipc_zmq(self):
        return self.update_weights_from_collective()

    def update_weights_from_collective(self):
        try:
            for bucket in self.incoming:
                self._load_weights(bucket)
        except Exception:
            return False
        return True


class FakeCheckpointEngineMixin:
    """Stands in for NeMo-RL's VllmCheckpointEngineMixin (NeMo-RL cannot be installed here):
    the checkpoint-engine refit loads through `_load_weights` without the lifecycle."""

    async def _update_weights_from_checkpoint_engine_async(self):
        for bucket in self.incoming:
            self._load_weights(bucket)
        return True


class FakeHostExtensionWithCheckpointEngine(FakeCheckpointEngineMixin, FakeHostExtension):
    """Stands in for NeMo-RL's VllmInternalWorkerExtensionWithCheckpointEngine (NeMo-RL cannot be installed here)."""


def make_engine_worker(host=FakeHostExtension, extra=(), drafter=None):
    """A vLLM worker with our hooks composed over a stand-in host extension and the recording engine mixin."""
    cls = extension.build_extension("TestComposite", host, RecordingEngineMixin, extra)
    w = cls()
    w.model_runner = SimpleNamespace(drafter=drafter)
    w.incoming = [[("model.layers.0.w", 1), ("lm_head.weight", 2)], [("draft.fc.weight", 3)]]
    return w


class FakeLLM:
    """Stands in for vllm.LLM as NeMo-RL's worker uses it (collective_rpc over the TP ranks)."""

    def __init__(self, ranks):
        self.ranks = ranks
        self.requests = []

    def collective_rpc(self, method, args=()):
        return [getattr(r, method)(*args) for r in self.ranks]

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        self.requests.append((prompts, sampling_params))

    def sleep(self, level: int = 1):
        self.slept = getattr(self, "slept", []) + [level]


class FakeAsyncLLM(FakeLLM):
    """Stands in for vLLM's AsyncLLM: collective_rpc and sleep are awaited."""

    async def collective_rpc(self, method, args=()):
        await asyncio.sleep(0)
        return FakeLLM.collective_rpc(self, method, args)

    async def sleep(self, level: int = 1):
        await asyncio.sleep(0)
        FakeLLM.sleep(self, level)


def fake_generate_rows(data) -> dict:
    """Deterministic 'generation': each prompt yields (sum(prompt) % 5) + 1 tokens."""
    ids, lens = np.asarray(data["input_ids"]), np.asarray(data["input_lengths"])
    rows, gl = [], []
    for row, n in zip(ids, lens, strict=True):
        prompt = [int(t) for t in row[:n]]
        g = sum(prompt) % 5 + 1
        rows.append(prompt + [100 + t for t in range(g)])
        gl.append(g)
    width = max((len(r) for r in rows), default=0)
    out = np.zeros((len(rows), width), dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return {"output_ids": out, "generation_lengths": np.array(gl), "unpadded_sequence_lengths": lens + np.array(gl),
            "logprobs": np.zeros((len(rows), width))}


class FakeBatchedDataDict(dict):
    """Stands in for nemo_rl.distributed.batched_data_dict.BatchedDataDict (NeMo-RL cannot be
    installed here): the two methods the adapter uses, with the recorded parameters."""

    @classmethod
    def from_batches(cls, batches, pad_value_dict=None, *, allow_missing_packed_tensors=False):
        pad_value_dict = pad_value_dict or {}
        out = cls()
        for k in batches[0]:
            vals = [np.asarray(b[k]) for b in batches]
            if vals[0].ndim == 2:
                width = max(v.shape[1] for v in vals)
                vals = [np.pad(v, ((0, 0), (0, width - v.shape[1])), constant_values=pad_value_dict.get(k, 0))
                        for v in vals]
            out[k] = np.concatenate(vals)
        return out

    def select_indices(self, indices):
        return type(self)({k: np.asarray(v)[list(indices)] for k, v in self.items()})


class FakeGenerationWorkerImpl:
    """Stands in for NeMo-RL's VllmGenerationWorkerImpl (NeMo-RL cannot be installed here).
    Builds `llm_kwargs` with NeMo-RL's host extension FQN and calls `_create_engine`, as recorded."""

    ranks = 2
    use_checkpoint_engine = False

    def __init__(self, config, bundle_indices=None, fraction_of_gpus=1.0, seed=None, extra_env_vars=None,
                 defer_model_load=False):
        self.cfg = config
        self.extra_env_vars = extra_env_vars
        self.is_model_owner = bundle_indices is not None
        self.llm = None
        if self.is_model_owner and not defer_model_load:
            host = api.HOST_EXTENSION_CKPT if self.use_checkpoint_engine else api.HOST_EXTENSION
            self._create_engine({"model": config["model_name"], "worker_extension_cls": host, "seed": seed})

    @staticmethod
    def configure_worker(num_gpus, bundle_indices=None, num_gpus_per_node=None):
        return {}, {}, {}, {}

    def _create_engine(self, llm_kwargs):
        self.llm_kwargs = dict(llm_kwargs)
        self.llm = FakeLLM([make_engine_worker() for _ in range(self.ranks)])

    def post_init(self):
        self.post_init_done = True

    def _get_raw_spec_counters(self):
        """vLLM's metrics by name, as NeMo-RL's worker reads them (names as vLLM's metrics reader gives them)."""
        return dict(getattr(self, "raw_counters", {"vllm:generation_tokens": 0.0}))

    def generate(self, data, greedy=False):
        import vllm

        prompts = [{"prompt_token_ids": [int(t) for t in row[:n]]}
                   for row, n in zip(np.asarray(data["input_ids"]), np.asarray(data["input_lengths"]), strict=True)]
        self.llm.generate(prompts, vllm.SamplingParams(temperature=1.0, max_tokens=8), use_tqdm=False)
        return FakeBatchedDataDict(fake_generate_rows(data))

    def _refit_rpc(self, method):
        """As NeMo-RL's workers do: an exception from any rank's RPC is a failed refit (False)."""
        try:
            return all(self.llm.collective_rpc(method))
        except Exception:
            return False

    def update_weights_via_ipc_zmq(self):
        return self._refit_rpc("update_weights_via_ipc_zmq")

    def update_weights_from_collective(self):
        return self._refit_rpc("update_weights_from_collective")

    def nccl_reshard_refit(self):
        return self._refit_rpc("update_weights_from_collective")

    def checkpoint_engine_rpc(self, checkpoint_method, method_args=()):
        return ("passthrough", checkpoint_method)

    def wake_up(self, **kwargs):
        self.woken = getattr(self, "woken", []) + [kwargs.get("tags")]
        return True


class FakeAsyncGenerationWorkerImpl(FakeGenerationWorkerImpl):
    """Stands in for NeMo-RL's VllmAsyncGenerationWorkerImpl (NeMo-RL cannot be installed here)."""

    def _create_engine(self, llm_kwargs):
        self.llm_kwargs = dict(llm_kwargs)
        self.llm = FakeAsyncLLM([make_engine_worker() for _ in range(self.ranks)])

    async def post_init_async(self):
        self.post_init_done = True

    async def generate_async(self, data, greedy=False):
        await asyncio.sleep(0)
        yield 0, FakeBatchedDataDict(fake_generate_rows(data))

    async def _refit_rpc_async(self, method):
        try:
            return all(await self.llm.collective_rpc(method))
        except Exception:
            return False

    async def update_weights_via_ipc_zmq_async(self):
        return await self._refit_rpc_async("update_weights_via_ipc_zmq")

    async def update_weights_from_collective_async(self):
        return await self._refit_rpc_async("update_weights_from_collective")

    async def nccl_reshard_refit_async(self):
        return await self._refit_rpc_async("update_weights_from_collective")

    async def checkpoint_engine_rpc_async(self, checkpoint_method, method_args=()):
        return ("passthrough", checkpoint_method)

    async def wake_up_async(self, **kwargs):
        self.woken = getattr(self, "woken", []) + [kwargs.get("tags")]
        return True


class FakeWorkerGroup:
    """Stands in for NeMo-RL's RayWorkerGroup (NeMo-RL cannot be installed here): runs each call
    inline on one engine per data-parallel rank instead of through Ray."""

    def __init__(self, engines):
        self.engines = engines
        self.calls = []

    @property
    def dp_size(self):
        return len(self.engines)

    def run_all_workers_single_data(self, method_name, *args, run_rank_0_only_axes=None, **kwargs):
        return [getattr(e, method_name)(*args, **kwargs) for e in self.engines]

    def run_all_workers_sharded_data(self, method_name, *args, in_sharded_axes=None, replicate_on_axes=None,
                                     output_is_replicated=None, make_dummy_calls_to_free_axes=False,
                                     common_kwargs=None, **kwargs):
        self.calls.append([np.asarray(d["input_ids"]).tolist() for d in kwargs["data"]])
        return [getattr(e, method_name)(d, **(common_kwargs or {}))
                for e, d in zip(self.engines, kwargs["data"], strict=True)]

    def get_all_worker_results(self, future_bundle, return_generators_as_proxies=False):
        return future_bundle


class FakeEngine:
    """One data-parallel engine behind FakeWorkerGroup."""

    def __init__(self, state=None):
        self.state = state or {"policy_version": 1, "drafter_version": 1, "disabled": False}
        self.counters = {"generated_tokens": 0.0, "drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0}

    def generate(self, data, greedy=False):
        return FakeBatchedDataDict(fake_generate_rows(data))

    def specdec_report(self):
        return {"state": dict(self.state), "last_update": {"refresh_s": 0.1, "tensors_applied": 0}, "ranks_agree": True,
                "counters": dict(self.counters)}

    def _get_raw_spec_counters(self):
        """This engine's vLLM metrics by name, as NeMo-RL's worker reads them."""
        return {name: self.counters[key] for key, name in metrics.VLLM_COUNTERS.items()}

    def specdec_stage_generated(self):
        self.stage_calls = getattr(self, "stage_calls", 0) + 1
        return {"version": 2, "rollouts": 3, "stage_s": 0.01, "errors": 0}

    wake_failure = ""  # why our drafter check failed at the last wake-up (SpecDecWorkerState.specdec_wake_error)

    def wake_up(self, **kwargs):
        if self.wake_failure:
            raise RuntimeError(self.wake_failure)
        return True

    def specdec_wake_error(self):
        return self.wake_failure


class FakeVllmGeneration:
    """Stands in for NeMo-RL's VllmGeneration (NeMo-RL cannot be installed here): contiguous
    sharding like the real `generate`, round-robin `_next_dp_shard_idx`, and `_async_generate_base`
    choosing the shard synchronously before its first await, as recorded in the 0.6.0 API.
    `cluster` here is just the list of engines."""

    def __init__(self, cluster, config, name_prefix="vllm_policy", workers_per_node=None, defer_model_load=False):
        self.cfg = config
        self.worker_group = FakeWorkerGroup(cluster)
        self.dp_size = self.worker_group.dp_size
        self.fleet_selector = None
        self.current_generate_dp_shard_idx = 0
        self.shards_used = []
        self.base_metrics = {}
        self._step_metrics_snapshot = None

    def generate(self, data, greedy=False):
        n, e = len(data["input_ids"]), self.dp_size
        base, extra = divmod(n, e)
        shards, start = [], 0
        for j in range(e):
            size = base + (1 if j < extra else 0)
            shards.append(data.select_indices(range(start, start + size)))
            start += size
        results = self.worker_group.run_all_workers_sharded_data("generate", data=shards,
                                                                 common_kwargs={"greedy": greedy})
        return FakeBatchedDataDict.from_batches(results, pad_value_dict={"output_ids": self.cfg["_pad_token_id"]})

    async def generate_async(self, data, greedy=False):
        async for item in self._async_generate_base(data, "generate_async", lambda d: True, greedy):
            yield item

    async def _async_generate_base(self, data, method_name, data_validation_fn, greedy=False):
        shard = self._next_dp_shard_idx()
        self.shards_used.append(shard)
        await asyncio.sleep(0)
        yield 0, self.worker_group.engines[shard].generate(data)

    def _next_dp_shard_idx(self):
        i = self.current_generate_dp_shard_idx
        self.current_generate_dp_shard_idx = (i + 1) % self.dp_size
        return i

    def _get_raw_spec_counters(self):
        read = self.worker_group.run_all_workers_single_data("_get_raw_spec_counters")
        return fake_aggregate_spec_decode_counters(read)

    def snapshot_step_metrics(self):
        """As NeMo-RL's: the counters read where the step's window opens; `get_step_metrics` reads them again
        (here it returns `base_metrics`, the step's delta as a test sets it)."""
        self._step_metrics_snapshot = self._get_raw_spec_counters()

    def get_step_metrics(self):
        if self._step_metrics_snapshot is None:
            return {}
        self._get_raw_spec_counters()
        self._step_metrics_snapshot = None
        return dict(self.base_metrics)

    def update_weights_via_ipc_zmq(self):
        return []

    def update_weights_from_collective(self):
        return []

    def prepare_for_generation(self, *args, **kwargs):
        """Wakes every engine as the real one does, which catches any error of theirs and only prints it."""
        try:
            return all(e.wake_up(**kwargs) for e in self.worker_group.engines)
        except Exception as e:
            print(f"Error during policy preparation: {e}")
            return False

    def finish_generation(self, *args, **kwargs):
        """Sleeps (colocated) or resets the prefix cache on every engine, as the real one does."""
        self.finished = getattr(self, "finished", 0) + 1
        return True


def fake_aggregate_spec_decode_counters(worker_metrics):
    """Stands in for NeMo-RL's aggregate_spec_decode_counters (same on v0.7.0 and main): the metrics whose
    name has `spec_decode`, summed over the workers."""
    out: dict = {}
    for report in worker_metrics:
        for name, value in report.items():
            if "spec_decode" in name:
                out[name] = out.get(name, 0.0) + value
    return out


def fake_configure_generation_config(config, tokenizer, is_eval=False, has_refit_draft_weights=False, trains_mtp=False):
    """Stands in for NeMo-RL's configure_generation_config (NeMo-RL cannot be installed here): the
    load-format rule recorded from 0.6.0 (speculation without draft refit forces a full load)."""
    config["_pad_token_id"] = tokenizer.pad_token_id
    config["vllm_cfg"]["load_format"] = "auto" if is_eval else "dummy"
    sc = (config.get("vllm_kwargs") or {}).get("speculative_config")
    if sc and not is_eval and not has_refit_draft_weights and sc.get("method") not in ("mtp", "deepseek_mtp"):
        config["vllm_cfg"]["load_format"] = "auto"
    config["_mtp_weights_from_refit"] = trains_mtp
    return config


def fake_validate(policy_generation, *args, **kwargs):
    """Stands in for NeMo-RL's grpo.validate (NeMo-RL cannot be installed here): generates once."""
    return policy_generation.generate(*args, **kwargs)


FAKE_RUN_GRPO = '''"""Stands in for NeMo-RL's examples/run_grpo.py (NeMo-RL cannot be installed here): parses
--config like the real script, and calls its module-level configure_generation_config."""
import argparse, json, os, sys, types
from nemo_rl.models.generation import configure_generation_config


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config")
    args, overrides = ap.parse_known_args()
    import yaml
    cfg = yaml.safe_load(open(args.config))
    gen = cfg["policy"]["generation"]
    gen.setdefault("vllm_cfg", {})
    out = configure_generation_config(gen, types.SimpleNamespace(pad_token_id=0, eos_token_id=1),
                                      has_refit_draft_weights=False, trains_mtp=False)
    from nemo_rl.models.generation.vllm import vllm_generation
    from nemo_rl.algorithms import grpo
    worker = vllm_generation.resolve_generation_worker_cls(
        "nemo_rl.models.generation.vllm.vllm_worker.VllmGenerationWorker", out)
    with open(os.environ["FAKE_RUN_GRPO_OUT"], "w") as f:
        json.dump({"argv": sys.argv[1:], "overrides": overrides, "generation": out, "worker": worker,
                   "generation_cls": grpo.VllmGeneration.__name__,
                   "pythonpath": os.environ.get("PYTHONPATH", "")}, f)
'''


class FakeCheckpointManager:
    """Stands in for NeMo-RL's `nemo_rl.utils.checkpoint.CheckpointManager`: `init_tmp_checkpoint`
    makes `tmp_step_N/` with `training_info.json` and returns it, as NeMo-RL's does."""

    def __init__(self, config):
        self.checkpoint_dir = Path(config["checkpoint_dir"])

    def init_tmp_checkpoint(self, step, training_info, run_config=None):
        import json

        path = self.checkpoint_dir / f"tmp_step_{step}"
        path.mkdir(parents=True, exist_ok=True)
        (path / "training_info.json").write_text(json.dumps(dict(training_info)))
        return path

    def finalize_checkpoint(self, checkpoint_path):
        path = Path(checkpoint_path)
        path.rename(path.parent / path.name.removeprefix("tmp_"))


STAND_INS = {
    "nemo_rl.utils.checkpoint.CheckpointManager": FakeCheckpointManager,
    "nemo_rl.models.generation.vllm.vllm_generation.VllmGeneration": FakeVllmGeneration,
    "nemo_rl.distributed.worker_groups.RayWorkerGroup": FakeWorkerGroup,
    "nemo_rl.distributed.batched_data_dict.BatchedDataDict": FakeBatchedDataDict,
    "nemo_rl.models.generation.vllm.vllm_worker.VllmGenerationWorkerImpl": FakeGenerationWorkerImpl,
    "nemo_rl.models.generation.vllm.vllm_worker_async.VllmAsyncGenerationWorkerImpl": FakeAsyncGenerationWorkerImpl,
    "nemo_rl.models.generation.vllm.vllm_backend.VllmInternalWorkerExtension": FakeHostExtension,
    "nemo_rl.models.generation.vllm.vllm_backend.VllmInternalWorkerExtensionWithCheckpointEngine":
        FakeHostExtensionWithCheckpointEngine,
}


def stand_in_module(name: str) -> types.ModuleType:
    """An empty module with a module spec, to stand in for one of NeMo-RL's (fake_nemo_rl installs it)."""
    m = types.ModuleType(name)
    m.__spec__ = importlib.machinery.ModuleSpec(name, None, origin="<stand-in for NeMo-RL>")
    return m








def worker_cfg(exchange=None, **block):
    """Stands in for the generation config NeMo-RL hands a vLLM worker (after our translation)."""
    g = gen_cfg(**block)
    g["model_name"] = "Qwen/Qwen3-8B"
    if exchange is not None:
        g[translate.EXCHANGE_KEY] = exchange
    return g


def batch(prompts):
    """Stands in for the BatchedDataDict of prompts NeMo-RL hands a worker's generate."""
    width = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), width), dtype=np.int64)
    for i, p in enumerate(prompts):
        ids[i, :len(p)] = p
    return FakeBatchedDataDict({"input_ids": ids, "input_lengths": np.array([len(p) for p in prompts])})





