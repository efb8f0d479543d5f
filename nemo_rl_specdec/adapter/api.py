"""Every NeMo-RL name this adapter touches, in one place, resolved lazily, and the support policy.

Nothing here imports `nemo_rl` at module import time. The adapter reaches NeMo-RL only through
`resolve(FQN)` with the constants below.

Support policy: the latest release (v0.7.0) and main (7ea279a). A NeMo-RL is identified by the
hooks it has (`probe()`), never by its version string (the v0.6.0 release and August's main both
call themselves 0.6.0). `check_support()` lists every hook a run needs and raises
`UnsupportedNeMoRL` naming the missing ones before anything is patched.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from nemo_rl_specdec.config.loader import find_nemo_rl_root
from nemo_rl_specdec.drafters.registry import weights_in_policy

SUPPORTED = "NeMo-RL v0.7.0 (81aa43d) and main (7ea279a)"

# -- generation backend (driver side)
VLLM_GENERATION = "nemo_rl.models.generation.vllm.vllm_generation.VllmGeneration"
RESOLVER_MODULE = "nemo_rl.models.generation.vllm.vllm_generation"
RESOLVER_NAME = "resolve_generation_worker_cls"
BATCHED_DATA_DICT = "nemo_rl.distributed.batched_data_dict.BatchedDataDict"
GRPO_MODULE = "nemo_rl.algorithms.grpo"  # binds `VllmGeneration` and `validate` by name; we rebind both
ACTOR_PYTHON_ENV = "nemo_rl.distributed.ray_actor_environment_registry.get_actor_python_env"
CREATE_LOCAL_VENV = "nemo_rl.utils.venvs.create_local_venv"

# -- Ray worker actors (the FQNs VllmGeneration hardcodes) and their *Impl bases
SYNC_WORKER = "nemo_rl.models.generation.vllm.vllm_worker.VllmGenerationWorker"
ASYNC_WORKER = "nemo_rl.models.generation.vllm.vllm_worker_async.VllmAsyncGenerationWorker"
SYNC_WORKER_IMPL = "nemo_rl.models.generation.vllm.vllm_worker.VllmGenerationWorkerImpl"
ASYNC_WORKER_IMPL = "nemo_rl.models.generation.vllm.vllm_worker_async.VllmAsyncGenerationWorkerImpl"
NSIGHT_RUNTIME_ENV = "nemo_rl.distributed.worker_group_utils.get_nsight_config_if_pattern_matches"

# -- vLLM worker extensions (run inside the vLLM worker process)
HOST_EXTENSION = "nemo_rl.models.generation.vllm.vllm_backend.VllmInternalWorkerExtension"
HOST_EXTENSION_CKPT = (
    "nemo_rl.models.generation.vllm.vllm_backend.VllmInternalWorkerExtensionWithCheckpointEngine"
)

# -- policy workers (online drafter distillation; policy_workers.py)
POLICY = "nemo_rl.models.policy.lm_policy.Policy"
POLICY_MODULE = "nemo_rl.models.policy.lm_policy"  # binds `resolve_policy_worker_cls` by name; we rebind it
POLICY_RESOLVER_NAME = "resolve_policy_worker_cls"
POLICY_RUNTIME_ENV = "nemo_rl.models.policy.utils.get_runtime_env_for_policy_worker"
DTENSOR_WORKER = "nemo_rl.models.policy.workers.dtensor_policy_worker.DTensorPolicyWorker"
DTENSOR_WORKER_V2 = "nemo_rl.models.policy.workers.dtensor_policy_worker_v2.DTensorPolicyWorkerV2"
DTENSOR_WORKER_IMPL = "nemo_rl.models.policy.workers.dtensor_policy_worker.DTensorPolicyWorkerImpl"
DTENSOR_WORKER_V2_IMPL = "nemo_rl.models.policy.workers.dtensor_policy_worker_v2.DTensorPolicyWorkerV2Impl"

# -- checkpoints (checkpoint.py writes our marker into each one NeMo-RL starts)
CHECKPOINT_MANAGER = "nemo_rl.utils.checkpoint.CheckpointManager"

# -- actor environments and venvs
ACTOR_REGISTRY = "nemo_rl.distributed.ray_actor_environment_registry.ACTOR_ENVIRONMENT_REGISTRY"
DEFAULT_VENV_DIR = "nemo_rl.utils.venvs.DEFAULT_VENV_DIR"

# -- the GRPO entry script (examples/run_grpo.py in the NeMo-RL checkout; loaded by path)
RUN_GRPO_SCRIPT = "examples/run_grpo.py"
RUN_GRPO_MAIN = "examples.run_grpo.main"
RUN_GRPO_CONFIGURE = "examples.run_grpo.configure_generation_config"
CONFIGURE_GENERATION_CONFIG = "nemo_rl.models.generation.configure_generation_config"
VLLM_UTILS = "nemo_rl.models.generation.vllm.utils"
AGGREGATE_SPEC_COUNTERS = f"{VLLM_UTILS}.aggregate_spec_decode_counters"

INSTALL_HINT = (
    "NeMo-RL is not importable in this Python environment. PyPI only has a placeholder "
    "(nemo-rl 0.0.0), so install it from source and run this entry point inside its environment:\n"
    "  git clone --recursive https://github.com/NVIDIA-NeMo/RL nemo-rl && cd nemo-rl\n"
    "  uv venv && uv pip install -e /path/to/nemo-rl-specdec   # or: export PYTHONPATH=/path/to/nemo-rl-specdec\n"
    "  uv run python -m nemo_rl_specdec.run_grpo --config RUN.yaml\n"
    "or use the NGC container nvcr.io/nvidia/nemo-rl (NeMo-RL lives at /opt/nemo-rl). "
    "Set NEMO_RL_ROOT if the checkout is not the directory above the `nemo_rl` package."
)


class NeMoRLMissing(ImportError):
    """NeMo-RL (or its GRPO entry script) cannot be found."""


class UnsupportedNeMoRL(RuntimeError):
    """The NeMo-RL found lacks a hook a requested feature needs (raised before anything is patched)."""


def _nemo_rl_spec():
    """NeMo-RL's import spec, or None."""
    return importlib.util.find_spec("nemo_rl")


def nemo_rl_available() -> bool:
    return _nemo_rl_spec() is not None


def resolve(fqn: str) -> Any:
    """Import `a.b.c.Name` or the module `a.b.c` (longest importable module prefix, then attributes)."""
    if fqn.startswith("examples."):
        module = load_run_grpo_module()
        obj: Any = module
        for part in fqn.split(".")[2:]:
            obj = getattr(obj, part)
        return obj
    if fqn.startswith("nemo_rl.") and not nemo_rl_available():
        raise NeMoRLMissing(INSTALL_HINT)
    parts = fqn.split(".")
    for i in range(len(parts), 0, -1):
        mod_name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            if e.name == "nemo_rl":
                raise NeMoRLMissing(INSTALL_HINT) from e
            if e.name and (mod_name == e.name or mod_name.startswith(e.name + ".")):
                continue  # `mod_name` is not a module: try a shorter prefix
            raise  # a dependency of NeMo-RL is missing: show it as is
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise NeMoRLMissing(f"cannot import {fqn}")


_RUN_GRPO_MODULE: Any = None
RUN_GRPO_MODULE_NAME = "nemo_rl_specdec_examples_run_grpo"


def load_run_grpo_module() -> Any:
    """NeMo-RL's examples/run_grpo.py, loaded by path under a private module name.

    By path, because `import examples` could pick up another project's `examples/` package
    (ours included) depending on the working directory.
    """
    global _RUN_GRPO_MODULE
    if _RUN_GRPO_MODULE is not None:
        return _RUN_GRPO_MODULE
    root = find_nemo_rl_root()
    script = root / RUN_GRPO_SCRIPT if root else None
    if script is None or not script.exists():
        raise NeMoRLMissing(
            f"NeMo-RL's GRPO entry script not found (looked for {script}). "
            "Set NEMO_RL_ROOT to your NeMo-RL checkout.\n" + INSTALL_HINT
        )
    import sys

    spec = importlib.util.spec_from_file_location(RUN_GRPO_MODULE_NAME, script)
    assert spec is not None and spec.loader is not None   # a .py file that exists has a source loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[RUN_GRPO_MODULE_NAME] = module
    spec.loader.exec_module(module)
    _RUN_GRPO_MODULE = module
    return module


# --------------------------------------------------------------------------- support policy

# (owner FQN, attribute) -> what the adapter does with it. `REQUIRED_HOOKS` are needed by every
# run; the others only by the features named in `required_hooks`.
REQUIRED_HOOKS = {
    (HOST_EXTENSION, "_load_weights"): "records the tensor names of every refit (drafter tensors count as a refresh)",
    (HOST_EXTENSION, "update_weights_via_ipc_zmq"): "colocated refit RPC: the drafter refresh runs right after it",
    (HOST_EXTENSION, "update_weights_from_collective"): "non-colocated refit RPC: the drafter refresh runs after it",
    (SYNC_WORKER_IMPL, "_create_engine"): "injects our vLLM worker extension",
    (SYNC_WORKER_IMPL, "post_init"): "initialises the drafter state in every vLLM worker",
    (SYNC_WORKER_IMPL, "generate"): "records rollouts and adds problem ids / budgets to the requests",
    (SYNC_WORKER_IMPL, "update_weights_via_ipc_zmq"): "stages the step's rollouts before a colocated refit",
    (SYNC_WORKER_IMPL, "update_weights_from_collective"): "stages the step's rollouts before a non-colocated refit",
    (SYNC_WORKER_IMPL, "wake_up"): "after a wake-up, verifies (and restores) the drafter a sleep may have discarded",
    (VLLM_GENERATION, "generate"): "length-aware placement and per-request budgets",
    (VLLM_GENERATION, "_get_raw_spec_counters"): "NeMo-RL's read of the engines' counters, keeping their "
                                                  "generated tokens from the same read",
    (VLLM_GENERATION, "snapshot_step_metrics"): "where NeMo-RL's metrics window opens",
    (VLLM_GENERATION, "get_step_metrics"): "adds specdec/* step metrics",
    (SYNC_WORKER_IMPL, "_get_raw_spec_counters"): "an engine's vLLM metrics (generated and drafted tokens)",
    (VLLM_UTILS, "aggregate_spec_decode_counters"): "sums the engines' spec counters as NeMo-RL does",
    (VLLM_GENERATION, "finish_generation"): "stages the step's rollouts for a background store rebuild when "
                                             "generation ends",
    (RESOLVER_MODULE, RESOLVER_NAME): "chooses our worker actors",
    (GRPO_MODULE, "VllmGeneration"): "GRPO constructs our VllmGeneration subclass",
    (GRPO_MODULE, "validate"): "keeps validation rollouts out of the drafter",
    (CHECKPOINT_MANAGER, "init_tmp_checkpoint"): "marks each checkpoint with the drafter it was written with, "
                                                 "which the launcher checks before a resume",
}
ASYNC_HOOKS = {
    (ASYNC_WORKER_IMPL, "_create_engine"): "injects our vLLM worker extension (async engine)",
    (ASYNC_WORKER_IMPL, "post_init_async"): "initialises the drafter state (async engine)",
    (ASYNC_WORKER_IMPL, "generate_async"): "records rollouts and adds problem ids (async engine)",
    (ASYNC_WORKER_IMPL, "update_weights_via_ipc_zmq_async"): "stages rollouts before a refit (async engine)",
    (ASYNC_WORKER_IMPL, "update_weights_from_collective_async"): "stages rollouts before a refit (async engine)",
    (ASYNC_WORKER_IMPL, "wake_up_async"): "verifies (and restores) the drafter after a wake-up (async engine)",
}
ASYNC_PLACEMENT_HOOK = (VLLM_GENERATION, "current_generate_dp_shard_idx")
NCCL_RESHARD_HOOKS = {
    (HOST_EXTENSION, "nccl_reshard_refit"): "refit_transport=nccl_reshard: the drafter refresh runs after it",
    (SYNC_WORKER_IMPL, "nccl_reshard_refit"): "refit_transport=nccl_reshard: stages rollouts",
    (ASYNC_WORKER_IMPL, "nccl_reshard_refit_async"): "refit_transport=nccl_reshard: stages rollouts (async)",
}
CHECKPOINT_ENGINE_HOOKS = {
    (HOST_EXTENSION_CKPT, "_update_weights_from_checkpoint_engine_async"):
        "refit_transport=nixl|module:Class: the drafter refresh runs after it",
    (SYNC_WORKER_IMPL, "checkpoint_engine_rpc"): "checkpoint-engine refit: stages rollouts",
    (ASYNC_WORKER_IMPL, "checkpoint_engine_rpc_async"): "checkpoint-engine refit: stages rollouts (async)",
}
MTP_REFIT_HOOK = (HOST_EXTENSION, "_maybe_refit_mtp_drafter")
DISTILL_HOOKS = {
    (POLICY_MODULE, POLICY_RESOLVER_NAME): "chooses our DTensor policy workers, which distil the drafter online",
    (POLICY, "train"): "after each policy step, publishes the distilled drafter for the next refit",
    (POLICY_RUNTIME_ENV, "__call__"): "the runtime environment of our policy worker actors",
}
# The DTensor worker Impls our policy workers extend are imported only in the workers' own venv
# (NeMo-RL builds actors there by FQN; the driver's Python may lack nemo_automodel), so they are
# not probed here; the real-source contract tests check their `train`.


def _has(owner: str, attr: str) -> bool:
    """Whether `owner` has `attr`. An owner that is absent counts as missing; a NeMo-RL module that
    fails to import for another reason (a missing dependency) is raised as it is, not hidden."""
    try:
        obj = resolve(owner)
    except AttributeError:
        return False
    if (owner, attr) == ASYNC_PLACEMENT_HOOK:
        return shard_index_is_read_synchronously(obj)
    return hasattr(obj, attr)


def _source(fn: Any) -> str:
    import inspect

    try:
        return inspect.getsource(inspect.unwrap(fn))
    except (OSError, TypeError):
        return ""


def shard_index_is_read_synchronously(generation_cls: type) -> bool:
    """Whether `generate_async` picks its engine from `self.current_generate_dp_shard_idx` before its
    first await, so setting that attribute right before the call routes the request. v0.7.0 reads it
    in `_async_generate_base`; main through `_next_dp_shard_idx()`, called from the same place."""
    head = _source(getattr(generation_cls, "_async_generate_base", None)).split("await ", 1)[0]
    if "self._next_dp_shard_idx()" in head:
        picker = _source(getattr(generation_cls, "_next_dp_shard_idx", None))
        return "self.current_generate_dp_shard_idx" in picker and "await " not in picker
    return "self.current_generate_dp_shard_idx" in head


ALL_HOOKS = {**REQUIRED_HOOKS, **ASYNC_HOOKS, ASYNC_PLACEMENT_HOOK: "async placement", MTP_REFIT_HOOK: "mtp refit",
             **NCCL_RESHARD_HOOKS, **CHECKPOINT_ENGINE_HOOKS, **DISTILL_HOOKS}


def probe(hooks: dict | None = None) -> dict:
    """(owner, attribute) -> present, for the given hooks (default: every hook the adapter knows)."""
    return {h: _has(*h) for h in (hooks or ALL_HOOKS)}


def describe_nemo_rl() -> str:
    """The NeMo-RL found: where, its version string, and which optional refit routes it has."""
    try:
        version = getattr(importlib.import_module("nemo_rl"), "__version__", "unknown")
    except ImportError:
        version = "not importable"
    routes = [f"{o.rsplit('.', 1)[-1]}.{a}" for (o, a) in (*NCCL_RESHARD_HOOKS, *CHECKPOINT_ENGINE_HOOKS)
              if o in (HOST_EXTENSION, HOST_EXTENSION_CKPT) and _has(o, a)]
    return f"nemo_rl {version} at {find_nemo_rl_root()} (optional refit routes: {routes or 'none'})"


def required_hooks(gen_cfg: dict, spec: Any, trains_mtp: bool = False, distills: bool = False) -> dict:
    """Every hook a run with this generation config and block needs -> why. `trains_mtp`:
    `policy.megatron_cfg.mtp_num_layers > 0` (MTP layers arrive in the policy stream); `distills`:
    the policy workers distil the drafter online."""
    need = dict(REQUIRED_HOOKS)
    if distills:
        need.update(DISTILL_HOOKS)
    vllm_cfg = gen_cfg.get("vllm_cfg") or {}
    if vllm_cfg.get("async_engine"):
        need.update(ASYNC_HOOKS)
        if spec is not None and spec.scheduling.placement != "contiguous":
            need[ASYNC_PLACEMENT_HOOK] = (f"scheduling.placement={spec.scheduling.placement} with async_engine: "
                                          "routes each request to the chosen engine")
    if spec is not None and weights_in_policy(spec) and (
            trains_mtp or gen_cfg.get("_mtp_weights_from_refit")):
        need[MTP_REFIT_HOOK] = "drafter=mtp refreshed from the policy stream (megatron_cfg.mtp_num_layers > 0)"
    transport = gen_cfg.get("refit_transport")
    route: dict = {}
    if transport == "nccl_reshard":
        route = NCCL_RESHARD_HOOKS
    elif transport == "nixl" or (isinstance(transport, str) and ":" in transport):
        route = CHECKPOINT_ENGINE_HOOKS
    # the async worker's side of a route is needed only with the async engine
    need.update({h: w for h, w in route.items() if vllm_cfg.get("async_engine") or h[0] != ASYNC_WORKER_IMPL})
    return need


def check_support(gen_cfg: dict, spec: Any, trains_mtp: bool = False, distills: bool = False) -> dict:
    """Raise UnsupportedNeMoRL naming every missing hook; returns the probe of the needed hooks."""
    need = required_hooks(gen_cfg, spec, trains_mtp, distills)
    found = probe(need)
    missing = [h for h, ok in found.items() if not ok]
    if missing:
        lines = [f"  - {o.rsplit('.', 1)[-1]}.{a} ({o}): {need[(o, a)]}" for o, a in missing]
        raise UnsupportedNeMoRL(
            "nemo-rl-specdec cannot run this configuration on the NeMo-RL found; missing hook(s):\n"
            + "\n".join(lines) + f"\nNeMo-RL found: {describe_nemo_rl()}.\nSupported: {SUPPORTED}. "
            "Nothing was patched.")
    return found
