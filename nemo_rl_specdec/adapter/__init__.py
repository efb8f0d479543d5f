"""Thin adapter over NeMo-RL v0.7.0 and main (imports `nemo_rl` lazily; this package imports without it).

- `api`: every NeMo-RL name used, and the support policy (the hooks a run needs, probed before patching).
- `checkpoint`: the drafter's state in NeMo-RL's checkpoints, and the resume check and restore that read it.
- `exchange`: two small Ray actors: the engines' rollout swap and the board of the last distilled drafter.
- `extension`: NeMo-RL's vLLM worker extension composed with ours (runs in the vLLM worker).
- `generation`: the `VllmGeneration` subclass (placement, metrics).
- `host`: the base the mixins type-check against (NeMo-RL's and vLLM's classes are Any).
- `launch_errors`: what stops a launch before NeMo-RL's first step, said in one line.
- `metrics`: the adapter's step metrics (pure functions).
- `payload`: the rollouts and the `PolicyUpdate` the worker actors hand the drafter.
- `policy_workers`: online drafter distillation in NeMo-RL's DTensor policy workers, and its driver side.
- `preflight`: the checks run in the workers' own Python before any engine starts.
- `sharding`: length-aware sharding of a generation batch onto the data-parallel engines.
- `translate`: the block validated and translated into NeMo-RL's vLLM settings (pure logic).
- `workers`: sync / async worker actors (`_create_engine` injects the extension).
"""
