"""CPU stand-ins at interpreter start, for the processes the tests cannot reach otherwise. This
folder is on PYTHONPATH only in the real-source tier's Ray runtime env (the GRPO loop test) or in
the launcher test's subprocess; each part acts only where its variable is set.

- `SPECDEC_LOOP_CPU_HOST` (inherited by every process started from there): the GPU-only calls
  (`loop_cpu_host.py`), for the processes Ray's `worker_process_setup_hook` does not reach: vLLM's
  engine-core process behind NeMo-RL's async engine, which vLLM spawns from the worker actor; and,
  in the launcher test, NeMo-RL's driver and every Ray worker, since NeMo-RL's `init_ray` builds
  the runtime env (the driver's environment, this folder on its PYTHONPATH) and no hook can be
  added to it.
- `SPECDEC_LAUNCH_DRIVER` (removed here, so nothing the driver starts inherits it): the launcher
  test's driver stand-ins (`launch_host.py`)."""
import os
import sys


def _needs_stand_ins() -> bool:
    """Not in the helper processes torch starts (inductor's `python -c` compile checks, one per
    kernel, each of which would import vLLM and NeMo-RL here): only in a `-c` process when it is
    a multiprocessing child (vLLM's spawned engine core and workers) or our preflight's facts
    script (`adapter/preflight.py`, which reads the sleep mode the stand-ins provide)."""
    argv = getattr(sys, "orig_argv", [])
    joined = " ".join(argv)
    return "-c" not in argv or "multiprocessing" in joined or "SPECDEC_FACTS" in joined


if os.environ.get("SPECDEC_LOOP_CPU_HOST") and _needs_stand_ins():
    import loop_cpu_host

    loop_cpu_host.apply()

if os.environ.pop("SPECDEC_LAUNCH_DRIVER", None):
    import launch_host

    launch_host.apply()
