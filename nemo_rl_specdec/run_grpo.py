"""`python -m nemo_rl_specdec.run_grpo --config RUN.yaml [overrides]`: NeMo-RL GRPO with speculative decoding.

1. Compose the run file (inheritance, overrides) and validate `policy.generation.speculative_decoding`
   — before NeMo-RL is imported. Bad block, or a resume from a checkpoint written without the block
   or with another drafter (`adapter/checkpoint.py`): message naming the key, exit 2.
2. NeMo-RL missing: message saying how to install it, exit 1. A `${specdec_model:NAME}` policy
   checkpoint is made (converted and cached) here, or the message says why it could not be, exit 1.
   NeMo-RL's entry script is imported and the launch checked (`launch_errors.py`: its import-time
   assertions, missing packages, the local Ray cluster's dashboard packages and GPUs, the policy
   weights reachable): a failure is one line naming it and what to do, exit 1, nothing written in
   the working directory. `NEMO_RL_SPECDEC_DEBUG=1` re-raises any of these errors (and a config
   error) instead, with its full traceback.
3. Block enabled: check that this NeMo-RL has every hook the run needs (`api.check_support`;
   a missing one is an error naming it, and nothing is patched), then apply the substitutions
   (`install`): PYTHONPATH for the Ray workers, actor registry entries for our worker FQNs,
   NeMo-RL's `resolve_generation_worker_cls` wrapped so it returns them,
   `nemo_rl.algorithms.grpo.VllmGeneration` rebound to our subclass, `grpo.validate` wrapped so
   validation rollouts never reach the drafter, and the entry script's
   `configure_generation_config` wrapped so the block becomes `vllm_kwargs.speculative_config`
   before NeMo-RL configures generation, and `CheckpointManager.init_tmp_checkpoint` wrapped so
   each checkpoint carries our marker (the drafter it was written with). With `refresh.mode: online`
   for a draft model or Eagle3 head, also NeMo-RL's `resolve_policy_worker_cls` (our distilling
   DTensor policy workers) and `Policy.__init__` / `Policy.train` (publish each distilled drafter;
   policy_workers.py).
4. Run NeMo-RL's own `examples/run_grpo.py:main` (sync or async GRPO, as the run file says).
   Block absent or disabled: step 3 is skipped and NeMo-RL runs unchanged.
"""
from __future__ import annotations

import argparse
import functools
import importlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

from nemo_rl_specdec import models
from nemo_rl_specdec.adapter import api, checkpoint, launch_errors, translate
from nemo_rl_specdec.config import loader as config_loader
from nemo_rl_specdec.config.run import ConfigError

EXIT_OK, EXIT_RUNTIME, EXIT_CONFIG = 0, 1, 2


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    ap = argparse.ArgumentParser(
        prog="python -m nemo_rl_specdec.run_grpo",
        description="NeMo-RL GRPO with lossless speculative decoding (policy.generation.speculative_decoding).",
    )
    ap.add_argument("--config", required=True, help="NeMo-RL run YAML (may inherit with `defaults:`)")
    args, overrides = ap.parse_known_args(argv)
    stray = [o for o in overrides if o.startswith("-")]
    if stray:
        ap.error(f"unrecognized arguments: {' '.join(stray)} (overrides look like a.b=c, ++a.b=c, ~a.b)")
    return args, overrides


def make_configure_wrapper(original: Callable) -> Callable:
    """Wrap NeMo-RL's `configure_generation_config` (same parameters): translate the block first."""

    def configure_generation_config(config, tokenizer, is_eval=False, has_refit_draft_weights=False, trains_mtp=False):
        config, has_refit = translate.apply_to_generation_config(config, has_refit_draft_weights, trains_mtp)
        return original(config, tokenizer, is_eval=is_eval, has_refit_draft_weights=has_refit, trains_mtp=trains_mtp)

    functools.update_wrapper(configure_generation_config, original, assigned=(), updated=())  # sets only __wrapped__
    return configure_generation_config


def make_resolver(original: Callable[[str, dict], str]) -> Callable[[str, dict], str]:
    """Wrap NeMo-RL's `resolve_generation_worker_cls` (same parameters)."""

    def resolve_generation_worker_cls(default_cls, config):
        return translate.select_worker_fqn(default_cls, config, original)

    functools.update_wrapper(resolve_generation_worker_cls, original, assigned=(), updated=())  # sets only __wrapped__
    return resolve_generation_worker_cls


def make_policy_resolver(original: Callable[[str, dict], str]) -> Callable[[str, dict], str]:
    """Wrap NeMo-RL's `resolve_policy_worker_cls` (same parameters): our distilling DTensor workers."""
    subs = translate.POLICY_WORKER_SUBSTITUTES

    def resolve_policy_worker_cls(default_cls, config):
        chosen = original(default_cls, config)
        if chosen != default_cls or default_cls not in subs:
            raise api.UnsupportedNeMoRL(
                f"{translate.BLOCK_PATH}.refresh.mode=online distils the drafter in NeMo-RL's DTensor policy "
                f"workers, but this run's policy worker is {chosen!r} (policy.quant_cfg or a non-DTensor backend); "
                f"allowed: {sorted(subs)}")
        return subs[default_cls]

    functools.update_wrapper(resolve_policy_worker_cls, original, assigned=(), updated=())  # sets only __wrapped__
    return resolve_policy_worker_cls


def make_validate_wrapper(original: Callable) -> Callable:
    """Wrap NeMo-RL's `grpo.validate(policy_generation, ...)`: its rollouts are marked as validation."""
    from nemo_rl_specdec.adapter.generation import validating

    @functools.wraps(original)
    def validate(policy_generation, *args, **kwargs):
        with validating(policy_generation):
            return original(policy_generation, *args, **kwargs)

    return validate


_ABSENT = object()  # an attribute `install` added (uninstall deletes it)


def install(env: MutableMapping[str, str] | None = None, gen_cfg: dict | None = None,
            trains_mtp: bool = False, exports_draft: bool = False, resume_from: Path | None = None,
            run: dict | None = None) -> list[tuple[Any, str, Any]]:
    """Check support for `gen_cfg` (NeMo-RL's `policy.generation` with our block), then apply the
    substitutions; returns (object, attribute, previous value) for `uninstall`. Raises
    `api.UnsupportedNeMoRL` (nothing patched) when a hook the run needs is missing.
    `exports_draft`: `policy.draft.enabled` (the trainer streams an Eagle head). `resume_from`: the
    checkpoint NeMo-RL resumes from (`checkpoint.check_resume`), whose drafter state the engines and
    the policy workers restore; `run`: the whole run file (the policy's vocabulary it names)."""
    env = os.environ if env is None else env
    gen_cfg = gen_cfg if gen_cfg is not None else {}
    spec = translate.enabled_spec(gen_cfg)
    distills = translate.distills_in_policy(gen_cfg, spec, exports_draft)
    api.check_support(gen_cfg, spec, trains_mtp, distills)
    undo: list[tuple[Any, str, Any]] = []

    def setattr_undo(obj: Any, name: str, value: Any) -> None:
        undo.append((obj, name, getattr(obj, name, _ABSENT)))
        setattr(obj, name, value)

    entry = str(translate.package_import_root())
    env["PYTHONPATH"] = translate.pythonpath_with(entry, env.get("PYTHONPATH"))

    registry = api.resolve(api.ACTOR_REGISTRY)
    venv_dir = env.get("NEMO_RL_VENV_DIR") or api.resolve(api.DEFAULT_VENV_DIR)
    for fqn, python in translate.registry_entries(registry, venv_dir, policy_workers=distills).items():
        undo.append((registry, fqn, registry.get(fqn)))
        registry[fqn] = python

    resolver_module = importlib.import_module(api.RESOLVER_MODULE)
    setattr_undo(resolver_module, api.RESOLVER_NAME, make_resolver(getattr(resolver_module, api.RESOLVER_NAME)))

    from nemo_rl_specdec.adapter import generation

    grpo = importlib.import_module(api.GRPO_MODULE)
    setattr_undo(grpo, "VllmGeneration", generation.SpecDecVllmGeneration)
    setattr_undo(grpo, "validate", make_validate_wrapper(grpo.validate))

    script = api.load_run_grpo_module()
    setattr_undo(script, "configure_generation_config", make_configure_wrapper(script.configure_generation_config))

    if spec is not None:
        checkpoint.SESSION = checkpoint.Session(spec, resume_from, run)
        manager = api.resolve(api.CHECKPOINT_MANAGER)
        setattr_undo(manager, "init_tmp_checkpoint",
                     checkpoint.wrap_init_tmp_checkpoint(manager.init_tmp_checkpoint, checkpoint.SESSION))

    if distills:
        from nemo_rl_specdec.adapter.policy_workers import wrap_policy

        policy_module = importlib.import_module(api.POLICY_MODULE)
        setattr_undo(policy_module, api.POLICY_RESOLVER_NAME,
                     make_policy_resolver(getattr(policy_module, api.POLICY_RESOLVER_NAME)))
        policy_cls = api.resolve(api.POLICY)
        temperature = float(gen_cfg.get("temperature", 1.0) or 0.0)
        for name, fn in wrap_policy(policy_cls, spec, temperature).items():
            setattr_undo(policy_cls, name, fn)
    return undo


def uninstall(undo: list[tuple[Any, str, Any]]) -> None:
    for obj, name, old in reversed(undo):
        if isinstance(obj, dict):
            if old is None:
                obj.pop(name, None)
            else:
                obj[name] = old
        elif old is _ABSENT:
            delattr(obj, name)
        else:
            setattr(obj, name, old)
    checkpoint.SESSION = None


def write_composed(composed: config_loader.Composed, out_dir: str | None = None) -> Path:
    """The composed run file (parents merged, interpolations kept) for NeMo-RL's own loader."""
    directory = Path(out_dir or tempfile.mkdtemp(prefix="nemo_rl_specdec_"))
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"composed_{composed.source.stem}.yaml"
    path.write_text(composed.to_yaml())
    return path


def fail(e: BaseException, code: int) -> int:
    """Print `e` as the one-line error of exit `code`; with NEMO_RL_SPECDEC_DEBUG=1 re-raise it instead,
    its traceback and the exception it was made from printed in full."""
    if launch_errors.debug():
        raise e
    print(f"error: {e}", file=sys.stderr)
    return code


def prepare(argv: list[str]) -> tuple[int, dict | None]:
    """Steps 1-2 (no NeMo-RL import). Returns (exit code or -1 to continue, launch plan)."""
    args, overrides = parse_args(argv)
    root = api.find_nemo_rl_root()
    resume_from = None
    try:
        base = config_loader.compose(args.config, [], root)
        full = config_loader.compose(args.config, overrides, root)
        if full.missing_parents:
            # The parents live in a NeMo-RL checkout we cannot see: check the block the file
            # itself carries, then say what is missing.
            try:
                raw = full.resolved()
            except ConfigError:
                raw = {}
            gen = (raw.get("policy") or {}).get("generation")
            if isinstance(gen, dict):
                translate.validate_block(gen)
            spec = None
        else:
            spec = translate.check_run(full.resolved())
            resume_from = checkpoint.check_resume(full.resolved(), spec)
    except ConfigError as e:
        return fail(e, EXIT_CONFIG), None
    if not api.nemo_rl_available():
        print(f"error: {api.INSTALL_HINT}", file=sys.stderr)
        return EXIT_RUNTIME, None
    if full.missing_parents:
        print(f"error: {args.config}: parent configs not found: {full.missing_parents} "
              f"(NeMo-RL checkout: {root}; set NEMO_RL_ROOT)", file=sys.stderr)
        return EXIT_CONFIG, None
    policy = full.resolved().get("policy") or {}
    try:  # a `${specdec_model:NAME}` policy is made here, before NeMo-RL starts any worker
        if policy.get("model_name"):
            models.ensure(str(policy["model_name"]))
    except models.ModelUnavailable as e:
        if launch_errors.debug():
            raise
        print(f"error: policy.model_name: {e}", file=sys.stderr)
        return EXIT_RUNTIME, None
    trains_mtp = bool(((policy.get("megatron_cfg") or {}).get("mtp_num_layers")) or 0)
    exports_draft = bool((policy.get("draft") or {}).get("enabled"))
    return -1, {"config": args.config, "overrides": overrides, "spec": spec, "base": base,
                "resolved": full.resolved(), "generation": policy.get("generation"), "trains_mtp": trains_mtp,
                "exports_draft": exports_draft, "resume_from": resume_from}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    code, plan = prepare(argv)
    if code >= 0:
        return code
    assert plan is not None  # prepare returns a plan whenever it says continue (-1)
    try:  # nothing is written in the working directory before these pass (launch_errors.py)
        try:
            script = api.load_run_grpo_module()
        except api.NeMoRLMissing:
            raise
        except (ImportError, AssertionError) as e:
            raise launch_errors.import_failure(e, "NeMo-RL's examples/run_grpo.py") from e
        launch_errors.check_before_launch(plan["resolved"])
    except (api.NeMoRLMissing, launch_errors.LaunchError) as e:
        return fail(e, EXIT_RUNTIME)
    config_path = Path(plan["config"])
    if not plan["base"].uses_nemo_rl_parent:
        return launch(script, plan, config_path)
    config_path = write_composed(plan["base"])
    print(f"[specdec] composed run file (NeMo-RL base merged; removed when the run ends): {config_path}")
    try:
        return launch(script, plan, config_path)
    finally:
        shutil.rmtree(config_path.parent, ignore_errors=True)


def launch(script: Any, plan: dict, config_path: Path) -> int:
    """Step 3: install the block's substitutions and run NeMo-RL's `main` on `config_path`."""
    try:
        if plan["spec"] is not None:
            install(gen_cfg=plan["generation"], trains_mtp=plan["trains_mtp"], exports_draft=plan["exports_draft"],
                    resume_from=plan.get("resume_from"), run=plan["resolved"])
            spec = plan["spec"]
            print(f"[specdec] speculative decoding on: drafter={spec.drafter} k={spec.num_speculative_tokens} "
                  f"refresh={spec.refresh.mode} placement={spec.scheduling.placement}")
        else:
            print("[specdec] policy.generation.speculative_decoding absent or disabled: "
                  "running NeMo-RL's GRPO unchanged")
    except (api.NeMoRLMissing, api.UnsupportedNeMoRL) as e:
        return fail(e, EXIT_RUNTIME)
    sys.argv = [str(Path(script.__file__)), "--config", str(config_path), *plan["overrides"]]
    try:
        script.main()
    except ConfigError as e:
        return fail(e, EXIT_CONFIG)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
