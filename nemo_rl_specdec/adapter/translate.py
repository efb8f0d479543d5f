"""Pure logic of the NeMo-RL adapter: validating the block inside a NeMo-RL run, translating it
into `policy.generation.vllm_kwargs.speculative_config`, choosing the drafter's weight source,
and choosing the worker / worker-extension classes. No NeMo-RL import; unit-tested directly.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nemo_rl_specdec import resources
from nemo_rl_specdec.adapter import api
from nemo_rl_specdec.config.run import (
    BLOCK_PATH,
    ConfigError,
    GenerationConfig,
    SpecDecConfig,
    check_colocated_sleep,
    to_vllm_speculative_config,
    validate_run_dict,
)
from nemo_rl_specdec.config.schema import dotted_get
from nemo_rl_specdec.drafters.base import (  # noqa: F401  (the weight sources, re-exported for the adapter)
    MODEL,
    SOURCE_CHECKPOINT,
    SOURCE_CHECKPOINT_ONCE,
    SOURCE_NONE,
    SOURCE_POLICY_DISTILL,
    SOURCE_REFIT_STREAM,
)
from nemo_rl_specdec.drafters.registry import drafter as drafter_of
from nemo_rl_specdec.drafters.roles import Declared, NemoRLRules, Refreshable, TrainerStreams, VllmMapping
from nemo_rl_specdec.engine import vllm_compat
from nemo_rl_specdec.scheduling.budget import set_at_submission

GEN_PATH = "policy.generation"
SPEC_KWARGS_PATH = "policy.generation.vllm_kwargs.speculative_config"

# NeMo-RL's hardcoded worker FQNs -> ours (Ray actor classes built in workers.py).
OUR_SYNC_WORKER = "nemo_rl_specdec.adapter.workers.SpecDecVllmGenerationWorker"
OUR_ASYNC_WORKER = "nemo_rl_specdec.adapter.workers.SpecDecVllmAsyncGenerationWorker"
WORKER_SUBSTITUTES = {api.SYNC_WORKER: OUR_SYNC_WORKER, api.ASYNC_WORKER: OUR_ASYNC_WORKER}
# NeMo-RL's DTensor policy workers -> ours, which also distil the drafter (built in policy_workers.py).
POLICY_WORKER_SUBSTITUTES = {
    api.DTENSOR_WORKER: "nemo_rl_specdec.adapter.policy_workers.SpecDecDTensorPolicyWorker",
    api.DTENSOR_WORKER_V2: "nemo_rl_specdec.adapter.policy_workers.SpecDecDTensorPolicyWorkerV2",
}

# NeMo-RL's vLLM worker extensions -> our composites (built in extension.py).
OUR_EXTENSION = "nemo_rl_specdec.adapter.extension.SpecDecNemoRLWorkerExtension"
OUR_EXTENSION_CKPT = "nemo_rl_specdec.adapter.extension.SpecDecNemoRLWorkerExtensionWithCheckpointEngine"
EXTENSION_SUBSTITUTES = {api.HOST_EXTENSION: OUR_EXTENSION, api.HOST_EXTENSION_CKPT: OUR_EXTENSION_CKPT}

# Transports whose refit never runs the extension's weight-update lifecycle (no drafter refresh).
UNSUPPORTED_REFIT_TRANSPORTS = ("vllm_s3_sparse", "vllm_zmq_sparse")

# Where the drafter's weights come from in a NeMo-RL run.

# Generation-config keys (NeMo-RL style internal keys, like `_pad_token_id`) read by our workers:
WEIGHT_SOURCE_KEY = "_specdec_weight_source"  # where the drafter's weights come from
EXCHANGE_KEY = "_specdec_exchange"             # name of the Ray actor the engines swap rollouts through

ARCTIC_RECIPE = """\
The suffix drafter (suffix.backend das or vllm) needs arctic-inference in the Python environment of
NeMo-RL's vLLM workers. PyPI has only its source distribution; build it against that environment's torch:
  VENV=<the vLLM worker venv, e.g. $NEMO_RL_VENV_DIR/nemo_rl.models.generation.vllm.vllm_worker.VllmGenerationWorker>
  uv pip install --python $VENV/bin/python nanobind grpcio-tools cmake ninja
  PATH=$VENV/bin:$PATH uv pip install --python $VENV/bin/python --no-build-isolation arctic-inference==0.3.0
  $VENV/bin/python -c "import arctic_inference.suffix_decoding._C"
(docs/nemo_rl.md, "arctic-inference in NeMo-RL's vLLM environment")."""


ARCTIC_MODULE = "arctic_inference.suffix_decoding"


def needs_arctic(spec: SpecDecConfig) -> bool:
    """Whether the drafter builds arctic-inference suffix trees in the vLLM workers."""
    return ARCTIC_MODULE in drafter_of(spec, NemoRLRules).worker_modules


def arctic_missing_message(where: str, error: str, drafter: str = "suffix") -> str:
    return (f"{BLOCK_PATH}.drafter={drafter}: arctic_inference does not import in {where}: {error}\n"
            + ARCTIC_RECIPE)


# --------------------------------------------------------------------------- validation

def validate_block(gen_cfg: dict) -> SpecDecConfig | None:
    """The validated block from a NeMo-RL generation config, or None when it is absent.

    Only the block (and the sampling temperature it depends on) is validated here: the rest of
    `policy.generation` belongs to NeMo-RL, which accepts values our CPU schema does not
    (e.g. `vllm_cfg.precision: fp8`). Errors are ConfigError naming the dotted key path.
    """
    if not isinstance(gen_cfg, dict):
        raise ConfigError(f"{GEN_PATH}: got {gen_cfg!r}; allowed: a mapping")
    if gen_cfg.get("speculative_decoding") is None:
        return None
    # Keys our CPU schema declares (vllm_cfg, top_p, ...) are left to NeMo-RL; undeclared keys
    # stay in so a misspelt second copy of the block (`speculative_decodng`) is still caught.
    probe = {k: v for k, v in gen_cfg.items()
             if k not in GenerationConfig.model_fields or k in ("speculative_decoding", "temperature")}
    if probe.get("temperature") is None:
        probe.pop("temperature", None)
    run = validate_run_dict({"policy": {"model_name": "<nemo-rl run>", "generation": probe}})
    return run.spec


def enabled_spec(gen_cfg: Any) -> SpecDecConfig | None:
    """The block if present and enabled (after validation), else None."""
    if not isinstance(gen_cfg, dict):
        return None
    spec = validate_block(gen_cfg)
    return spec if spec is not None and spec.enabled else None


def drafter_weight_source(spec: SpecDecConfig, trainer_exports_draft: bool, trains_mtp: bool) -> str:
    """Where the drafter's weights come from in NeMo-RL 0.6.0.

    `trainer_exports_draft` is `policy.draft.enabled` (Megatron trains an Eagle head and streams
    it as `draft.*` tensors); `trains_mtp` is `policy.megatron_cfg.mtp_num_layers > 0`.
    """
    streams = TrainerStreams(draft=trainer_exports_draft, mtp=trains_mtp)
    return drafter_of(spec, NemoRLRules).weight_source(spec, streams)


def check_refresh_mode(spec: SpecDecConfig, source: str) -> None:
    """Reject refresh modes NeMo-RL cannot honour with this weight source (clear error, not a stale drafter)."""
    mode = spec.refresh.mode
    path = f"{BLOCK_PATH}.refresh.mode"
    if mode == "refit" and source != SOURCE_REFIT_STREAM:
        raise ConfigError(f"{path}: got 'refit'; {drafter_of(spec, NemoRLRules).refit_hint}")
    if mode == "online" and source == SOURCE_CHECKPOINT_ONCE:
        raise ConfigError(
            f"{path}: got 'online' with drafter 'mtp' and no trainer-side MTP layers; in NeMo-RL the MTP layers "
            "are refreshed by the trainer (policy.megatron_cfg.mtp_num_layers > 0, then 'refit' or 'online'); "
            "allowed here: 'frozen'")
    if mode == "frozen" and source == SOURCE_REFIT_STREAM:
        raise ConfigError(
            f"{path}: got 'frozen', but {drafter_of(spec, NemoRLRules).trainer_stream} makes the trainer stream new "
            "drafter weights every step; "
            f"use 'online' or 'refit', or turn the trainer-side drafter off"
        )


def rollouts_wanted(spec: SpecDecConfig) -> bool:
    """Whether each policy update hands the step's rollouts to the engines' drafters: only DAS
    builds from them (model drafters are distilled in the policy workers). The driver starts the
    rollout exchange exactly when the workers keep a stash: both ask here."""
    return rollout_prompt_tail(spec) is not None


def rollout_prompt_tail(spec: SpecDecConfig) -> int | None:
    """Prompt tokens (the tail) each rollout carries to the engines' drafters; None: they take none."""
    return drafter_of(spec, Refreshable).rollout_prompt_tail(spec)


def check_distill_policy(policy: dict) -> None:
    """The policy backend can host the online distiller (DTensor, data parallel only), or a clear error."""
    path = f"{BLOCK_PATH}.refresh.mode"
    if dotted_get(policy, "megatron_cfg.enabled", False):
        raise ConfigError(
            f"{path}: got 'online' with policy.megatron_cfg.enabled=true; the online distiller of a draft model "
            "or Eagle3 head runs in NeMo-RL's DTensor policy workers; allowed: policy.dtensor_cfg.enabled=true, "
            "or refresh.mode 'frozen' (eagle3 with Megatron: 'refit' with policy.draft.enabled=true)")
    if not dotted_get(policy, "dtensor_cfg.enabled", False):
        raise ConfigError(f"policy.dtensor_cfg.enabled: got false with {path}='online'; the online distiller runs "
                          "in NeMo-RL's DTensor policy workers; allowed: true")
    for key in ("tensor_parallel_size", "context_parallel_size"):
        size = dotted_get(policy, f"dtensor_cfg.{key}", 1) or 1
        if size != 1:
            raise ConfigError(
                f"policy.dtensor_cfg.{key}: got {size} with {path}='online'; the distiller reads the policy's full "
                "logits and hidden states on every rank, which holds only with data parallelism (FSDP); allowed: 1 "
                "(or refresh.mode 'frozen')")


def distills_in_policy(gen_cfg: dict, spec: SpecDecConfig | None, trainer_exports_draft: bool = False) -> bool:
    """Whether the policy workers distil the drafter online (the policy side of the adapter)."""
    if spec is None:
        return False
    source = gen_cfg.get(WEIGHT_SOURCE_KEY) or drafter_weight_source(spec, trainer_exports_draft, False)
    return source == SOURCE_POLICY_DISTILL


def check_run(raw: dict) -> SpecDecConfig | None:
    """Validate a composed NeMo-RL run dict for our block (before NeMo-RL is imported).

    Returns the enabled block, or None when the block is absent or disabled.
    """
    policy = raw.get("policy") if isinstance(raw, dict) else None
    if not isinstance(policy, dict):
        raise ConfigError("policy: missing; a NeMo-RL run file needs a `policy:` mapping")
    if not policy.get("model_name"):
        raise ConfigError("policy.model_name: missing; allowed: a Hugging Face id or a checkpoint path")
    gen = policy.get("generation")
    if gen is None:
        raise ConfigError(f"{GEN_PATH}: missing; GRPO needs a generation config")
    spec = enabled_spec(gen)
    if spec is None:
        return None
    trainer_exports_draft = bool(dotted_get(policy, "draft.enabled", False))
    trains_mtp = bool(dotted_get(policy, "megatron_cfg.mtp_num_layers", 0) or 0)
    _check_generation_compat(gen, spec)
    check_colocated_sleep({**gen, "model_name": gen.get("model_name") or policy["model_name"]}, spec)
    source = drafter_weight_source(spec, trainer_exports_draft, trains_mtp)
    check_refresh_mode(spec, source)
    if source == SOURCE_POLICY_DISTILL:
        check_distill_policy(policy)
    drafter_of(spec, NemoRLRules).check_nemo_rl(spec, policy)
    return spec


def _check_generation_compat(gen: dict, spec: SpecDecConfig) -> None:
    backend = gen.get("backend", "vllm")
    if backend != "vllm":
        raise ConfigError(f"{GEN_PATH}.backend: got {backend!r}; allowed: 'vllm' when {BLOCK_PATH}.enabled=true")
    if gen.get("quant_cfg") is not None:
        raise ConfigError(
            f"{GEN_PATH}.quant_cfg: set together with {BLOCK_PATH}.enabled=true; both replace NeMo-RL's "
            "vLLM worker (ModelOpt quantization and speculative decoding) and cannot be combined"
        )
    budget = spec.scheduling.budget
    if budget is not None and set_at_submission(budget) and (gen.get("vllm_cfg") or {}).get("async_engine"):
        raise ConfigError(
            f"{BLOCK_PATH}.scheduling.budget: got {spec.scheduling.budget!r} with "
            f"{GEN_PATH}.vllm_cfg.async_engine=true; per-request budgets are computed over an engine's "
            "batch, and NeMo-RL's async engine receives one request at a time; allowed here: 'uniform', or "
            "'adaptive' (chosen inside the engine at every step; without length predictions there)")
    if spec.scheduling.k == "auto" and (gen.get("vllm_cfg") or {}).get("async_engine"):
        raise ConfigError(
            f"{BLOCK_PATH}.scheduling.k: got 'auto' with {GEN_PATH}.vllm_cfg.async_engine=true; k: auto re-chooses "
            "k in vLLM's scheduler, which NeMo-RL's async engine runs in another process; allowed here: null "
            f"(with num_speculative_tokens, or {BLOCK_PATH}.scheduling.k_by_batch_size)")
    if spec.on_refresh_error == "disable" and drafter_of(spec, Declared).kind == MODEL:
        raise ConfigError(
            f"{BLOCK_PATH}.on_refresh_error: got 'disable' with drafter={spec.drafter!r}; NeMo-RL's vLLM engine "
            "keeps a model drafter for the whole run, so a failed refresh could not really turn speculation off; "
            "allowed here: 'raise' ('disable' works with drafter=suffix, whose proposer stops drafting)")
    transport = gen.get("refit_transport")
    if transport in UNSUPPORTED_REFIT_TRANSPORTS:
        raise ConfigError(
            f"{GEN_PATH}.refit_transport: got {transport!r}; sparse refits bypass the weight-update hook "
            f"that refreshes the drafter; use null (IPC/NCCL), 'nixl' or 'nccl_reshard'"
        )
    existing = dotted_get(gen, "vllm_kwargs.speculative_config")
    if existing:
        want = to_vllm_speculative_config(spec, float(gen.get("temperature", 1.0) or 0.0))
        # ours as written, or as the preflight fitted it to the workers' vLLM (which may drop keys)
        fitted = {k: v for k, v in (want or {}).items() if k not in vllm_compat.DROPPABLE}
        if existing not in (want, fitted):
            raise ConfigError(
                f"{SPEC_KWARGS_PATH}: set by hand ({existing!r}) while {BLOCK_PATH}.enabled=true; "
                f"remove it, the block writes it (would be {want!r})"
            )


# --------------------------------------------------------------------------- translation

def apply_to_generation_config(
    gen_cfg: dict, has_refit_draft_weights: bool = False, trains_mtp: bool = False
) -> tuple[dict, bool]:
    """Write `vllm_kwargs.speculative_config` from the block, before `configure_generation_config`.

    Returns (generation config, `has_refit_draft_weights` to pass on). For drafters without
    weights (suffix, ngram) and drafters streamed by the trainer, that flag is True so NeMo-RL
    keeps `load_format=dummy` (the first refit supplies the policy) instead of forcing a full
    load from disk; eagle3 / draft_model read from their own checkpoint keep NeMo-RL's full load
    (vLLM loads the drafter with the engine's load format).
    """
    spec = enabled_spec(gen_cfg)
    if spec is None:
        return gen_cfg, has_refit_draft_weights
    _check_generation_compat(gen_cfg, spec)
    source = drafter_weight_source(spec, has_refit_draft_weights, trains_mtp)
    check_refresh_mode(spec, source)
    temperature = float(gen_cfg.get("temperature", 1.0) or 0.0)
    kwargs = gen_cfg.get("vllm_kwargs") or {}
    kwargs = dict(kwargs)
    kwargs["speculative_config"] = to_vllm_speculative_config(spec, temperature)
    for key, value in drafter_of(spec, VllmMapping).engine_args(spec).items():  # what it needs of vLLM's engine
        if key in kwargs and kwargs[key] != value:
            raise ConfigError(f"policy.generation.vllm_kwargs.{key}: got {kwargs[key]!r}; allowed: {value!r} (or "
                              f"unset) with drafter {spec.drafter!r}")
        kwargs[key] = value
    gen_cfg["vllm_kwargs"] = kwargs
    gen_cfg[WEIGHT_SOURCE_KEY] = source
    if source in (SOURCE_NONE, SOURCE_REFIT_STREAM):
        return gen_cfg, True
    return gen_cfg, has_refit_draft_weights


def engine_init_payload(gen_cfg: dict) -> dict | None:
    """What the worker hands to `specdec_init` in every vLLM worker: the validated block."""
    spec = enabled_spec(gen_cfg)
    return None if spec is None else spec.model_dump(mode="json")


# --------------------------------------------------------------------------- classes and envs

def select_worker_fqn(default_cls: str, gen_cfg: dict, original: Callable[[str, dict], str]) -> str:
    """Replacement for NeMo-RL's `resolve_generation_worker_cls` (same parameters)."""
    spec = enabled_spec(gen_cfg)
    if spec is None:
        return original(default_cls, gen_cfg)
    _check_generation_compat(gen_cfg, spec)
    try:
        return WORKER_SUBSTITUTES[default_cls]
    except KeyError:
        raise RuntimeError(
            f"NeMo-RL asked for generation worker {default_cls!r}, which nemo-rl-specdec does not know; "
            f"known: {sorted(WORKER_SUBSTITUTES)}. Supported: {api.SUPPORTED}."
        ) from None


def extension_fqn_for(host_fqn: str | None) -> str:
    """Our composite extension for the host extension NeMo-RL chose."""
    if host_fqn in EXTENSION_SUBSTITUTES:
        return EXTENSION_SUBSTITUTES[host_fqn]
    if host_fqn is not None and host_fqn in EXTENSION_SUBSTITUTES.values():
        return host_fqn  # already ours
    raise RuntimeError(
        f"vLLM worker_extension_cls is {host_fqn!r}; nemo-rl-specdec composes only with "
        f"{sorted(EXTENSION_SUBSTITUTES)}"
    )


def inject_extension(llm_kwargs: dict) -> str:
    """Point `llm_kwargs['worker_extension_cls']` at our composite; returns the new FQN."""
    fqn = extension_fqn_for(llm_kwargs.get("worker_extension_cls"))
    llm_kwargs["worker_extension_cls"] = fqn
    return fqn


def extra_env_var_names(existing: Any | None) -> list[str]:
    """Env vars forwarded into vLLM's own (TP>1) Ray workers: ours must import there too."""
    names = list(existing or [])
    for n in ("PYTHONPATH",):
        if n not in names:
            names.append(n)
    return names


def package_import_root(pkg_dir: Path | None = None, cache_dir: Path | None = None) -> Path:
    """A directory that, on PYTHONPATH, makes `nemo_rl_specdec` importable in NeMo-RL's worker venvs.

    A source checkout: its root. A site-packages install: a directory holding only a symlink to
    the package (putting a whole site-packages on PYTHONPATH would mix two environments).
    """
    pkg_dir = Path(pkg_dir or Path(__file__).resolve().parent.parent)
    parent = pkg_dir.parent
    if parent.name not in ("site-packages", "dist-packages"):
        return parent
    cache_dir = Path(cache_dir or resources.cache_dir() / "pythonpath")
    cache_dir.mkdir(parents=True, exist_ok=True)
    link = cache_dir / pkg_dir.name
    if not link.exists():
        link.symlink_to(pkg_dir, target_is_directory=True)
    return cache_dir


def pythonpath_with(entry: str, current: str | None) -> str:
    parts = [p for p in (current or "").split(os.pathsep) if p]
    if entry in parts:
        return os.pathsep.join(parts)
    return os.pathsep.join([entry, *parts])


def worker_python_env(base_env: str, base_fqn: str, venv_dir: str | None,
                      exists: Callable[[str], bool] = os.path.exists) -> str:
    """The python for our worker actor: reuse the venv NeMo-RL built for the base worker if present.

    NeMo-RL builds one uv venv per actor FQN; a new FQN would build a second, identical vLLM
    venv. A registry value that does not start with `uv` is used verbatim by NeMo-RL.
    """
    if os.environ.get("NEMO_RL_SPECDEC_WORKER_PYTHON"):
        return os.environ["NEMO_RL_SPECDEC_WORKER_PYTHON"]
    if not base_env.startswith("uv") or not venv_dir:
        return base_env
    candidate = os.path.join(venv_dir, base_fqn, "bin", "python")
    return candidate if exists(candidate) else base_env


def registry_entries(registry: dict, venv_dir: str | None, policy_workers: bool = False) -> dict[str, str]:
    """Actor-environment registry entries for our worker FQNs (with `policy_workers`, the
    distilling DTensor policy workers too)."""
    out = {}
    subs = dict(WORKER_SUBSTITUTES)
    if policy_workers:
        subs.update(POLICY_WORKER_SUBSTITUTES)
    for base, ours in subs.items():
        if base not in registry:
            raise RuntimeError(f"NeMo-RL's actor registry has no entry for {base}; supported: {api.SUPPORTED}")
        out[ours] = worker_python_env(registry[base], base, venv_dir)
    return out

