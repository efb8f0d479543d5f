"""Our local CPU driver: vLLM engines started and driven by this package, used by the CLI, the
benches, the demo and the tests. The NeMo-RL path never imports it (NeMo-RL drives its own vLLM
workers, which run `nemo_rl_specdec.engine`); tests/unit/test_import_graph.py checks it.

- `engine`: `Engine`, one in-process vLLM engine from a run file: generate, update, per-call
  spec metrics;
- `group`: `EngineGroup`, N engines as pinned Ray actors behind one generate/update API, the CPU
  stand-in for NeMo-RL's data-parallel vLLM workers;
- `tracing`: `StepTracer`, an in-process engine's steps read from vLLM's scheduler as a `Trace`.
"""
