"""Shared pytest configuration."""
import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "nemo_rl: needs NeMo-RL installed; skipped where `import nemo_rl` fails")


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
