"""Thin adapter over NeMo-RL v0.7.0 and main (imports `nemo_rl` lazily; this package imports without it).

- `translate`, `metrics`, `payload`, `sharding`, `config_loader`: pure logic, no NeMo-RL.
- `extension`: NeMo-RL's vLLM worker extension composed with ours (runs in the vLLM worker).
- `workers`: sync / async worker actors (`_create_engine` injects the extension).
- `generation`: the `VllmGeneration` subclass (placement, metrics).
- `run_grpo`: the entry point (`python -m nemo_rl_specdec.run_grpo --config RUN.yaml`).
- `api`: every NeMo-RL name used, and the support policy (the hooks a run needs, probed before patching).
- `exchange`, `preflight`: the engines' rollout swap; the checks in the workers' own Python.
- `host`: the base the mixins above type-check against (NeMo-RL's and vLLM's classes are Any).
"""
