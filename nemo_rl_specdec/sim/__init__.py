"""Simulator of RL steps with speculative decoding (docs/simulator.md).

scenario/     scenario YAML: its schema by block, loading, overrides, errors with dotted key paths
acceptance.py acceptance curves by draft depth: decay, conditional, bench JSON, spread
cpu_fit.py    CPU profile fitted on `bench --suite costmodel` steps; held-out bench predictions
best_drafts.py adaptive verification: the d per step with the most tokens per second
workload.py   rollout batches with GRPO groups and a long tail; predictor history
engine_sim.py one engine's continuous batching, event by event, with KV capacity and preemption
step.py       sync, async and serving runs over several batches; trainer pools, exposed generation
report.py     baseline vs speculative runs, calibration checks (and points), sweeps, finiteness
plots.py      PNGs of the sweeps
cli.py        `nemo-rl-specdec simulate`

A step's time, the hardware profiles and the fits are the cost package's (`nemo_rl_specdec/cost/`).
"""
