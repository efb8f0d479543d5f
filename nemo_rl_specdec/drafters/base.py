"""The drafter contract: what one speculative-decoding method declares so that the rest of the
package asks it instead of comparing drafter names.

A drafter is a class with a few class attributes and methods, one file per drafter, listed once
in `drafters/registry.py`:

- identity: `name` (the `drafter:` value), `kind` (`list`: any draft length per request, per-step
  host work; `model`: k fixed at engine start, a module in the engine), `draft_cost` (how its
  drafting scales: `host`, `sequential` k small forwards, or one `parallel` block forward), and
  `variants` (its configurations worth running side by side: lossless suite cases, bench rows);
- configuration: `config` (its sub-block `speculative_decoding.<name>`), `refresh_modes` (the
  first is the default), `check(spec)` for cross-field rules, `check_policy(spec, policy_dir)`
  against a local policy checkpoint, `vllm_config(spec, temperature)`, `engine_args(spec)` (vLLM
  engine arguments it needs besides its speculative_config);
- weights: `checkpoint(spec)` (its own checkpoint, if any), `weights_in_policy_checkpoint` (MTP
  layers ride in the policy's), `takes_request_budgets(spec)`, `judges_steps(spec)` (our proposer
  cuts each step's drafts), `rollout_prompt_tail(spec)` (it builds from rollouts), `cost_parts(spec)`
  (the profile entries of a drafter made of parts),
  `engine_proposer(runner, spec)` (a proposer of ours beside the engine's model drafter);
- online refresh: `distiller(spec, ...)` returns its `train.distill.Distiller`;
  `CheckpointDrafter` is the common case: a checkpoint of its own in `<name>.model`, vLLM's method
  of the same name, the distiller `distiller_class()`;
  `after_inplace_load(model)` repairs what the live module derived from its old weights, and
  `weights_owner(spec)` is the drafter whose module that is (itself, or a hybrid's model part);
- NeMo-RL: `weight_source(spec, streams)` (where its weights come from there, given the
  `TrainerStreams`), `refit_hint` and
  `trainer_stream` (what a `refit` needs from the trainer), `check_nemo_rl(spec, policy)`,
  `worker_modules` (libraries the vLLM workers must import), `needs_vllm_methods` (vLLM methods
  whose absence marks a vLLM too old for it, besides the one its `vllm_config` names: refused at
  the adapter's preflight).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from nemo_rl_specdec.schema import PathError, Strict

if TYPE_CHECKING:
    from nemo_rl_specdec.config import SpecDecConfig
    from nemo_rl_specdec.train.distill import Distiller

LIST, MODEL = "list", "model"
HOST, SEQUENTIAL, PARALLEL = "host", "sequential", "parallel"

# Where a drafter's weights come from inside NeMo-RL (adapter/translate.py routes on them)
SOURCE_NONE = "none"                  # list drafters: no weights
SOURCE_REFIT_STREAM = "refit_stream"  # the trainer exports them with the policy (draft.* or MTP layers)
SOURCE_CHECKPOINT_ONCE = "checkpoint_once"  # MTP layers read once from the policy checkpoint
SOURCE_CHECKPOINT = "checkpoint"      # read from the drafter's own checkpoint at engine start
SOURCE_POLICY_DISTILL = "policy_distill"  # ... and distilled online in the policy workers


# How a drafter keeps up with the policy (`refresh.mode`): see docs/configuration.md.
RefreshMode = Literal["frozen", "refit", "online", "rebuild"]


@dataclass(frozen=True)
class TrainerStreams:
    """What a NeMo-RL trainer streams to the engines at every refit besides the policy: an Eagle head
    (`draft`: `policy.draft.enabled`) and MTP layers (`mtp`: `policy.megatron_cfg.mtp_num_layers > 0`)."""

    draft: bool = False
    mtp: bool = False


class NoConfig(Strict):
    """A drafter without settings of its own."""


class Drafter:
    name: ClassVar[str]
    kind: ClassVar[str] = MODEL
    draft_cost: ClassVar[str] = SEQUENTIAL
    config: ClassVar[type[Strict]] = NoConfig
    default_k: ClassVar[int] = 8  # num_speculative_tokens when the block leaves it unset
    refresh_modes: ClassVar[tuple[RefreshMode, ...]] = ("frozen",)
    weights_in_policy_checkpoint: ClassVar[bool] = False
    refit_hint: ClassVar[str] = "no NeMo-RL trainer streams this drafter's weights"  # why `refit` is refused
    trainer_stream: ClassVar[str] = ""  # the NeMo-RL policy setting that makes the trainer stream its weights
    worker_modules: ClassVar[tuple[str, ...]] = ()
    needs_vllm_methods: ClassVar[tuple[str, ...]] = ()
    # the drafter's configurations worth running side by side, (label, block overrides `key=value`
    # relative to the block): the lossless engine suite runs each, `bench --suite drafters` compares them
    variants: ClassVar[tuple[tuple[str, tuple[str, ...]], ...]] = ()

    # ------------------------------------------------------------------ configuration
    def settings(self, spec: SpecDecConfig) -> Any:
        """The drafter's sub-block of `spec` (an instance of its `config`)."""
        return getattr(spec, self.name)

    def refresh_modes_for(self, block: Any) -> tuple[tuple[RefreshMode, ...], str]:
        """The refresh modes this drafter takes with its sub-block `block` (the first is the default),
        and what they are allowed for, as an error message says it."""
        return self.refresh_modes, f"drafter '{self.name}'"

    def checkpoint(self, spec: SpecDecConfig) -> str | None:
        """Path of the drafter's own checkpoint (None: it has none, or it lives in the policy's)."""
        return None

    def check(self, spec: SpecDecConfig) -> None:
        """Cross-field rules of an enabled block; raise PathError (relative to the block)."""
        if self.kind == MODEL and not self.weights_in_policy_checkpoint and not self.checkpoint(spec):
            raise PathError(f"{self.name}.model", None, f"a checkpoint path when drafter is '{self.name}'")

    def check_policy(self, spec: SpecDecConfig, policy_dir: Any) -> None:
        """Rules against the policy checkpoint, a local directory with its config.json (PathError
        relative to the block); run before any engine starts."""

    def vllm_config(self, spec: SpecDecConfig, temperature: float) -> dict:
        """vLLM's `speculative_config` for this drafter (the k schedule is added by config.py)."""
        raise NotImplementedError

    def engine_args(self, spec: SpecDecConfig) -> dict:
        """vLLM engine arguments (beside `speculative_config`) the drafter needs; none for most."""
        return {}

    def draft_sample_method(self, spec: SpecDecConfig, temperature: float) -> str:
        """`auto`: probabilistic drafts for model drafters at T>0 (lossless and far better accepted)."""
        if spec.draft_sample_method != "auto":
            return spec.draft_sample_method
        return "probabilistic" if (self.kind == MODEL and temperature > 0) else "greedy"

    # ------------------------------------------------------------------ runtime
    def takes_request_budgets(self, spec: SpecDecConfig) -> bool:
        """Whether per-request draft budgets (`extra_args["specdec_budget"]`) reach this drafter."""
        return False

    def judges_steps(self, spec: SpecDecConfig) -> bool:
        """Whether the drafter's proposer is ours and cuts each step's drafts (`drafters/machinery/step_judge.py`:
        `auto_disable`, `scheduling.budget: adaptive`)."""
        return False

    def caches_own_requests(self, spec: SpecDecConfig) -> bool:
        """Whether the drafter learns from the engine's own finished requests (vLLM's suffix cache)."""
        return False

    def cost_entry(self, spec: SpecDecConfig) -> str:
        """The hardware profile's entry that prices this drafter as the block configures it
        (configs/hardware/: a history drafter's entry names its proposer)."""
        return self.name

    def engine_proposer(self, runner: Any, spec: dict) -> Any:
        """A proposer of ours that drafts beside the engine's model drafter, built in the vLLM worker
        for its model runner `runner` from the validated block `spec`; None: vLLM's proposer alone."""
        return None

    def cost_parts(self, spec: SpecDecConfig) -> dict | None:
        """A drafter made of a history and a model part: their hardware-profile entries
        ({"history": ..., "model": ...}; its traces are of kind `hybrid`); None for the others."""
        return None

    def rollout_prompt_tail(self, spec: SpecDecConfig) -> int | None:
        """Prompt tokens (the tail) each rollout must carry to the drafter; None: it takes no rollouts."""
        return None

    def distiller(self, spec: SpecDecConfig, *, temperature: float, seed: int = 0,
                  model_path: str | None = None, **kw: Any) -> Distiller:
        """The online trainer of this drafter (`refresh.mode: online`) with the hyper-parameters of
        `refresh.distill` (keyword arguments override them); `model_path` is the policy checkpoint."""
        d = spec.refresh.distill
        kw = {"lr": d.lr, "epochs": d.epochs, "micro_batch_tokens": d.micro_batch_tokens,
              "max_tokens": d.max_tokens, "max_transient_gb": d.max_transient_gb, **kw}
        return self.build_distiller(spec, temperature=temperature, seed=seed, model_path=model_path, **kw)

    def build_distiller(self, spec: SpecDecConfig, *, temperature: float, seed: int,
                        model_path: str | None, **kw: Any) -> Distiller:
        from nemo_rl_specdec.train.distill import DistillInputError

        raise DistillInputError(f"drafter {self.name!r} has no online trainer")

    def weights_owner(self, spec: Any) -> Drafter:
        """The drafter whose module the engine's drafter weights are (`spec`: the block, or the block as
        plain data): this one, or the model part of a drafter made of parts."""
        return self

    def after_inplace_load(self, model: Any) -> None:
        """Called after new tensors were loaded in place into the live drafter module `model` (a refresh
        or a restore): bring up to date what the module derived from its weights at engine start. The
        drafters here keep nothing derived, except the ones that say so."""

    # ------------------------------------------------------------------ NeMo-RL
    def weight_source(self, spec: SpecDecConfig, streams: TrainerStreams) -> str:
        """Where the drafter's weights come from in a NeMo-RL run whose trainer streams `streams`."""
        if self.kind == LIST:
            return SOURCE_NONE
        return SOURCE_POLICY_DISTILL if spec.refresh.mode == "online" else SOURCE_CHECKPOINT

    def check_nemo_rl(self, spec: SpecDecConfig, policy: dict) -> None:
        """Drafter-specific rules against the rest of a NeMo-RL run's `policy` (ConfigError)."""



class CheckpointDrafter(Drafter):
    """A model drafter with its own checkpoint in `<name>.model`, run by vLLM's method of the same
    name, and trained online by the `Distiller` that `distiller_class()` returns."""

    def checkpoint(self, spec: SpecDecConfig) -> str | None:
        return self.settings(spec).model

    def vllm_config(self, spec: SpecDecConfig, temperature: float) -> dict:
        return {
            "method": self.name,
            "model": self.checkpoint(spec),
            "num_speculative_tokens": spec.num_speculative_tokens,
            "draft_sample_method": self.draft_sample_method(spec, temperature),
        }

    def distiller_class(self) -> type:
        raise NotImplementedError

    def build_distiller(self, spec: SpecDecConfig, *, temperature: float, seed: int,
                        model_path: str | None, **kw: Any) -> Distiller:
        from nemo_rl_specdec.train.distill import DistillInputError

        if not self.checkpoint(spec):
            raise DistillInputError(f"{self.name}.model is not set: no {self.name} checkpoint to train")
        return self.distiller_class()(self.checkpoint(spec), temperature=temperature, seed=seed, **kw)
