"""The GRPO loop test's CPU stand-ins (`loop_cpu_host.py`) at interpreter start, for the process Ray's
`worker_process_setup_hook` does not reach: vLLM's engine-core process behind NeMo-RL's async
engine, which vLLM spawns from the worker actor. This folder is on PYTHONPATH only in the loop
test's Ray runtime env, and acts only where that env sets the variable below (inherited by the
spawned process)."""
import os

if os.environ.get("SPECDEC_LOOP_CPU_HOST"):
    import loop_cpu_host

    loop_cpu_host.apply()
