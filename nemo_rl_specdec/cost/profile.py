"""Hardware profiles: the one cost model a rollout is priced with, for one GPU and one target model.

A profile (``configs/hardware/<name>.yaml``, named by ``--hardware NAME``) holds:

- ``model``: the target's shape (bytes a forward reads, FLOPs per token, KV bytes per token,
  attention FLOPs per context token; ``cost/model.py`` ``ModelShape``);
- ``hardware``: the scenario ``hardware`` block of the same GPU, normally ``roofline.measured``:
  the roofline fitted on timed target forwards (``nemo_rl_specdec/tools/time_forward.py``, the device check);
- ``drafters``: one scenario ``drafter`` block per drafter the profile prices, under the label a
  trace names it by (``das``, ``vllm_suffix``, ``ngram``, ``eagle3``, ...; ``name`` is the drafter). A model or block
  drafter gives its ``model`` shape; its fixed time per draft forward, ``fwd_base_s``, is the
  target's fitted fixed time per layer times the draft's layers unless the entry sets it (the
  device check timed the drafts' forwards beside the target's: the fixed time of a forward grows
  with its layers; docs/pricing.md lists each profile's time per layer). A history drafter (``suffix``,
  ``ngram``) gives its proposer's host CPU time: ``step_overhead_s`` per decode step and
  ``per_request_s`` per request in it, fitted on traces' measured proposer times
  (``nemo-rl-specdec price TRACE --fit-proposer``) on the host named by ``host``.

`HardwareProfile.cost_model(drafter)` is the simulator's `CostModel` for that drafter on this GPU;
`cost/price.py` prices traces with it and the benches replay the per-step rules under it.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import TypeVar

from pydantic import Field, PrivateAttr, ValidationError, model_validator

from nemo_rl_specdec.config import yaml_loader
from nemo_rl_specdec.config.schema import format_errors
from nemo_rl_specdec.cost.fit import fit_layer_widths
from nemo_rl_specdec.cost.model import CostModel
from nemo_rl_specdec.cost.schema import CostError, DraftCost, Hardware, ModelSpec, _Strict
from nemo_rl_specdec.resources import config_lookups, config_path

D = TypeVar("D", bound=DraftCost)

HARDWARE_CONFIGS = config_path("hardware")


@functools.lru_cache(maxsize=8)
def _layer_widths(draft_files: tuple, target_file: str) -> dict:
    return fit_layer_widths(list(draft_files), target_file)


def _bundled(name: str, key: str) -> str:
    """A samples file by path, or by name below configs/sim/; a ValueError naming `key` otherwise."""
    found = next((p for p in [Path(name), *config_lookups(name, "sim")] if p.is_file()), None)
    if found is None:
        raise ValueError(f"{key}: {name!r}; allowed: a time_forward samples JSON (a path, or a name below "
                         "configs/sim/)")
    return str(found)


class DraftLayers(_Strict):
    """Timed forwards of draft models of more than one layer width, and a target timed on the same
    GPU: the fixed time of a draft forward per layer is fitted on them as a line in the layer's width
    (`cost/fit.py` `fit_layer_widths`) and carried to this profile's GPU in proportion to the targets'
    fitted fixed time per layer."""

    measured: list[str] = Field(min_length=2, max_length=64)
    timed_on: str = Field(description="the samples of a target timed on the GPU the drafts were timed on")
    _fit: dict | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _fitted(self):
        files = tuple(_bundled(f, f"draft_layers.measured[{i}]") for i, f in enumerate(self.measured))
        self._fit = _layer_widths(files, _bundled(self.timed_on, "draft_layers.timed_on"))
        return self

    @property
    def fit(self) -> dict:
        assert self._fit is not None
        return self._fit


class HardwareProfile(_Strict):
    name: str
    description: str = ""
    host: str = Field("", description="the CPU the history proposers' constants were measured on")
    model: ModelSpec
    hardware: Hardware
    draft_layers: DraftLayers | None = Field(None, description="draft forwards timed by layer width (the fixed time "
                                             "of a draft forward per layer); without it, the target's per layer")
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
            if d.kind in ("model", "block") and self.draft_layers is None and "fwd_base_s" not in d.model_fields_set:
                raise ValueError(f"draft_layers: missing; drafters.{name}'s fixed time per forward is priced by its "
                                 "layers' width from timed draft forwards (give draft_layers, or the entry's "
                                 "fwd_base_s)")
            priced_by_layers(d, self.hardware, self.model, self.draft_layers.fit if self.draft_layers else None)
        return self

    @property
    def layer_overhead_s(self) -> float:
        """The target forward's fitted fixed time per layer."""
        assert self.hardware.roofline is not None and self.hardware.roofline.overhead_s is not None  # validated
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
                         draft_per_request=d.per_request_s, spec_step_overhead=d.step_overhead_s,
                         draft_kind=str(d.kind), roofline=roof, target=target,
                         draft_shape=d.model.shape() if d.model else None)


def layer_s(hardware: Hardware, target: ModelSpec, hidden_size: int, widths: dict | None = None) -> float:
    """The fixed time per layer of a draft forward whose layers are `hidden_size` wide on this GPU: with
    `widths` (`fit_layer_widths`), the fitted line in the width, carried to this GPU in proportion to
    the targets' fitted fixed time per layer; without, the target's fixed time per layer."""
    assert hardware.roofline is not None and hardware.roofline.overhead_s is not None
    here = float(hardware.roofline.overhead_s) / max(1, target.num_layers)
    if widths is None:
        return here
    if not hidden_size:
        raise ValueError("model.hidden_size: needed to price a draft forward's fixed time by its layers' width")
    return (widths["fixed_s"] + widths["per_width_s"] * hidden_size) * here / widths["target_layer_s"]


def priced_by_layers(d: D, hardware: Hardware, target: ModelSpec, widths: dict | None = None) -> D:
    """A model or block drafter without its own `fwd_base_s` gets its layers times the fixed time per
    layer of a forward of their width (`layer_s`; the device check timed the drafts beside the
    target: the fixed time of a forward grows with its layers)."""
    if d.kind in ("model", "block") and d.model is not None and "fwd_base_s" not in d.model_fields_set:
        if not (d.model.num_layers and target.num_layers and hardware.roofline is not None):
            raise ValueError(f"drafter {d.name!r}: model.num_layers (and the target's, and a roofline) are needed to "
                             "price its fixed time per forward by layers; or give its fwd_base_s")
        d.fwd_base_s = layer_s(hardware, target, d.model.hidden_size, widths) * d.model.num_layers
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
        lines = format_errors(e, HardwareProfile, "profile", "docs/pricing.md")
        raise CostError(f"{path}: " + "; ".join(lines)) from None
    except ValueError as e:
        raise CostError(f"{path}: {e}") from None


__all__ = ["HARDWARE_CONFIGS", "HardwareProfile", "load_profile", "layer_s", "priced_by_layers", "profile_names",
           "profile_path"]
