"""Intel OpenMP under vLLM's CPU backend: find libiomp5 and preload it into the process.

vLLM's CPU worker warns that speculative decoding without Intel OpenMP in ``LD_PRELOAD``
"will cause significant performance loss", and on a 2-core Xeon machine it does: the same
draft-model A/B took 14-16 s (no-spec) and 5 s (spec) with libiomp5 preloaded against 22-56 s
and 15 s with the GNU OpenMP that torch ships (three runs; GNU OpenMP's spinning threads
suffer most when the cores are shared). ``LD_PRELOAD`` only acts when a process starts, so
:func:`reexec_with_iomp` re-executes the CLI once with it set; child processes (Ray actors)
inherit it. The ``cpu`` extra installs ``intel-openmp`` (``<venv>/lib/libiomp5.so``).

Once a vLLM CPU engine has bound its threads, vLLM turns ``torch.set_num_threads`` into a no-op
that logs a warning (the engine filters that warning as noise); :func:`request_torch_threads` is
how our trainers ask for a thread count, and it says so when the request cannot be applied.

Opt out with ``NEMO_RL_SPECDEC_NO_IOMP=1``. ``python -m nemo_rl_specdec.openmp`` prints
the library's path (empty when absent), for Makefiles: ``LD_PRELOAD="$(python -m ...)"``.
"""
from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

LIB = "libiomp5.so"
OPT_OUT = "NEMO_RL_SPECDEC_NO_IOMP"
_DONE = "NEMO_RL_SPECDEC_IOMP_REEXEC"  # set on the re-executed process: never loop

log = logging.getLogger("nemo_rl_specdec")


def request_torch_threads(n: int | None) -> bool:
    """Set torch's intra-op thread count to `n` (nothing for None/0). Returns whether it was applied:
    not when a vLLM CPU engine in this process has replaced ``torch.set_num_threads`` (then a
    warning names the ignored request instead of vLLM's filtered one)."""
    if not n:
        return False
    import torch

    if torch.set_num_threads is not torch._C.set_num_threads:
        log.warning("num_threads=%d not applied: a vLLM CPU engine in this process has bound torch's threads "
                    "(vLLM makes torch.set_num_threads a no-op after binding)", int(n))
        return False
    torch.set_num_threads(int(n))
    return True


def iomp_path() -> str | None:
    """libiomp5.so from the intel-openmp wheel of this interpreter's environment, if installed."""
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        p = Path(prefix) / "lib" / LIB
        if p.is_file():
            return str(p)
    return None


def preloaded(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return any(Path(p).name == LIB for p in env.get("LD_PRELOAD", "").replace(":", " ").split())


def reexec_with_iomp(argv: Sequence[str], entry: Sequence[str] = ("-m", "nemo_rl_specdec.cli")) -> None:
    """Replace this process by `python *entry *argv` (the CLI, or a script: `entry=(__file__,)`) with
    libiomp5 preloaded.

    Returns (does nothing) off Linux, when intel-openmp is not installed, when it is already
    preloaded, when the user opted out, or when this process is the re-executed one."""
    if not sys.platform.startswith("linux") or os.environ.get(OPT_OUT) == "1" or os.environ.get(_DONE):
        return
    lib = iomp_path()
    if lib is None or preloaded():
        return
    env = dict(os.environ)
    env["LD_PRELOAD"] = " ".join(x for x in (lib, env.get("LD_PRELOAD", "")) if x)
    env[_DONE] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *entry, *argv], env)


if __name__ == "__main__":
    print(iomp_path() or "")
