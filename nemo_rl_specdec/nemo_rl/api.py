"""Every NeMo-RL name this adapter touches, in one place, resolved lazily.

Nothing here imports `nemo_rl` at module import time. The adapter reaches NeMo-RL only through
`resolve(FQN)` with the constants below, so the contract test can check that each name is
listed in the recorded description of the NeMo-RL 0.6.0 API (tests/data/nemo_rl_0.6.0_api.json).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from typing import Any, Optional

NEMO_RL_VERSION = "0.6.0"

# -- generation backend (driver side)
VLLM_GENERATION = "nemo_rl.models.generation.vllm.vllm_generation.VllmGeneration"
RESOLVER_MODULE = "nemo_rl.models.generation.vllm.vllm_generation"
RESOLVER_NAME = "resolve_generation_worker_cls"
BATCHED_DATA_DICT = "nemo_rl.distributed.batched_data_dict.BatchedDataDict"
GRPO_MODULE = "nemo_rl.algorithms.grpo"  # binds `VllmGeneration` by name; we rebind it

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

# -- actor environments and venvs
ACTOR_REGISTRY = "nemo_rl.distributed.ray_actor_environment_registry.ACTOR_ENVIRONMENT_REGISTRY"
DEFAULT_VENV_DIR = "nemo_rl.utils.venvs.DEFAULT_VENV_DIR"

# -- the GRPO entry script (examples/run_grpo.py in the NeMo-RL checkout; loaded by path)
RUN_GRPO_SCRIPT = "examples/run_grpo.py"
RUN_GRPO_MAIN = "examples.run_grpo.main"
RUN_GRPO_CONFIGURE = "examples.run_grpo.configure_generation_config"
CONFIGURE_GENERATION_CONFIG = "nemo_rl.models.generation.configure_generation_config"

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


def _nemo_rl_spec():
    """NeMo-RL's import spec, or None. A bare `nemo_rl/` directory (a namespace package, e.g.
    this project's tests/nemo_rl when tests/ is on sys.path) is not NeMo-RL."""
    spec = importlib.util.find_spec("nemo_rl")
    if spec is None or spec.origin in (None, "namespace"):
        return None
    return spec


def nemo_rl_available() -> bool:
    return _nemo_rl_spec() is not None


def resolve(fqn: str) -> Any:
    """Import `a.b.c.Name` (longest importable module prefix, then attributes)."""
    if fqn.startswith("examples."):
        module = load_run_grpo_module()
        obj: Any = module
        for part in fqn.split(".")[2:]:
            obj = getattr(obj, part)
        return obj
    if fqn.startswith("nemo_rl.") and not nemo_rl_available():
        raise NeMoRLMissing(INSTALL_HINT)
    parts = fqn.split(".")
    for i in range(len(parts) - 1, 0, -1):
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


def split_fqn(fqn: str) -> tuple[str, str]:
    module, _, name = fqn.rpartition(".")
    return module, name


def find_nemo_rl_root(env: Optional[dict] = None) -> Optional[Path]:
    """The NeMo-RL checkout (the directory holding `nemo_rl/` and `examples/`), without importing it."""
    env = os.environ if env is None else env
    if env.get("NEMO_RL_ROOT"):
        return Path(env["NEMO_RL_ROOT"]).expanduser().resolve()
    spec = _nemo_rl_spec()
    if spec is None:
        return None
    return Path(spec.origin).resolve().parent.parent


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
    module = importlib.util.module_from_spec(spec)
    sys.modules[RUN_GRPO_MODULE_NAME] = module
    spec.loader.exec_module(module)
    _RUN_GRPO_MODULE = module
    return module


def all_references() -> dict[str, str]:
    """Every NeMo-RL FQN constant in this module (name -> FQN); the contract test reads this."""
    out = {}
    for k, v in globals().items():
        if k.isupper() and isinstance(v, str) and (v.startswith("nemo_rl.") or v.startswith("examples.")):
            out[k] = v
    out["RESOLVER"] = f"{RESOLVER_MODULE}.{RESOLVER_NAME}"
    return out
