"""nemo-rl-specdec: lossless speculative decoding for NeMo-RL rollouts.

Layers, top to bottom (imports point down only; tests/unit/test_import_graph.py checks it):
cli, tools -> bench -> adapter (the thin NeMo-RL adapter, imports NeMo-RL lazily; never the driver) -> demo -> sim
-> driver (our local CPU driver: `Engine`, `EngineGroup`, their step traces; never on the NeMo-RL path) -> engine
(what runs inside a vLLM worker, NeMo-RL's and our driver's alike: the worker extension, weights, vLLM patches; no
NeMo-RL) -> scheduling -> config.run (the run file and its block) -> drafters (one file per drafter, one registry;
drafters/machinery/: what they are built from) -> train (the distillation loop) -> cost (the one step-cost function
of a GPU, hardware profiles, traces, their fits and pricing) -> config.loader (the one door for run files)
-> config.yaml_loader -> config.schema, rollouts, lockstep, metrics, openmp, models -> resources. The config
modules share one room, config/, across those layers.
"""
__version__ = "0.1.0"
