"""api.py: the adapter imports without NeMo-RL, and every NeMo-RL import and name goes through
api.py; every class the adapter defines is accounted for."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from fakes import (  # noqa: E402
    NEMO_RL_INSTALLED,
    REPO,
)

from nemo_rl_specdec.adapter import api

ADAPTER = REPO / "nemo_rl_specdec" / "adapter"


def test_adapter_imports_without_nemo_rl():
    code = (
        "import sys\n"
        "import nemo_rl_specdec.adapter, nemo_rl_specdec.adapter.workers, nemo_rl_specdec.adapter.generation\n"
        "import nemo_rl_specdec.adapter.extension, nemo_rl_specdec.run_grpo\n"
        "print('nemo_rl' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(NEMO_RL_INSTALLED, reason="NeMo-RL is installed here")
def test_building_a_class_without_nemo_rl_says_how_to_install():
    from nemo_rl_specdec.adapter import workers

    with pytest.raises(api.NeMoRLMissing, match="install it from source"):
        workers.SpecDecVllmGenerationWorkerImpl  # noqa: B018


def _string_constants(path: Path) -> set[str]:
    return {n.value for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def test_no_nemo_rl_import_or_name_bypasses_api_py():
    for path in sorted(ADAPTER.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] in ("nemo_rl", "examples") for a in node.names), path.name
            if isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] not in ("nemo_rl", "examples"), path.name
        if path.name == "api.py":
            continue
        stray = {s for s in _string_constants(path) if s.startswith("nemo_rl.")}
        assert not stray, f"{path.name} names NeMo-RL objects outside api.py: {stray}"


SUBCLASSES = {
    ("workers.py", "SpecDecVllmGenerationWorkerImpl"):
        "nemo_rl.models.generation.vllm.vllm_worker.VllmGenerationWorkerImpl",
    ("workers.py", "SpecDecVllmAsyncGenerationWorkerImpl"):
        "nemo_rl.models.generation.vllm.vllm_worker_async.VllmAsyncGenerationWorkerImpl",
    ("generation.py", "SpecDecVllmGeneration"): "nemo_rl.models.generation.vllm.vllm_generation.VllmGeneration",
    ("extension.py", "SpecDecHostHooks"): "nemo_rl.models.generation.vllm.vllm_backend.VllmInternalWorkerExtension",
    ("extension.py", "SpecDecCheckpointEngineHooks"):
        "nemo_rl.models.generation.vllm.vllm_backend.VllmInternalWorkerExtensionWithCheckpointEngine",
    ("policy_workers.py", "SpecDecDistillMixin"):
        "nemo_rl.models.policy.workers.dtensor_policy_worker_v2.DTensorPolicyWorkerV2Impl",
}


OWN_MIXINS = {("workers.py", "SpecDecWorkerState"), ("workers.py", "SpecDecEngineHooks"),
              ("generation.py", "SpecDecGenerationState")}


def _classes(path: Path):
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)]


def test_every_class_the_adapter_defines_is_accounted_for():
    found = {(p.name, c.name) for p in ADAPTER.glob("*.py") for c in _classes(p)}
    nemo_rl_free = {("api.py", "NeMoRLMissing"), ("api.py", "UnsupportedNeMoRL"), ("exchange.py", "RolloutExchange"),
                    ("exchange.py", "DrafterBoard"),
                    ("payload.py", "RolloutStash"),
                    ("metrics.py", "AcceptanceByLag"), ("launch_errors.py", "LaunchError"),
                    ("checkpoint.py", "Session")}
    assert found == set(SUBCLASSES) | OWN_MIXINS | nemo_rl_free
