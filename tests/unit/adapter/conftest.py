"""Fixtures of the NeMo-RL adapter's unit tests: `fake_nemo_rl` installs the stand-ins of fakes.py
as NeMo-RL's modules for one test and resets every class the adapter built lazily."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
from fakes import (  # noqa: E402
    FAKE_RUN_GRPO,
    NEMO_RL_INSTALLED,
    STAND_INS,
    FakeVllmGeneration,
    fake_aggregate_spec_decode_counters,
    fake_configure_generation_config,
    fake_validate,
    stand_in_module,
    write_file,
)

from nemo_rl_specdec.adapter import api, extension


@pytest.fixture
def fake_nemo_rl(monkeypatch, tmp_path):
    """Installs stand-in `nemo_rl` modules (NeMo-RL cannot be installed here) and a stand-in
    examples/run_grpo.py under NEMO_RL_ROOT; resets every class the adapter built lazily."""
    if NEMO_RL_INSTALLED:
        pytest.skip("NeMo-RL is installed: tests/adapter/ covers the real classes")
    mods = {}
    for name in ["nemo_rl", "nemo_rl.models", "nemo_rl.models.generation", "nemo_rl.models.generation.vllm",
                 "nemo_rl.models.generation.vllm.vllm_generation", "nemo_rl.models.generation.vllm.vllm_worker",
                 "nemo_rl.models.generation.vllm.vllm_worker_async", "nemo_rl.models.generation.vllm.vllm_backend",
                 "nemo_rl.models.generation.vllm.utils",
                 "nemo_rl.distributed", "nemo_rl.distributed.batched_data_dict", "nemo_rl.distributed.worker_groups",
                 "nemo_rl.distributed.worker_group_utils", "nemo_rl.distributed.ray_actor_environment_registry",
                 "nemo_rl.utils", "nemo_rl.utils.venvs", "nemo_rl.utils.checkpoint", "nemo_rl.algorithms",
                 "nemo_rl.algorithms.grpo"]:
        mods[name] = stand_in_module(name)
        monkeypatch.setitem(sys.modules, name, mods[name])
        parent, _, leaf = name.rpartition(".")
        if parent:
            setattr(mods[parent], leaf, mods[name])
    for fqn, cls in STAND_INS.items():
        mod, _, name = fqn.rpartition(".")
        setattr(mods[mod], name, cls)
    mods["nemo_rl.models.generation.vllm.vllm_generation"].resolve_generation_worker_cls = \
        lambda default_cls, config: default_cls
    mods["nemo_rl.models.generation"].configure_generation_config = fake_configure_generation_config
    mods["nemo_rl.models.generation.vllm.utils"].aggregate_spec_decode_counters = fake_aggregate_spec_decode_counters
    mods["nemo_rl.distributed.worker_group_utils"].get_nsight_config_if_pattern_matches = lambda worker_name: {}
    mods["nemo_rl.distributed.ray_actor_environment_registry"].ACTOR_ENVIRONMENT_REGISTRY = {
        api.SYNC_WORKER: "uv run --locked --extra vllm --directory /nrl",
        api.ASYNC_WORKER: "uv run --locked --extra vllm --directory /nrl"}
    mods["nemo_rl.utils.venvs"].DEFAULT_VENV_DIR = str(tmp_path / "venvs")
    # the worker venv NeMo-RL would start its vLLM workers with: this Python (the preflight runs in it)
    mods["nemo_rl.distributed.ray_actor_environment_registry"].get_actor_python_env = lambda fqn: sys.executable
    mods["nemo_rl.algorithms.grpo"].VllmGeneration = FakeVllmGeneration
    mods["nemo_rl.algorithms.grpo"].validate = fake_validate
    root = tmp_path / "nemo-rl"
    write_file(root / "examples" / "run_grpo.py", FAKE_RUN_GRPO)
    write_file(root / "examples" / "configs" / "grpo_math_1B.yaml",
           "policy:\n  model_name: base\n  precision: bfloat16\n"
           "  generation:\n    backend: vllm\n    temperature: 1.0\n"
           "    vllm_kwargs: {}\n    vllm_cfg: {async_engine: false}\n")
    monkeypatch.setenv("NEMO_RL_ROOT", str(root))
    monkeypatch.setenv("FAKE_RUN_GRPO_OUT", str(tmp_path / "run_out.json"))
    monkeypatch.setenv("NEMO_RL_SPECDEC_CACHE", str(tmp_path / "cache"))
    # a Ray cluster to join: the checks of a local one (launch_errors.py) are tested in test_launch_errors.py.
    # Not through RAY_ADDRESS: a test that starts Ray would then wait for a cluster that is not there.
    from nemo_rl_specdec.adapter import launch_errors

    monkeypatch.setattr(launch_errors, "running_ray_cluster", lambda: "127.0.0.1:6379")
    monkeypatch.setattr(api, "_RUN_GRPO_MODULE", None)
    monkeypatch.delitem(sys.modules, api.RUN_GRPO_MODULE_NAME, raising=False)
    from nemo_rl_specdec.adapter import generation, workers

    for module, names in ((workers, list(workers._BUILDERS)), (generation, ["SpecDecVllmGeneration"]),
                          (extension, list(extension.COMPOSITES))):
        for n in names:
            monkeypatch.delitem(module.__dict__, n, raising=False)
    yield SimpleNamespace(mods=mods, root=root, out=tmp_path / "run_out.json")
    sys.modules.pop(api.RUN_GRPO_MODULE_NAME, None)
    for module, names in ((workers, list(workers._BUILDERS)), (generation, ["SpecDecVllmGeneration"]),
                          (extension, list(extension.COMPOSITES))):
        for n in names:
            module.__dict__.pop(n, None)
