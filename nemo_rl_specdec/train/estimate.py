"""Memory of a distillation step without allocating it: torch's fake tensors and its memory tracker.

A step at Qwen3-8B shapes holds tens of GB; on a CPU machine it can neither fit nor finish. Under
torch's ``FakeTensorMode`` every floating-point tensor has its shape, dtype and device but no
storage, and ``torch.distributed._tools.mem_tracker.MemTracker`` adds up the bytes each tensor
would take, live and at the peak, as the same code runs. What a step allocates depends only on
shapes, so the peak it reports is the step's.

What fake tensors cannot do is answer a question about values: how many positions a boolean mask
selects (its indexing makes a tensor of that many rows), ``int(mask.sum())``. Those questions are
asked of the integer and boolean tensors made from the rollouts (token ids, response masks,
positions, anchors), which are small, so :class:`HostValues` keeps them real: an op whose inputs
are all real (or a factory of an integer or boolean tensor) runs for real, and a floating-point
tensor indexed by a real boolean mask is indexed by the mask's positions, whose count is known.
A value read from a fake tensor (a loss, a norm, a finiteness check) has no answer; it reads as 1
(True for a boolean), which keeps every step's arithmetic defined (AdamW's bias correction divides
by 1 - beta ** step). The distillers skip what only values decide under ``estimating()``
(train/distill.py): reading checkpoint tensors and checking the policy's logits.

    with fake_tensors():
        teacher, distiller = build(...)           # shapes only: nothing is allocated
        tracker = MemTracker(); tracker.track_external(teacher, distiller.module, distiller.opt)
        with tracker:
            distiller.step(teacher, rollouts)
        peak = tracker.get_tracker_snapshot("peak")
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def _is_fake(t: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def _exact(dtype: Any) -> bool:
    """Integer and boolean dtypes: the ones whose values the step's shapes depend on."""
    return not (dtype.is_floating_point or dtype.is_complex)


def host_values_mode() -> Any:
    """The :class:`HostValues` dispatch mode class (built on first use: importing this module imports no torch)."""
    global _HOST_VALUES
    if _HOST_VALUES is None:
        _HOST_VALUES = _build_host_values()
    return _HOST_VALUES


_HOST_VALUES: Any = None


def _build_host_values() -> Any:
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    aten = torch.ops.aten
    indexing = (aten.index.Tensor, aten.index_put_.default, aten.index_put.default)

    class HostValues(TorchDispatchMode):
        """Entered inside a ``FakeTensorMode``: real integer and boolean tensors stay real (module docstring)."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            fake = any(_is_fake(t) for t in tensors)
            if func is aten._local_scalar_dense.default and fake:
                dtype = args[0].dtype
                return True if dtype == torch.bool else (1.0 if dtype.is_floating_point else 1)
            if not fake:
                if tensors:  # every input real: run it for real
                    with unset_fake_temporarily():
                        return func(*args, **kwargs)
                out = func(*args, **kwargs)  # a factory: real where it makes integers or booleans
                made = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
                if made and all(_exact(t.dtype) for t in made):
                    with unset_fake_temporarily():
                        return func(*args, **kwargs)
                return out
            if func in indexing:  # a real boolean mask selects a known number of positions
                index: list = []
                for i in args[1]:
                    if isinstance(i, torch.Tensor) and not _is_fake(i) and i.dtype == torch.bool:
                        with unset_fake_temporarily():
                            index.extend(i.nonzero().unbind(1))
                    else:
                        index.append(i)
                args = (args[0], index, *args[2:])
            return func(*args, **kwargs)

    return HostValues


@contextlib.contextmanager
def fake_tensors() -> Iterator[Any]:
    """Fake floating-point tensors, real integer and boolean ones (module docstring); yields the fake mode."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True) as mode, host_values_mode()():
        yield mode


def tensor_nbytes(tensors) -> int:
    """Bytes of `tensors` (numel x element size; fake tensors have no storage to ask)."""
    return sum(t.numel() * t.element_size() for t in tensors)


def module_nbytes(module: Any) -> int:
    """Bytes of a module's parameters and buffers."""
    return tensor_nbytes(list(module.parameters()) + list(module.buffers()))


def tracked_peak(snapshot: dict) -> int:
    """The peak bytes over devices of a MemTracker ``get_tracker_snapshot('peak')``."""
    return max((int(v.get("Total", 0)) for v in snapshot.values()), default=0)


def step_tracker() -> Any:
    """A ``MemTracker`` for whole distillation steps, keeping only what is read of it: the per-device
    totals, current and peak, which are the tracker's own. Its per-module statistics are left out:
    torch's refuses a module called a second time from the top level (they cover one call; a step
    calls its modules once per micro-batch and epoch), so such a call starts them over, and they
    are not updated at every op (a walk over every module of a 36-layer teacher per op)."""
    from copy import deepcopy

    from torch.distributed._tools.mem_tracker import MemTracker

    class StepMemTracker(MemTracker):
        def _update_peak_stats(self, peak_state):
            for dev, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snap["Total"]:
                    self._peak_mem[dev] = snap["Total"]
                    self._peak_mem_snap[dev] = deepcopy(snap)

        def _pre_fw_hook(self, module, inputs):
            if module in self.memory_tracking and not self._mod_tracker.is_bw:
                name = self._mod_tracker.get_known_fqn(module)
                if set(self._mod_tracker.parents) - {name} == {"Global"}:
                    del self.memory_tracking[module]
            return super()._pre_fw_hook(module, inputs)

    return StepMemTracker()


def step_memory(distiller: Any, teacher: Any, rollouts: Any) -> dict:
    """Bytes of a step of `distiller` towards `teacher` on `rollouts`, estimated without allocating:
    a twin of the distiller (same checkpoint and settings) and a teacher of the same config and
    dtype, built under fake tensors, two steps tracked (`track_step`). Returns ``peak``, ``teacher`` (its weights),
    ``state`` (the twin's trained parameters x bytes x 4: parameters, gradients, AdamW's moments) and
    ``transient`` (the rest), as bench --suite distill splits a measured peak."""
    import torch
    from transformers import AutoModelForCausalLM

    param = next(teacher.parameters())
    with torch.random.fork_rng(devices=[]), fake_tensors():  # the twin's seeding leaves the caller's RNG alone
        twin = distiller.twin()
        with _default_device(twin.device):
            fake_teacher = AutoModelForCausalLM.from_config(teacher.config, dtype=param.dtype).eval()
        t = track_step(twin, fake_teacher, rollouts)
    state = t["params"] * t["param_bytes"] * 4
    return {"peak": t["peak"], "teacher": t["teacher"], "state": state, "transient": t["peak"] - t["teacher"] - state}


def track_step(distiller: Any, teacher: Any, rollouts: Any, steps: int = 2) -> dict:
    """`steps` steps of `distiller` towards `teacher` tracked by `step_tracker`: the tracker's ``peak``
    bytes, the ``teacher``'s weights in bytes, and the distiller's trained ``params`` with their
    ``param_bytes`` and ``param_dtype``. Two by default: a second step is the steady state, its
    teacher pass made beside AdamW's moments, which the first step's teacher pass runs without.
    Under `fake_tensors` nothing is allocated; outside it the steps allocate for real and the
    tracker counts the bytes of every tensor they make."""
    tracker = step_tracker()
    tracker.track_external(teacher, distiller.module, distiller.opt)
    with tracker:
        for _ in range(steps):
            distiller.step(teacher, rollouts)
    params = [p for p in distiller.module.parameters() if p.requires_grad]
    return {"peak": tracked_peak(tracker.get_tracker_snapshot("peak")), "teacher": module_nbytes(teacher),
            "params": sum(p.numel() for p in params), "param_bytes": params[0].element_size() if params else 4,
            "param_dtype": str(params[0].dtype).removeprefix("torch.") if params else None}


@contextlib.contextmanager
def _default_device(device: Any) -> Iterator[None]:
    import torch

    with torch.device(device):
        yield
