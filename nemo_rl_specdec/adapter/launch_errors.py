"""The launch a user makes: what stops NeMo-RL before its first step, said in one line.

`python -m nemo_rl_specdec.run_grpo` checks these before NeMo-RL's `main` runs, because NeMo-RL
writes its log directory (and Ray its session files) as soon as it starts:

- importing NeMo-RL's entry script: its import-time version assertions (e.g. transformers) and
  packages missing from this Python (`import_failure`);
- the local Ray cluster NeMo-RL would start, when none is running: the dashboard packages its
  `init_ray` asks for (`include_dashboard=True`) and the GPUs `cluster.gpus_per_node` asks for
  (`check_local_cluster`); with a running cluster (RAY_ADDRESS, `ray start`) the cluster decides;
- the policy weights and tokenizer: a local directory, the Hugging Face cache, or the Hub
  reachable from here (`check_model`).

Each failure is a `LaunchError`: one line naming what failed and what to do; the entry point
prints it and exits 1. With `NEMO_RL_SPECDEC_DEBUG=1` the entry point re-raises every error it would
print in one line instead, so the full traceback (with the exception it was made from) is printed.
"""
from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

from nemo_rl_specdec.config.schema import cut

IN_NEMO_RL_ENV = ("run the entry point inside NeMo-RL's own environment (`uv run python -m nemo_rl_specdec.run_grpo "
                  "...` from the NeMo-RL checkout, or the NGC container nvcr.io/nvidia/nemo-rl), where its pinned "
                  "versions are installed")


DEBUG_ENV = "NEMO_RL_SPECDEC_DEBUG"


class LaunchError(RuntimeError):
    """What stops the launch, in one line (what failed; what to do)."""


def debug() -> bool:
    """NEMO_RL_SPECDEC_DEBUG is set to a true value: errors are re-raised with their traceback."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def _flat(text: object, limit: int = 300) -> str:
    return cut(" ".join(str(text).split()), limit)


def _raised_at(exc: BaseException) -> str:
    """`path:line` of the innermost frame of `exc`'s traceback (where NeMo-RL raised it)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "an unknown place"
    f = frames[-1]
    return f"{f.filename}:{f.lineno}"


def import_failure(exc: BaseException, what: str) -> LaunchError:
    """`exc` raised while importing `what` (NeMo-RL's entry script and what it imports) as one line."""
    where = _raised_at(exc)
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return LaunchError(
            f"importing {what} failed: the package `{exc.name.split('.')[0]}` is not installed in this Python "
            f"({sys.executable}; needed at {where}): install it there, or {IN_NEMO_RL_ENV}")
    if isinstance(exc, AssertionError):
        return LaunchError(
            f"importing {what} failed: NeMo-RL's import-time check at {where} refused this environment "
            f"({_flat(exc) or 'assertion failed'}): {IN_NEMO_RL_ENV}")
    return LaunchError(
        f"importing {what} failed at {where}: {type(exc).__name__}: {_flat(exc)}: {IN_NEMO_RL_ENV}")


def running_ray_cluster() -> str | None:
    """The address of the Ray cluster NeMo-RL's `init_ray` would join (RAY_ADDRESS, `ray start`), or None
    when it would start a local one."""
    from ray._private import services

    try:
        return services.get_ray_address_from_environment("auto", None)
    except ConnectionError:
        return None


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def cuda_init_error() -> str | None:
    """Why CUDA failed to initialise in this Python (a CUDA build of torch whose driver or devices do not
    come up), or None: a CPU build of torch, or CUDA that initialises. torch reports such a failure as 0
    devices, which would read as a machine without GPUs."""
    import torch

    if torch.version.cuda is None:
        return None
    try:
        torch.cuda.init()
    except Exception as e:  # RuntimeError from the driver, or torch's own AssertionError
        return f"{type(e).__name__}: {_flat(e, 200)}"
    return None


def check_local_cluster(cluster: dict) -> None:
    """When NeMo-RL would start a local Ray cluster: its dashboard packages, and `cluster.gpus_per_node`
    GPUs on this machine."""
    if running_ray_cluster() is not None:
        return
    from ray._private import utils as ray_utils

    missing = ray_utils.get_dashboard_dependency_error()
    if missing is not None:
        raise LaunchError(
            f"Ray's dashboard packages are missing ({_flat(missing)}) and NeMo-RL starts its local Ray cluster "
            f"with the dashboard: install them (`pip install 'ray[default]'` into {sys.executable}), or start a "
            f"cluster first (`ray start --head`) so NeMo-RL joins it")
    wanted = int(cluster.get("gpus_per_node") or 0)
    have = gpu_count()
    if wanted > have:
        why = cuda_init_error() if have == 0 else None
        if why is not None:
            raise LaunchError(
                f"cluster.gpus_per_node={wanted} but CUDA failed to initialise in this Python ({why}) and no Ray "
                f"cluster is running: fix the NVIDIA driver or CUDA_VISIBLE_DEVICES so that "
                f"`{sys.executable} -c 'import torch; torch.cuda.init()'` succeeds, or join a GPU cluster with "
                f"RAY_ADDRESS / `ray start`")
        raise LaunchError(
            f"cluster.gpus_per_node={wanted} but this machine has {have} CUDA GPU(s) and no Ray cluster is "
            f"running: run on a GPU node (or join a GPU cluster with RAY_ADDRESS / `ray start`), or set "
            f"cluster.gpus_per_node={have}")


def _hub_refused(e: BaseException) -> str | None:
    """"gated" or "unauthorized" when the Hub refused the request for want of access (a gated repo, a 401 or
    403: a missing, invalid or unentitled token), else None."""
    try:
        from huggingface_hub.errors import GatedRepoError
    except ImportError:  # an older huggingface_hub keeps its errors in utils
        from huggingface_hub.utils import GatedRepoError
    if isinstance(e, GatedRepoError):
        return "gated"
    status = getattr(getattr(e, "response", None), "status_code", None)
    return "unauthorized" if status in (401, 403) else None


def check_model(name: str | None, key: str) -> None:
    """`name` (a model or tokenizer NeMo-RL will load) is a local directory, in the Hugging Face cache, or
    on a Hub reachable from here. One request, no retries."""
    if not name or Path(str(name)).expanduser().is_dir():
        return
    name = str(name)
    if name.startswith((".", "/", "~")):
        raise LaunchError(f"{key}={name}: no such directory: point it at a model checkpoint directory")
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return
    try:
        get_hf_file_metadata(hf_hub_url(name, "config.json"), timeout=10)
    except Exception as e:  # offline mode, no network, unknown repo: all end the same way; access is its own
        refused = _hub_refused(e)
        if refused is not None:
            what = ("it is a gated repo: accept its terms on the Hub with your account, then set HF_TOKEN"
                    if refused == "gated" else
                    "it is private, gated or misnamed: check the name; for a private or gated repo set HF_TOKEN")
            raise LaunchError(
                f"{key}={name}: the Hugging Face Hub refused access ({type(e).__name__}: {_flat(e, 160)}): "
                f"{what} to a token with access to {name} (or run `huggingface-cli login`) in the environment "
                f"NeMo-RL starts from, or set {key} to a local checkpoint directory") from e
        raise LaunchError(
            f"{key}={name}: its weights are not reachable (not a local directory, not in the Hugging Face cache "
            f"at {constants.HF_HUB_CACHE}, and the Hub request failed: "
            f"{type(e).__name__}: {_flat(e, 160)}): download it where the Hub is reachable "
            f"(`huggingface-cli download {name}`) and share HF_HOME, or set {key} to a local checkpoint "
            f"directory") from e


def check_before_launch(resolved: dict) -> None:
    """Every check above that needs no NeMo-RL import, on the resolved run file."""
    policy = resolved.get("policy") or {}
    check_model(policy.get("model_name"), "policy.model_name")
    tokenizer = (policy.get("tokenizer") or {}).get("name")
    if tokenizer and tokenizer != policy.get("model_name"):
        check_model(tokenizer, "policy.tokenizer.name")
    check_local_cluster(resolved.get("cluster") or {})
