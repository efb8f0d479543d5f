"""What a scenario is compared with and reported against: the `baseline`, the `sweep`s to plot,
and the published figures to reproduce (`calibration`, `calibration_points`)."""
from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from nemo_rl_specdec.config.schema import PathError
from nemo_rl_specdec.cost.schema import _Strict
from nemo_rl_specdec.sim.scenario.limits import MAX_ENGINES, MAX_K, MAX_SWEEP_POINTS

# metrics a calibration target may name (report.compare produces exactly these)
METRICS = (
    "rollout_s_baseline", "rollout_s_spec", "rollout_speedup", "rollout_time_reduction",
    "step_s_baseline", "step_s_spec", "step_speedup", "gen_fraction_baseline", "gen_fraction_spec",
    "gen_idle_fraction_baseline", "gen_idle_fraction_spec", "mean_accepted_length",
    "tokens_per_gpu_s_baseline", "tokens_per_gpu_s_spec", "target_steps_baseline", "target_steps_spec",
    "draft_tokens_per_response_token", "rollout_s_placement_only", "rollout_speedup_placement_only",
    "output_tokens_per_s_baseline", "output_tokens_per_s_spec", "exposed_generation_s_baseline",
    "exposed_generation_s_spec", "preemptions_baseline", "preemptions_spec",
)
# Keys of the sweep block renamed to the run config's names: the old key -> the new one.
RENAMED_SWEEP_KEYS = {"k": "num_speculative_tokens"}


class Baseline(_Strict):
    placement: Literal["contiguous", "round_robin", "length_aware"] = "contiguous"


class Sweep(_Strict):
    num_speculative_tokens: list[int] = [1, 2, 3, 4, 5, 6, 8]
    alpha: list[float] = [0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    num_engines: list[int] | None = Field(None, description="default: cluster size x 1/4, 1/2, 1, 2, 4")
    cluster_scaling: Literal["strong", "weak"] = Field(
        "weak", description="weak: prompts per step grow with the cluster; strong: fixed batch"
    )

    @model_validator(mode="after")
    def _points(self):
        for key, lo, hi in (("num_speculative_tokens", 1, MAX_K), ("alpha", 0, 1), ("num_engines", 1, MAX_ENGINES)):
            v = getattr(self, key)
            if v is None:
                continue
            if not 1 <= len(v) <= MAX_SWEEP_POINTS or any(not lo <= x <= hi for x in v):
                raise PathError(key, v, f"a list of 1 to {MAX_SWEEP_POINTS} values from {lo:,} to {hi:,}"
                                 + (" (null: the default sizes)" if key == "num_engines" else ""))
        return self


class Target(_Strict):
    """A published figure: `value` within +-`tolerance` (relative), or a [min, max] range."""

    value: float | None = None
    tolerance: float = Field(0.10, ge=0, le=10)
    min: float | None = None
    max: float | None = None
    source: str = ""

    @model_validator(mode="after")
    def _some(self):
        if self.value is None and self.min is None and self.max is None:
            raise ValueError("give value (with tolerance) or min/max")
        if self.value is not None and (self.min is not None or self.max is not None):
            raise ValueError("give value (with tolerance) or min/max, not both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min={self.min} must be <= max={self.max}")
        return self

    def bounds(self) -> tuple[float, float]:
        if self.value is not None:
            return self.value * (1 - self.tolerance), self.value * (1 + self.tolerance)
        return (-math.inf if self.min is None else self.min), (math.inf if self.max is None else self.max)


class CalibrationPoint(_Strict):
    """Published figures of a variant of the scenario: `overrides` (key=value) applied to it."""

    name: str
    overrides: list[str] = Field([], max_length=MAX_SWEEP_POINTS)
    targets: dict[str, Target] = Field(min_length=1)
