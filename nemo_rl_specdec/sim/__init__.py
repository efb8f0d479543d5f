"""Simulator of RL steps with speculative decoding (docs/simulator.md).

scenario.py   scenario YAML: schema, overrides, errors with dotted key paths
costmodel.py  engine step time: target verification + drafting
fit.py        least-squares fit of c_base, c_tok from measured steps
workload.py   rollout batches with GRPO groups and a long tail; predictor history
engine_sim.py one engine's continuous batching, event by event
step.py       sync and async GRPO steps over several batches
report.py     baseline vs speculative runs, calibration checks, sweeps
plots.py      PNGs of the sweeps
cli.py        `nemo-rl-specdec simulate`
"""
