"""Scenario files for the simulator: schema, loading, `key=value` overrides, clear errors.

A scenario is a YAML file (loaded with OmegaConf, so `${...}` interpolation works) that
describes one engine's hardware cost model, the cluster, the drafter and its acceptance, the
speculation and scheduling policies, the rollout workload, the RL step around the rollout,
the sweeps to plot, and optionally the published figures it should reproduce. Every key is
documented in docs/simulator.md. Unknown keys are errors; every error names the dotted key
path (e.g. `scenario.acceptance.alpha: got 1.3; allowed: ...`).

`extends: other.yaml` at the top level starts from another scenario (looked up next to the
file, then in configs/sim/) and overrides its keys.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from nemo_rl_specdec.config import ConfigError
from nemo_rl_specdec.scheduling.budget import expected_accepted

PACKAGE_DIR = Path(__file__).resolve().parents[1]
SIM_CONFIGS = PACKAGE_DIR.parent / "configs" / "sim"

LIST_DRAFTERS = ("suffix", "ngram")
# metrics a calibration target may name (report.compare produces exactly these)
METRICS = (
    "rollout_s_baseline", "rollout_s_spec", "rollout_speedup", "rollout_time_reduction",
    "step_s_baseline", "step_s_spec", "step_speedup", "gen_fraction_baseline", "gen_fraction_spec",
    "gen_idle_fraction_baseline", "gen_idle_fraction_spec", "mean_accepted_length",
    "tokens_per_gpu_s_baseline", "tokens_per_gpu_s_spec", "target_steps_baseline", "target_steps_spec",
    "draft_tokens_per_response_token", "rollout_s_placement_only", "rollout_speedup_placement_only",
)
MODEL_DRAFTERS = ("eagle3", "draft_model", "mtp")


class ScenarioError(ConfigError):
    """Invalid scenario; the message names the dotted key path, the value and what is allowed."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Hardware(_Strict):
    """One engine (one vLLM instance, `gpus_per_engine` GPUs) and its target-model step cost:
    t = c_base_s + c_tok_s * tokens_in_step + c_ctx_s * sum(context of each request)."""

    name: str = "custom"
    gpus_per_engine: int = Field(1, ge=1)
    c_base_s: Optional[float] = Field(None, gt=0, description="fixed cost of one target forward (s)")
    c_tok_s: Optional[float] = Field(None, ge=0, description="cost per token processed in the step (s)")
    c_ctx_s: float = Field(0.0, ge=0, description="cost per context token per request per step: KV reads (s)")
    fit_samples: Optional[list[tuple[float, float]]] = Field(
        None, description="[[tokens_in_step, seconds], ...]: c_base_s and c_tok_s fitted by least squares"
    )
    max_num_seqs: int = Field(256, ge=1, description="requests decoded concurrently per engine")

    @model_validator(mode="after")
    def _costs(self):
        given = self.c_base_s is not None or self.c_tok_s is not None
        if self.fit_samples is not None and given:
            raise ValueError("give either c_base_s and c_tok_s, or fit_samples, not both")
        if self.fit_samples is None and (self.c_base_s is None or self.c_tok_s is None):
            raise ValueError("need c_base_s and c_tok_s (or fit_samples to fit them)")
        if self.fit_samples is not None:
            from nemo_rl_specdec.sim.fit import fit_cost_model

            self.c_base_s, self.c_tok_s = fit_cost_model(self.fit_samples)
            if self.c_base_s <= 0:
                raise ValueError("fit_samples give c_base_s <= 0: add samples with few tokens per step")
        return self


class Cluster(_Strict):
    num_engines: int = Field(1, ge=1, description="data-parallel generation engines")


class Drafter(_Strict):
    """Drafting cost per step. Model drafters run max(d) sequential forwards per step; list
    drafters (suffix, ngram) look drafts up on the host, per request."""

    name: Literal["suffix", "ngram", "eagle3", "draft_model", "mtp", "custom"] = "suffix"
    kind: Optional[Literal["list", "model"]] = None
    fwd_base_s: float = Field(0.0, ge=0, description="fixed cost of one draft forward")
    tok_s: float = Field(0.0, ge=0, description="cost per draft token")
    ctx_s: float = Field(0.0, ge=0, description="cost per context token per draft token (drafter KV reads)")
    per_request_s: float = Field(0.0, ge=0, description="host time per drafting request per step")
    step_overhead_s: float = Field(0.0, ge=0, description="fixed cost of a speculative step (verification bookkeeping)")

    @model_validator(mode="after")
    def _kind(self):
        default = "list" if self.name in LIST_DRAFTERS else ("model" if self.name in MODEL_DRAFTERS else None)
        if self.kind is None:
            if default is None:
                raise ValueError("drafter 'custom' needs kind: list | model")
            self.kind = default
        elif default is not None and self.kind != default:
            raise ValueError(f"drafter {self.name!r} is a {default} drafter; kind={self.kind!r} contradicts it")
        return self


class Acceptance(_Strict):
    """Exactly one of: alpha (geometric: draft position j accepted with probability alpha**j),
    per_position (measured unconditional acceptance of positions 1, 2, ...), or
    mean_accepted_length (tokens per step, bonus included, measured at `measured_at_k` drafts,
    default speculation.k; alpha is solved from it, so changing k keeps the per-position
    acceptance when measured_at_k is given)."""

    alpha: Optional[float] = Field(None, ge=0, le=1)
    per_position: Optional[list[float]] = None
    mean_accepted_length: Optional[float] = Field(None, ge=1)
    measured_at_k: Optional[int] = Field(
        None, ge=1, description="the k at which mean_accepted_length was measured (default: speculation.k)"
    )
    spread: float = Field(0.0, ge=0, le=0.5, description="std of a per-request alpha around the mean")

    @model_validator(mode="after")
    def _one(self):
        given = [n for n in ("alpha", "per_position", "mean_accepted_length") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of alpha, per_position, mean_accepted_length (got {given or 'none'})")
        if self.per_position is not None:
            expected_accepted(self.per_position, len(self.per_position))  # validates the curve
            if self.spread:
                raise ValueError("spread applies to alpha / mean_accepted_length, not to a per_position curve")
        return self


class Speculation(_Strict):
    enabled: bool = True
    k: int = Field(3, ge=1, le=64, description="num_speculative_tokens")
    placement: Literal["contiguous", "round_robin", "length_aware"] = "contiguous"
    budget: Literal["uniform", "length_aware", "das"] = "uniform"
    long_fraction: float = Field(0.25, gt=0, le=1)
    short_fraction: float = Field(0.25, ge=0, lt=1)
    medium_k: Optional[int] = Field(None, ge=0)
    k_by_batch_size: Union[None, Literal["auto"], list[tuple[int, int, int]]] = None
    budget_interval_steps: int = Field(64, ge=1, description="recompute budgets at least this often")

    @model_validator(mode="after")
    def _check(self):
        if self.long_fraction + self.short_fraction > 1:
            raise ValueError("long_fraction + short_fraction must be <= 1")
        if self.medium_k is not None and self.medium_k > self.k:
            raise ValueError(f"medium_k={self.medium_k} must be <= k={self.k}")
        if isinstance(self.k_by_batch_size, list):
            prev = 0
            for i, (lo, hi, kk) in enumerate(self.k_by_batch_size):
                if i == 0 and lo != 1:
                    raise ValueError("k_by_batch_size: the first range must start at 1 (vLLM requires it)")
                if hi < lo or lo <= prev or kk < 0 or kk > self.k:
                    raise ValueError(
                        f"k_by_batch_size entry {i} ({lo}, {hi}, {kk}): need ascending non-overlapping "
                        f"ranges and 0 <= k <= {self.k}"
                    )
                prev = hi
        return self


class Lengths(_Strict):
    """Response lengths. lognormal: each problem has its own median, drawn around `median` with
    log-std `sigma_between`; its samples spread around it with log-std `sigma_within`; lengths
    are clipped to [min_len, max_len]. values: measured lengths, drawn with replacement.
    groups: measured lengths per problem; each simulated problem is one group."""

    dist: Literal["lognormal", "values", "groups"] = "lognormal"
    median: float = Field(1000.0, gt=0)
    sigma_between: float = Field(0.5, ge=0)
    sigma_within: float = Field(0.5, ge=0)
    min_len: int = Field(1, ge=1)
    max_len: int = Field(8192, ge=1)
    values: Optional[list[int]] = None
    groups: Optional[list[list[int]]] = None

    @model_validator(mode="after")
    def _check(self):
        if self.min_len > self.max_len:
            raise ValueError(f"min_len={self.min_len} must be <= max_len={self.max_len}")
        if self.dist == "values" and not self.values:
            raise ValueError("dist 'values' needs a non-empty values list")
        if self.dist == "groups" and (not self.groups or any(not g for g in self.groups)):
            raise ValueError("dist 'groups' needs a non-empty list of non-empty groups")
        for v in (self.values or []) + [x for g in (self.groups or []) for x in g]:
            if v < 1:
                raise ValueError(f"measured length {v} must be >= 1")
        return self


class Workload(_Strict):
    num_prompts: int = Field(64, ge=1, description="prompts (GRPO groups) per step")
    generations_per_prompt: int = Field(16, ge=1)
    prompt_len: int = Field(256, ge=0)
    lengths: Lengths = Lengths()
    prediction: Literal["history", "oracle", "none"] = "history"
    history_rollouts: int = Field(8, ge=0, description="earlier rollouts per problem the predictor has seen")


class Phase(_Strict):
    fixed_s: float = Field(0.0, ge=0)
    per_ktoken_s: float = Field(0.0, ge=0, description="seconds per 1000 tokens (prompt + response) in the batch")


class RL(_Strict):
    mode: Literal["sync", "async"] = "sync"
    max_policy_lag: int = Field(1, ge=1, description="async: a batch may be generated with a policy this many versions old")
    num_steps: int = Field(4, ge=2)
    logprob: Phase = Phase()
    train: Phase = Phase()
    refit_s: float = Field(0.0, ge=0, description="weight update of the engines (blocks generation)")

    @model_validator(mode="after")
    def _steps(self):
        if self.mode == "async" and self.num_steps < self.max_policy_lag + 2:
            raise ValueError(f"num_steps must be >= max_policy_lag + 2 = {self.max_policy_lag + 2} in async mode")
        return self

    @property
    def lag(self) -> int:
        return 0 if self.mode == "sync" else self.max_policy_lag


class Baseline(_Strict):
    placement: Literal["contiguous", "round_robin", "length_aware"] = "contiguous"


class Sweep(_Strict):
    k: list[int] = [1, 2, 3, 4, 5, 6, 8]
    alpha: list[float] = [0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    num_engines: Optional[list[int]] = Field(None, description="default: cluster size x 1/4, 1/2, 1, 2, 4")
    cluster_scaling: Literal["strong", "weak"] = Field(
        "weak", description="weak: prompts per step grow with the cluster; strong: fixed batch"
    )

    @field_validator("k", "num_engines")
    @classmethod
    def _pos(cls, v):
        if v is not None and any(x < 1 for x in v):
            raise ValueError("values must be >= 1")
        return v

    @field_validator("alpha")
    @classmethod
    def _alpha(cls, v):
        if any(not 0 <= x <= 1 for x in v):
            raise ValueError("alpha values must be in [0, 1]")
        return v


class Target(_Strict):
    """A published figure: `value` within +-`tolerance` (relative), or a [min, max] range."""

    value: Optional[float] = None
    tolerance: float = Field(0.10, ge=0)
    min: Optional[float] = None
    max: Optional[float] = None
    source: str = ""

    @model_validator(mode="after")
    def _some(self):
        if self.value is None and self.min is None and self.max is None:
            raise ValueError("give value (with tolerance) or min/max")
        return self

    def bounds(self) -> tuple[float, float]:
        if self.value is not None:
            return self.value * (1 - self.tolerance), self.value * (1 + self.tolerance)
        return (-math.inf if self.min is None else self.min), (math.inf if self.max is None else self.max)


class Scenario(_Strict):
    name: str = "scenario"
    description: str = ""
    seed: int = 0
    hardware: Hardware
    cluster: Cluster = Cluster()
    drafter: Drafter = Drafter()
    acceptance: Acceptance
    speculation: Speculation = Speculation()
    workload: Workload = Workload()
    rl: RL = RL()
    baseline: Baseline = Baseline()
    sweep: Sweep = Sweep()
    calibration: Optional[dict[str, Target]] = Field(None, description="published figures to reproduce; null drops an extended file's")

    @model_validator(mode="after")
    def _coherent(self):
        if self.drafter.kind == "model" and self.speculation.budget != "uniform":
            raise _PathError(
                "speculation.budget", self.speculation.budget,
                f"'uniform' for model drafter {self.drafter.name!r}: per-request budgets need a list drafter "
                "(suffix, ngram); use speculation.k_by_batch_size for model drafters",
            )
        for key in self.calibration or {}:
            if key not in METRICS:
                raise _PathError(f"calibration.{key}", key, f"a reported metric, one of {list(METRICS)}")
        a = self.acceptance
        if a.measured_at_k is not None and a.mean_accepted_length is None:
            raise _PathError("acceptance.measured_at_k", a.measured_at_k, "null unless mean_accepted_length is given")
        at_k = a.measured_at_k or self.speculation.k
        if a.mean_accepted_length is not None and a.mean_accepted_length > at_k + 1:
            raise _PathError(
                "acceptance.mean_accepted_length", a.mean_accepted_length,
                f"<= k + 1 = {at_k + 1} (at most k drafts and one bonus token per step)",
            )
        return self

    # ------------------------------------------------------------------ derived
    @property
    def alpha(self) -> Optional[float]:
        """The geometric per-position acceptance (solved when mean_accepted_length is given)."""
        a = self.acceptance
        if a.alpha is not None:
            return a.alpha
        if a.mean_accepted_length is not None:
            return solve_alpha(a.mean_accepted_length, a.measured_at_k or self.speculation.k)
        return None

    @property
    def acceptance_model(self) -> Union[float, list[float]]:
        """What the scheduling code takes as `acceptance`: alpha or the per-position curve."""
        return self.alpha if self.alpha is not None else list(self.acceptance.per_position or [])


def solve_alpha(mean_accepted_length: float, k: int) -> float:
    """alpha with (1 - alpha**(k+1)) / (1 - alpha) == mean_accepted_length (bisection)."""
    if not 1 <= mean_accepted_length <= k + 1:
        raise ValueError(f"mean accepted length {mean_accepted_length} must be in [1, k+1={k + 1}]")
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if float(expected_accepted(mid, k)[k]) < mean_accepted_length:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


class _PathError(ValueError):
    def __init__(self, rel_path: str, value: Any, allowed: str):
        self.rel_path, self.value, self.allowed = rel_path, value, allowed
        super().__init__(f"{rel_path}={value!r}: expected {allowed}")


# --------------------------------------------------------------------------- loading

def _format(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = [str(p) for p in e["loc"]]
        ctx_err = (e.get("ctx") or {}).get("error")
        if isinstance(ctx_err, _PathError):
            lines.append(f"scenario.{ctx_err.rel_path}: got {ctx_err.value!r}; allowed: {ctx_err.allowed}")
            continue
        path = ".".join(["scenario", *loc])
        if e["type"] == "extra_forbidden":
            lines.append(f"{path}: unknown key (got {e.get('input')!r}); check the spelling — see docs/simulator.md")
        elif e["type"] == "missing":
            lines.append(f"{path}: missing; this key is required")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(f"{path}: got {e.get('input')!r}; allowed: {msg}")
    return "invalid scenario:\n  " + "\n  ".join(lines)


def validate_scenario(raw: Any) -> Scenario:
    if not isinstance(raw, dict):
        raise ScenarioError(f"scenario: got {type(raw).__name__}; allowed: a mapping of scenario keys")
    try:
        return Scenario.model_validate(raw)
    except ValidationError as e:
        raise ScenarioError(_format(e)) from None


def resolve_scenario_path(path: str, relative_to: Optional[Path] = None) -> Path:
    """A scenario path; bare names (`nvidia_qwen3_8b_rlzero.yaml`, with or without .yaml) are
    looked up next to `relative_to`, then in the repo's configs/sim/."""
    p = Path(path)
    tries = [p]
    if relative_to is not None:
        tries.append(relative_to / p)
    tries.append(SIM_CONFIGS / p)
    if p.suffix not in (".yaml", ".yml"):
        tries += [t.with_name(t.name + ".yaml") for t in list(tries)]
    for t in tries:
        if t.is_file():
            return t
    raise ScenarioError(f"scenario file {path!r} not found (looked in ., {SIM_CONFIGS})")


def _load_tree(path: Path, seen: tuple[Path, ...] = ()):
    from omegaconf import OmegaConf

    if path.resolve() in seen:
        raise ScenarioError(f"{path}: `extends` forms a cycle ({' -> '.join(str(s) for s in seen)})")
    cfg = OmegaConf.load(path)
    if not OmegaConf.is_dict(cfg):
        raise ScenarioError(f"{path}: a scenario must be a mapping")
    parent = cfg.pop("extends", None) if "extends" in cfg else None
    if parent is not None:
        base = _load_tree(resolve_scenario_path(str(parent), path.parent), seen + (path.resolve(),))
        cfg = OmegaConf.merge(base, cfg)
    return cfg


def load_scenario(path: str, overrides: list[str] | tuple[str, ...] = ()) -> Scenario:
    """Load a scenario YAML, apply `key=value` overrides (dotted paths), resolve, validate."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    p = resolve_scenario_path(path)
    try:
        cfg = _load_tree(p)
        for ov in overrides:
            if "=" not in ov or ov.startswith("="):
                raise ScenarioError(f"override {ov!r}: expected key=value (e.g. speculation.k=4)")
        if overrides:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
        raw = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:
        raise ScenarioError(f"{p}: {e}") from None
    except Exception as e:
        if isinstance(e, ScenarioError):
            raise
        raise ScenarioError(f"{p}: cannot read scenario: {e}") from None
    return validate_scenario(raw)
