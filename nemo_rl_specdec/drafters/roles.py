"""Every contract between a drafter and the rest of the package, on one page.

**Roles**: what a layer asks of a registered drafter's declaration. A layer looks the drafter up as
its role (`registry.drafter(spec, Role)`, which resolves the block to its backend's drafter or to a
hybrid of its parts), and the lookup refuses a drafter that does not play it. Each role is small,
and a drafter plays only the roles it has (`drafters/base.py` holds their shared defaults):

- `Declared`: the block's validation (config/run.py);
- `VllmMapping`: vLLM's `speculative_config` and the engine's arguments (config/run.py, the engine);
- `Refreshable`: how the drafter keeps up with the policy (the refresh modes, the rollouts an
  update carries);
- `ModelWeights`: a model drafter's weights (the engine worker's loads and restores, the online
  trainer); list drafters have none;
- `NemoRLRules`: a NeMo-RL run (adapter/);
- `PricedDrafter`: pricing and the benches;
- `TeacherForced` (optional): the drafters bench's one-text comparison, played by a model drafter
  with a torch mirror of its drafting.

Roles take the validated block as a `Block` (config.SpecDecConfig is one).

**Runtime contracts**: the objects of ours that run inside a vLLM worker. The engine checks them by
type (`isinstance` against these runtime-checkable protocols), never by probing members:

- `EngineProposer`: any proposer of ours, as the worker extension reports, disables and notifies it;
- `ListProposer`: one in vLLM's drafter slot (a `custom_class` proposer: DAS, n-gram);
- `BesideProposer`: one that drafts beside the engine's model drafter (the hybrid);
- `RolloutStore`: one that rebuilds from rollouts, at once or staged in the background;
- `CarriesState`: one whose state NeMo-RL's checkpoint carries.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, runtime_checkable

from nemo_rl_specdec.config.schema import Strict

if TYPE_CHECKING:
    from nemo_rl_specdec.train.distill import Distiller

# How a drafter keeps up with the policy (`refresh.mode`): see docs/configuration.md.
RefreshMode = Literal["frozen", "refit", "online", "rebuild"]


class Block(Protocol):
    """The validated `speculative_decoding` block as a drafter reads it: the common settings, and each
    drafter's sub-block as an attribute named after it."""

    @property
    def drafter(self) -> str: ...
    @property
    def num_speculative_tokens(self) -> int: ...
    @property
    def draft_sample_method(self) -> str: ...
    @property
    def refresh(self) -> Any: ...
    @property
    def scheduling(self) -> Any: ...
    def __getattr__(self, name: str) -> Any: ...


class DrafterSettings(Strict):
    """A drafter's sub-block of the block. `default_k`: `num_speculative_tokens` when the block leaves
    it unset."""

    default_k: ClassVar[int] = 8


@dataclass(frozen=True)
class TrainerStreams:
    """What a NeMo-RL trainer streams to the engines at every refit besides the policy: an Eagle head
    (`draft`: `policy.draft.enabled`) and MTP layers (`mtp`: `policy.megatron_cfg.mtp_num_layers > 0`)."""

    draft: bool = False
    mtp: bool = False


# ------------------------------------------------------------------------------------------ roles

@runtime_checkable
class Declared(Protocol):
    """A drafter as the block's validation (config/run.py) sees it."""

    name: str
    kind: str  # `list`: any draft length per request, host work per step; `model`: a module in the engine
    config: type[DrafterSettings]
    judges_steps: bool  # its proposer is ours and cuts each step's drafts (`auto_disable`, `budget: adaptive`)

    @property
    def described(self) -> str: ...  # how an error names the drafter as configured
    def check(self, spec: Block) -> None: ...
    def check_policy(self, spec: Block, policy_dir: Any) -> None: ...
    def checkpoint(self, spec: Block) -> str | None: ...


@runtime_checkable
class VllmMapping(Protocol):
    """A drafter as vLLM runs it: config/run.py's `speculative_config`, the engine and its worker."""

    needs_vllm_methods: tuple[str, ...]

    def vllm_config(self, spec: Block, temperature: float) -> dict: ...
    def draft_sample_method(self, spec: Block, temperature: float) -> str: ...
    def engine_args(self, spec: Block) -> dict: ...
    takes_request_budgets: bool  # per-request draft budgets (`extra_args["specdec_budget"]`) reach it
    caches_own_requests: bool  # it learns from the engine's own finished requests (vLLM's suffix cache)

    def settings(self, spec: Block) -> Any: ...
    def engine_proposer(self, runner: Any, spec: dict) -> BesideProposer | None: ...


@runtime_checkable
class Refreshable(Protocol):
    """A drafter as its refresh sees it: the modes it takes (the first is the default), and the prompt
    tail each rollout carries to it."""

    refresh_modes: tuple[RefreshMode, ...]

    def rollout_prompt_tail(self, spec: Block) -> int | None: ...


@runtime_checkable
class ModelWeights(Protocol):
    """A drafter with weights, as the engine worker's loads and the online trainers see it: whether they
    ride in the policy's checkpoint (MTP layers), its online trainer, what to redo after an in-place
    load. A hybrid's is its model part's."""

    weights_in_policy_checkpoint: bool

    def distiller(self, spec: Block, *, temperature: float, seed: int = 0,
                  model_path: str | None = None, **kw: Any) -> Distiller: ...
    def after_inplace_load(self, model: Any) -> None: ...


@runtime_checkable
class NemoRLRules(Protocol):
    """A drafter as a NeMo-RL run sees it: where its weights come from, what a `refit` needs of the
    trainer, its rules against the run's `policy`, the libraries the vLLM workers import."""

    refit_hint: str  # why `refit` is refused
    trainer_stream: str  # the NeMo-RL policy setting that makes the trainer stream its weights
    worker_modules: tuple[str, ...]

    def weight_source(self, spec: Block, streams: TrainerStreams) -> str: ...
    def check_nemo_rl(self, spec: Block, policy: dict) -> None: ...


@runtime_checkable
class PricedDrafter(Protocol):
    """A drafter as pricing and the benches see it: how its drafting scales (`draft_cost`: host,
    sequential, parallel), the profile entry that prices it (and its parts'), its configurations
    worth running side by side."""

    draft_cost: str
    variants: tuple[tuple[str, tuple[str, ...]], ...]
    cost_parts: dict | None  # a drafter made of parts: their entries ({"history": ..., "model": ...})

    @property
    def cost_entry(self) -> str: ...


@runtime_checkable
class TeacherForced(Protocol):
    """A model drafter as the one-text comparison (`bench/onetext.py`) asks it: ``teacher_forced(spec,
    policy)`` loads the block's checkpoint and gives ``drafts(ids, first, k)``, its greedy k-token drafts at
    every position of one recorded sequence `ids` (an [len(ids) - first, k] int array; row r drafts text
    indices first + r, ... when tokens 0 .. first + r - 1 are verified), reading `policy`'s (an HF causal
    LM) hidden states of it where it reads the policy's."""

    def teacher_forced(self, spec: Any, policy: Any) -> Callable[[Sequence[int], int, int], Any]: ...


# ------------------------------------------------------------------------------ runtime contracts

@runtime_checkable
class EngineProposer(Protocol):
    """A proposer of ours inside a vLLM worker, as the worker extension calls it."""

    def specdec_metrics(self) -> dict: ...
    def specdec_stats(self) -> dict: ...
    def specdec_disable(self, reason: str) -> None: ...
    def specdec_new_policy(self, version: int) -> None: ...


@runtime_checkable
class ListProposer(EngineProposer, Protocol):
    """A proposer of ours in vLLM's drafter slot (`custom_class`): vLLM loads and calls it, and the
    worker extension attaches the model runner and the block."""

    def load_model(self, target_model: Any) -> None: ...
    def specdec_attach(self, runner: Any, spec: dict) -> None: ...
    def propose(self, sampled_token_ids: Any, num_tokens_no_spec: Any, token_ids_cpu: Any,
                slot_mappings: Any = None) -> list: ...


@runtime_checkable
class BesideProposer(EngineProposer, Protocol):
    """A proposer of ours that drafts beside the engine's model drafter; it runs the model's drafts
    itself (`call_model`) and reports each step's host time and the model forwards it ran."""

    last_host_s: float
    last_forwards: int
    history: Any  # its history half, a proposer of ours that is a RolloutStore and CarriesState

    def propose(self, call_model: Any, scheduler_output: Any, sampled_token_ids: Any,
                num_tokens: Any = None) -> list: ...


@runtime_checkable
class RolloutStore(Protocol):
    """A proposer of ours built from rollouts: rebuilt at an update, or staged in the background while
    the policy trains and installed by the update of that version (`last_install` reports the wait)."""

    last_install: dict | None

    def specdec_rebuild(self, rollouts: Any, version: int) -> int: ...
    def specdec_stage(self, rollouts: Any, version: int) -> dict: ...
    def specdec_install_staged(self, version: int) -> int: ...
    def specdec_wait_staged(self, timeout: float | None = None) -> bool: ...


@runtime_checkable
class CarriesState(Protocol):
    """A proposer of ours whose own state NeMo-RL's checkpoint carries (DAS: its rollout window, its
    calibration, its per-step rule); the engine worker saves and restores it by this contract."""

    def specdec_export_state(self) -> dict: ...
    def specdec_restore_state(self, state: dict) -> int: ...
