"""The shared behaviour of the drafter roles (`drafters/roles.py` declares them): one mixin per role,
and the base classes a drafter starts from. A list drafter (`Drafter`) plays every role but
`ModelWeights`; a model drafter (`ModelDrafter`) plays that one too. `CheckpointDrafter` is the
common model drafter: a checkpoint of its own in `<name>.model`, vLLM's method of the same name,
the distiller `distiller_class()`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from nemo_rl_specdec.config.schema import PathError
from nemo_rl_specdec.drafters.roles import BesideProposer, Block, DrafterSettings, RefreshMode, TrainerStreams

if TYPE_CHECKING:
    from nemo_rl_specdec.train.distill import Distiller

LIST, MODEL = "list", "model"
HOST, SEQUENTIAL, PARALLEL = "host", "sequential", "parallel"

# Where a drafter's weights come from inside NeMo-RL (adapter/translate.py routes on them)
SOURCE_NONE = "none"                  # list drafters: no weights
SOURCE_REFIT_STREAM = "refit_stream"  # the trainer exports them with the policy (draft.* or MTP layers)
SOURCE_CHECKPOINT_ONCE = "checkpoint_once"  # MTP layers read once from the policy checkpoint
SOURCE_CHECKPOINT = "checkpoint"      # read from the drafter's own checkpoint at engine start
SOURCE_POLICY_DISTILL = "policy_distill"  # ... and distilled online in the policy workers


class NoConfig(DrafterSettings):
    """A drafter without settings of its own."""


class DeclaredDefaults:
    """`Declared`'s shared behaviour: a list drafter without backends, that cuts no step's drafts."""

    name: ClassVar[str]
    kind: ClassVar[str] = LIST
    config: ClassVar[type[DrafterSettings]] = NoConfig
    backend: ClassVar[str | None] = None  # the `<name>.backend` this drafter is (suffix, ngram); None: no backends
    judges_steps: ClassVar[bool] = False  # its proposer is ours and cuts each step's drafts (step_judge.py)

    @property
    def described(self) -> str:
        """How an error about the block names this drafter as configured."""
        return f"drafter '{self.name}'" + (f" with {self.name}.backend '{self.backend}'" if self.backend else "")

    def checkpoint(self, spec: Block) -> str | None:
        """Path of the drafter's own checkpoint (None: it has none, or it lives in the policy's)."""
        return None

    def check(self, spec: Block) -> None:
        """Cross-field rules of an enabled block; raise PathError (relative to the block)."""

    def check_policy(self, spec: Block, policy_dir: Any) -> None:
        """Rules against the policy checkpoint, a local directory with its config.json (PathError
        relative to the block); run before any engine starts."""

    def as_role(self, role: type) -> Any:
        """What plays `role` for this drafter: itself (a drafter made of parts may name a part)."""
        return self


class VllmDefaults:
    """`VllmMapping`'s shared behaviour (`vllm_config` is each drafter's own)."""

    name: ClassVar[str]
    kind: ClassVar[str]
    needs_vllm_methods: ClassVar[tuple[str, ...]] = ()  # vLLM methods whose absence marks a vLLM too old for it
    takes_request_budgets: ClassVar[bool] = False  # per-request draft budgets (`extra_args["specdec_budget"]`) reach it
    caches_own_requests: ClassVar[bool] = False  # it learns from the engine's own finished requests (vLLM's suffix)

    def settings(self, spec: Block) -> Any:
        """The drafter's sub-block of `spec` (an instance of its `config`)."""
        return getattr(spec, self.name)

    def vllm_config(self, spec: Block, temperature: float) -> dict:
        """vLLM's `speculative_config` for this drafter (the k schedule is added by config/run.py)."""
        raise NotImplementedError

    def engine_args(self, spec: Block) -> dict:
        """vLLM engine arguments (beside `speculative_config`) the drafter needs; none for most."""
        return {}

    def draft_sample_method(self, spec: Block, temperature: float) -> str:
        """`auto`: probabilistic drafts for model drafters at T>0 (lossless and far better accepted)."""
        if spec.draft_sample_method != "auto":
            return spec.draft_sample_method
        return "probabilistic" if (self.kind == MODEL and temperature > 0) else "greedy"

    def engine_proposer(self, runner: Any, spec: dict) -> BesideProposer | None:
        """A proposer of ours that drafts beside the engine's model drafter, built in the vLLM worker
        for its model runner `runner` from the validated block `spec`; None: vLLM's proposer alone."""
        return None


class RefreshDefaults:
    """`Refreshable`'s shared behaviour: frozen, no rollouts."""

    refresh_modes: tuple[RefreshMode, ...] = ("frozen",)  # the first is the default

    def rollout_prompt_tail(self, spec: Block) -> int | None:
        """Prompt tokens (the tail) each rollout must carry to the drafter; None: it takes no rollouts."""
        return None


class ModelWeightsDefaults:
    """`ModelWeights`' shared behaviour: a checkpoint of its own, no online trainer, nothing derived
    from its weights."""

    name: ClassVar[str]
    weights_in_policy_checkpoint: ClassVar[bool] = False  # MTP layers ride in the policy's checkpoint

    def distiller(self, spec: Block, *, temperature: float, seed: int = 0,
                  model_path: str | None = None, **kw: Any) -> Distiller:
        """The online trainer of this drafter (`refresh.mode: online`) with the hyper-parameters of
        `refresh.distill` (keyword arguments override them); `model_path` is the policy checkpoint."""
        d = spec.refresh.distill
        kw = {"lr": d.lr, "epochs": d.epochs, "micro_batch_tokens": d.micro_batch_tokens,
              "max_tokens": d.max_tokens, "max_transient_gb": d.max_transient_gb, **kw}
        return self.build_distiller(spec, temperature=temperature, seed=seed, model_path=model_path, **kw)

    def build_distiller(self, spec: Block, *, temperature: float, seed: int,
                        model_path: str | None, **kw: Any) -> Distiller:
        from nemo_rl_specdec.train.distill import DistillInputError

        raise DistillInputError(f"drafter {self.name!r} has no online trainer")

    def after_inplace_load(self, model: Any) -> None:
        """Called after new tensors were loaded in place into the live drafter module `model` (a refresh
        or a restore): bring up to date what the module derived from its weights at engine start. The
        drafters here keep nothing derived, except the ones that say so."""


class NemoRLDefaults:
    """`NemoRLRules`' shared behaviour: a list drafter has no weights; a model
    drafter's come from its checkpoint, or from the policy workers' online distillation."""

    kind: ClassVar[str]
    refit_hint: ClassVar[str] = "no NeMo-RL trainer streams this drafter's weights"  # why `refit` is refused
    trainer_stream: ClassVar[str] = ""  # the NeMo-RL policy setting that makes the trainer stream its weights
    worker_modules: ClassVar[tuple[str, ...]] = ()  # libraries the vLLM workers must import

    def weight_source(self, spec: Block, streams: TrainerStreams) -> str:
        """Where the drafter's weights come from in a NeMo-RL run whose trainer streams `streams`."""
        if self.kind == LIST:
            return SOURCE_NONE
        return SOURCE_POLICY_DISTILL if spec.refresh.mode == "online" else SOURCE_CHECKPOINT

    def check_nemo_rl(self, spec: Block, policy: dict) -> None:
        """Drafter-specific rules against the rest of a NeMo-RL run's `policy` (ConfigError)."""


class CostDefaults:
    """`PricedDrafter`'s shared behaviour: the profile entry named after the drafter, no parts."""

    name: ClassVar[str]
    draft_cost: ClassVar[str] = SEQUENTIAL
    # the drafter's configurations worth running side by side, (label, block overrides `key=value`
    # relative to the block): the lossless engine suite runs each, `bench --suite drafters` compares them
    variants: ClassVar[tuple[tuple[str, tuple[str, ...]], ...]] = ()
    # a drafter made of a history and a model part: their hardware-profile entries ({"history": ...,
    # "model": ...}; its traces are of kind `hybrid`)
    cost_parts: dict | None = None

    @property
    def cost_entry(self) -> str:
        """The hardware profile's entry that prices this drafter (configs/hardware/)."""
        return self.name


class Drafter(DeclaredDefaults, VllmDefaults, RefreshDefaults, NemoRLDefaults, CostDefaults):
    """A list drafter: the defaults of every role but `ModelWeights`; a drafter overrides what is its own."""


class ModelDrafter(Drafter, ModelWeightsDefaults):
    """A model drafter: a module in the engine, which needs a checkpoint unless its weights ride in the
    policy's."""

    kind: ClassVar[str] = MODEL

    def check(self, spec: Block) -> None:
        if not self.weights_in_policy_checkpoint and not self.checkpoint(spec):
            raise PathError(f"{self.name}.model", None, f"a checkpoint path when drafter is '{self.name}'")


class CheckpointDrafter(ModelDrafter):
    """A model drafter with its own checkpoint in `<name>.model`, run by vLLM's method of the same
    name, and trained online by the `Distiller` that `distiller_class()` returns."""

    def checkpoint(self, spec: Block) -> str | None:
        return self.settings(spec).model

    def vllm_config(self, spec: Block, temperature: float) -> dict:
        return {
            "method": self.name,
            "model": self.checkpoint(spec),
            "num_speculative_tokens": spec.num_speculative_tokens,
            "draft_sample_method": self.draft_sample_method(spec, temperature),
        }

    def distiller_class(self) -> type:
        raise NotImplementedError

    def build_distiller(self, spec: Block, *, temperature: float, seed: int,
                        model_path: str | None, **kw: Any) -> Distiller:
        from nemo_rl_specdec.train.distill import DistillInputError

        if not self.checkpoint(spec):
            raise DistillInputError(f"{self.name}.model is not set: no {self.name} checkpoint to train")
        return self.distiller_class()(self.checkpoint(spec), temperature=temperature, seed=seed, **kw)
