"""Hardware profiles: the one cost model a rollout is priced with, for one GPU and one target model.

A profile (``configs/hardware/<name>.yaml``, named by ``--hardware NAME``) holds:

- ``model``: the target's shape (bytes a forward reads, FLOPs per token, KV bytes per token,
  attention FLOPs per context token; ``cost/model.py`` ``ModelShape``);
- ``hardware``: the scenario ``hardware`` block of the same GPU, normally ``roofline.measured``:
  the roofline fitted on timed target forwards (``tools/time_forward.py``, the device check);
- ``drafters``: one scenario ``drafter`` block per drafter the profile prices, under the label a
  trace names it by (``das``, ``vllm_suffix``, ``ngram``, ``eagle3``, ...; ``name`` is the drafter). A model or block
  drafter gives its ``model`` shape; its fixed time per draft forward, ``fwd_base_s``, is the
  target's fitted fixed time per layer times the draft's layers unless the entry sets it (the
  device check timed the drafts' forwards beside the target's: the fixed time of a forward grows
  with its layers, about 0.16 ms a layer on the H100 and the H200). A history drafter (``suffix``,
  ``ngram``) gives its proposer's host CPU time: ``step_overhead_s`` per decode step and
  ``per_request_s`` per request in it, fitted on traces' measured proposer times
  (``nemo-rl-specdec price TRACE --fit-proposer``) on the host named by ``host``.

`HardwareProfile.cost_model(drafter)` is the simulator's `CostModel` for that drafter on this GPU;
`cost/price.py` prices traces with it and the benches replay the per-step rules under it.
"""
from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from pydantic import Field, ValidationError, model_validator

from nemo_rl_specdec import yaml_loader
from nemo_rl_specdec.cost.model import CostModel
from nemo_rl_specdec.cost.schema import CostError, DraftCost, Hardware, ModelSpec, _Strict, format_errors
from nemo_rl_specdec.resources import config_lookups, config_path

D = TypeVar("D", bound=DraftCost)

HARDWARE_CONFIGS = config_path("hardware")


class HardwareProfile(_Strict):
    name: str
    description: str = ""
    host: str = Field("", description="the CPU the history proposers' constants were measured on")
    model: ModelSpec
    hardware: Hardware
    drafters: dict[str, DraftCost] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _priced(self):
        if self.hardware.roofline is None:
            raise ValueError("hardware.roofline: a profile prices forwards on a roofline (measured, or data-sheet "
                             "constants); the linear form has no draft side")
        for name, d in self.drafters.items():
            if d.kind is None:
                raise ValueError(f"drafters.{name}.kind: missing; a profile entry says how its drafter's step is "
                                 "priced: list (host proposer), model (sequential forwards) or block (one forward)")
            if d.kind in ("model", "block") and d.model is None:
                raise ValueError(f"drafters.{name}.model: a {d.kind} drafter's forward is priced from its shape")
            priced_by_layers(d, self.hardware, self.model)
        return self

    @property
    def layer_overhead_s(self) -> float:
        """The target forward's fitted fixed time per layer."""
        return float(self.hardware.roofline.overhead_s) / max(1, self.model.num_layers)

    def drafter(self, name: str) -> DraftCost:
        if name not in self.drafters:
            raise CostError(f"{self.name}: drafters.{name}: not in this hardware profile; it prices "
                                f"{sorted(self.drafters)}")
        return self.drafters[name]

    def cost_model(self, drafter: str | None = None) -> CostModel:
        """The step cost of `drafter` (None: no speculation) on this GPU."""
        roof = self.hardware.roofline_model()
        target = self.model.shape()
        if drafter is None:
            return CostModel(roofline=roof, target=target)
        d = self.drafter(drafter)
        return CostModel(draft_fwd_base=d.fwd_base_s, draft_tok=d.tok_s, draft_ctx=d.ctx_s,
                         draft_per_request=d.per_request_s, spec_step_overhead=d.step_overhead_s, draft_kind=d.kind,
                         roofline=roof, target=target, draft_shape=d.model.shape() if d.model else None)


def priced_by_layers(d: D, hardware: Hardware, target: ModelSpec) -> D:
    """A model or block drafter without its own `fwd_base_s` gets the target forward's fitted fixed
    time per layer times its layers (the device check timed the drafts beside the target: the
    fixed time of a forward grows with its layers)."""
    if d.kind in ("model", "block") and d.model is not None and "fwd_base_s" not in d.model_fields_set:
        if not (d.model.num_layers and target.num_layers and hardware.roofline is not None):
            raise ValueError(f"drafter {d.name!r}: model.num_layers (and the target's, and a roofline) are needed to "
                             "price its fixed time per forward by layers; or give its fwd_base_s")
        d.fwd_base_s = float(hardware.roofline.overhead_s) / target.num_layers * d.model.num_layers
    return d


def profile_path(name: str) -> Path:
    """A hardware profile by name (configs/hardware/NAME.yaml) or path."""
    found = next((p for p in [Path(name), *config_lookups(f"{name}.yaml", "hardware"),
                              *config_lookups(name, "hardware")] if p.is_file()), None)
    if found is None:
        names = sorted(p.stem for p in config_path("hardware").glob("*.yaml"))
        raise CostError(f"--hardware: {name!r}; allowed: {names} or a profile file's path")
    return found


def profile_names() -> list[str]:
    return sorted(p.stem for p in HARDWARE_CONFIGS.glob("*.yaml")) if HARDWARE_CONFIGS.is_dir() else []


def load_profile(name: str) -> HardwareProfile:
    """A profile by name (``configs/hardware/<name>.yaml``) or path; errors name the key."""
    path = profile_path(name)
    raw = yaml_loader.load(path, error=CostError, what="hardware profile")
    try:
        return HardwareProfile.model_validate(raw)
    except ValidationError as e:
        raise CostError(f"{path}: " + "; ".join(format_errors(e, HardwareProfile, "profile"))) from None
    except ValueError as e:
        raise CostError(f"{path}: {e}") from None


__all__ = ["HARDWARE_CONFIGS", "HardwareProfile", "load_profile", "priced_by_layers", "profile_names", "profile_path"]
