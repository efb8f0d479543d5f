"""Peak memory of a piece of torch work, split into what is held for good and what is transient.

The split (:func:`split_memory`): of the peak, the teacher's weights and the trained module's
optimiser state (its fp32 parameters, their gradients and AdamW's two moments: parameter bytes
x (1 + 1 + 2), :func:`state_bytes`) are held between steps; the rest is the transient, what one
step allocates and frees again.

Where the peak comes from (:class:`PeakMemory`):

- ``cuda``: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` at the start
  of the measurement: the bytes of live tensors, nothing else;
- ``cpu``: the process's peak resident set (``VmHWM``, what ``getrusage`` reports as
  ``ru_maxrss``), reset at the start of the measurement (Linux: writing 5 to
  ``/proc/self/clear_refs``). A process also holds the interpreter, its libraries and allocator
  caches, so the resident set when the measurement starts (the teacher and the trained module
  built, nothing else) is the baseline: the runtime's share is baseline - teacher - parameters,
  and the peak of the tensors is the peak RSS minus that share. Run one measurement per process:
  memory an earlier one freed may stay resident and hide part of the next one's peak.
"""
from __future__ import annotations

import os
import resource
from typing import Any

GB = 1e9


def state_bytes(params: int, param_bytes: int = 4) -> int:
    """Bytes a module trained with AdamW holds between steps: parameters, gradients and the two
    moments, each `params` x `param_bytes` (4 for fp32)."""
    return int(params) * int(param_bytes) * (1 + 1 + 2)


def split_memory(peak: int, teacher: int, state: int) -> dict:
    """The peak split into teacher weights, trained state and the transient (peak - teacher - state)."""
    return {"peak_bytes": int(peak), "teacher_bytes": int(teacher), "state_bytes": int(state),
            "transient_bytes": int(peak) - int(teacher) - int(state)}


def tensor_bytes(module: Any) -> int:
    """Bytes of a module's parameters and buffers (each storage once)."""
    seen, total = set(), 0
    for t in list(module.parameters()) + list(module.buffers()):
        key = (t.untyped_storage().data_ptr(), t.device)
        if key in seen:
            continue
        seen.add(key)
        total += t.untyped_storage().nbytes()
    return total


def rss_bytes() -> int:
    """The process's resident set now (VmRSS)."""
    return _status_kb("VmRSS") * 1024


def peak_rss_bytes() -> int:
    """The process's peak resident set since it started or since :func:`reset_peak_rss` (VmHWM;
    `ru_maxrss` where /proc is missing)."""
    kb = _status_kb("VmHWM")
    return (kb if kb >= 0 else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def reset_peak_rss() -> bool:
    """Reset the peak resident set to the current one (Linux >= 4.0); False where that is refused."""
    try:
        with open(f"/proc/{os.getpid()}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _status_kb(field: str) -> int:
    try:
        with open(f"/proc/{os.getpid()}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


class PeakMemory:
    """The peak bytes of tensors between :meth:`start` and :meth:`peak` on `device`.

    `held`: the bytes of the tensors alive at :meth:`start` (teacher and module parameters); on
    CPU they and the runtime's share make up the baseline resident set (module docstring)."""

    def __init__(self, device: Any):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.method = ("torch.cuda.max_memory_allocated" if self.cuda
                       else "peak RSS (VmHWM) - runtime share of the baseline RSS")
        self.baseline: int | None = None
        self.runtime: int | None = None
        self.reset_ok = True

    def start(self, held: int) -> None:
        torch = self.torch
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = int(torch.cuda.memory_allocated(self.device))
            self.runtime = 0
            return
        from nemo_rl_specdec.bench import release_memory

        release_memory()
        self.reset_ok = reset_peak_rss()
        self.baseline = rss_bytes()
        self.runtime = self.baseline - int(held)

    def peak(self) -> int:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)
            return int(self.torch.cuda.max_memory_allocated(self.device))
        return peak_rss_bytes() - int(self.runtime)

    def report(self) -> dict:
        """What the measurement rests on: method, baseline, the runtime's share (CPU), peak raw."""
        out = {"memory_method": self.method, "baseline_bytes": self.baseline, "runtime_bytes": self.runtime}
        if not self.cuda:
            out["peak_rss_bytes"] = peak_rss_bytes()
            out["peak_reset"] = self.reset_ok
        return out
