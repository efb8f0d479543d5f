"""Simulator of RL steps with speculative decoding (docs/simulator.md).

scenario/      the scenario YAML: its blocks' schemas, limits, files, loading with overrides and a
               hardware profile, errors with dotted key paths
workload.py    rollout batches with GRPO groups and a long tail; the length history the predictor saw
acceptance.py  acceptance curves by draft depth: decay, conditional, bench JSON, per-request spread
best_drafts.py adaptive verification: the d per step with the most tokens per second
engine_sim.py  one engine's continuous batching, event by event: KV capacity and preemption,
               budgets, the per-step rules and the hybrid drafter's choice
step.py        sync, async and serving runs over several batches: trainer pools, exposed generation
report.py      baseline vs speculative runs, calibration checks (and points), sweeps, finiteness
plots.py       PNGs of the sweeps
cpu_fit.py     the CPU profile fitted on `bench --suite costmodel` steps; held-out bench predictions
crosscheck.py  our measured CPU A/B bench results predicted by the simulator, and the error

The command is `nemo-rl-specdec simulate` (`nemo_rl_specdec/cli.py`). A step's time, the
hardware profiles and the fits are the cost package's (`nemo_rl_specdec/cost/`).
"""
