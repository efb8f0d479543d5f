"""Scenario files for the simulator: schema, loading, `key=value` overrides, clear errors.

A scenario is a YAML file (loaded with OmegaConf, so `${...}` interpolation works) that
describes one engine's hardware cost model, the cluster, the drafter and its acceptance, the
speculation and scheduling policies, the rollout workload, the RL step around the rollout,
the sweeps to plot, and optionally the published figures it should reproduce. Every key is
documented in docs/simulator.md. Unknown keys are errors; every error names the dotted key
path (e.g. `scenario.acceptance.alpha: got 1.3; allowed: ...`).

`extends: other.yaml` at the top level starts from another scenario (looked up next to the
file, then in configs/sim/) and overrides its keys. Reading, overrides (`key=value`, `+key=value`,
`++key=value`, `~key`) and interpolation are yaml_loader.py's.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from nemo_rl_specdec import yaml_loader
from nemo_rl_specdec.config import ConfigError
from nemo_rl_specdec.drafters.base import HOST, PARALLEL, SEQUENTIAL
from nemo_rl_specdec.drafters.registry import DRAFTERS
from nemo_rl_specdec.resources import config_lookups, config_path
from nemo_rl_specdec.scheduling.budget import expected_accepted
from nemo_rl_specdec.sim import acceptance as acc
from nemo_rl_specdec.sim.costmodel import ModelShape, Roofline, vllm_capture_sizes

SIM_CONFIGS = config_path("sim")

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
# the simulator's drafter kinds by how drafting costs (drafters/base.py: draft_cost)
SIM_KIND = {HOST: "list", SEQUENTIAL: "model", PARALLEL: "block"}
# published drafters the simulator prices that this package does not run (a registered drafter of the same
# name takes precedence)
PUBLISHED_DRAFTERS = {"dspark": "block"}


def drafter_kinds() -> dict:
    """Drafter name -> simulator kind: every registered drafter, plus the published ones."""
    return {**PUBLISHED_DRAFTERS, **{n: SIM_KIND[d.draft_cost] for n, d in DRAFTERS.items()}}


class ScenarioError(ConfigError):
    """Invalid scenario; the message names the dotted key path, the value and what is allowed."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Experts(_Strict):
    """Mixture-of-experts layers: `num` experts, `active` of them per token, `bytes` for all
    experts of all layers."""

    num: int = Field(ge=1)
    active: int = Field(ge=1)
    bytes: float = Field(gt=0)
    draft_correlation: float = Field(
        0.0, ge=0, le=1, description="routing overlap of a request's consecutive draft tokens (0: independent)")

    @model_validator(mode="after")
    def _check(self):
        if self.active > self.num:
            raise ValueError(f"active={self.active} must be <= num={self.num}")
        return self


class ModelSpec(_Strict):
    """A model's shape as the roofline needs it (see sim/costmodel.py)."""

    name: str = ""
    weight_bytes: float = Field(gt=0, description="bytes every forward reads (MoE: all but the experts)")
    flops_per_token: float = Field(gt=0, description="2 x active parameters")
    kv_bytes_per_token: float = Field(0.0, ge=0, description="KV cache bytes per context token")
    attn_flops_per_ctx: float = Field(0.0, ge=0, description="attention FLOPs per (query token, context token)")
    num_layers: int = Field(0, ge=0)
    hidden_size: int = Field(0, ge=0)
    activation_bytes: int = Field(2, ge=1)
    experts: Optional[Experts] = None

    def shape(self) -> ModelShape:
        e = self.experts
        return ModelShape(self.weight_bytes, self.flops_per_token, self.kv_bytes_per_token, self.attn_flops_per_ctx,
                          self.num_layers, self.hidden_size, self.activation_bytes,
                          e.num if e else 0, e.active if e else 0, e.bytes if e else 0.0,
                          e.draft_correlation if e else 0.0)


class RooflineSpec(_Strict):
    """Per-GPU effective bandwidth and FLOP rate (data sheet x achievable share), the fixed
    overhead of a forward, the CUDA-graph capture sizes and the tensor-parallel link; or
    `measured`: the first five fitted on timed forwards (`tools/time_forward.py`, sim/fit.py)."""

    measured: Optional[str] = Field(
        None, description="a time_forward samples JSON (a path, or a name below configs/sim/): mem_bw_Bps, "
                          "flops_per_s, overhead_s, eager_overhead_s and overhead_per_seq_s are fitted on it")
    mem_bw_Bps: Optional[float] = Field(None, gt=0, description="effective HBM bandwidth per GPU, bytes/s")
    flops_per_s: Optional[float] = Field(None, gt=0, description="effective dense FLOP/s per GPU at the model's precision")
    overhead_s: Optional[float] = Field(None, ge=0, description="fixed time per forward: launch, scheduling, sampling")
    capture_sizes: Union[Literal["vllm", "none"], list[int]] = "none"
    max_capture_size: int = Field(512, ge=1, description="the largest vLLM default capture size")
    eager_overhead_s: Optional[float] = Field(None, ge=0, description="extra time of a step past the largest capture size")
    overhead_per_seq_s: Optional[float] = Field(None, ge=0, description="time per request in a step")
    allreduce_bw_Bps: Optional[float] = Field(None, gt=0, description="tensor-parallel link bandwidth per GPU")
    allreduce_latency_s: float = Field(0.0, ge=0, description="latency of one all-reduce")
    _fit: Optional[dict] = PrivateAttr(None)

    @property
    def fit(self) -> Optional[dict]:
        """The fit of `measured` (constants, residuals), None for data-sheet constants."""
        return self._fit

    @model_validator(mode="after")
    def _constants(self):
        from nemo_rl_specdec.sim.fit import ROOFLINE_FITTED, roofline_from_file

        if self.measured is None:
            for key in ("mem_bw_Bps", "flops_per_s"):
                if getattr(self, key) is None:
                    raise _PathError(f"hardware.roofline.{key}", None, "a positive number (or roofline.measured)")
            for key in ROOFLINE_FITTED:
                if getattr(self, key) is None:
                    setattr(self, key, 0.0)
            return self
        for key in ROOFLINE_FITTED:
            if getattr(self, key) is not None:
                raise _PathError(f"hardware.roofline.{key}", getattr(self, key),
                                 "null with roofline.measured (it is fitted on the measured samples)")
        path = next((p for p in [Path(self.measured), *config_lookups(self.measured, "sim")] if p.is_file()), None)
        if path is None:
            raise _PathError("hardware.roofline.measured", self.measured,
                             "a time_forward samples JSON: a path, or a name below configs/sim/")
        try:
            self._fit = roofline_from_file(str(path))
        except (OSError, ValueError, KeyError) as e:
            raise _PathError("hardware.roofline.measured", self.measured, f"samples the roofline can be fitted on ({e})") from None
        for key in ROOFLINE_FITTED:
            setattr(self, key, self._fit[key])
        return self

    def sizes(self) -> tuple[int, ...]:
        if self.capture_sizes == "none":
            return ()
        if self.capture_sizes == "vllm":
            return vllm_capture_sizes(self.max_capture_size)
        return tuple(sorted(set(self.capture_sizes)))


class Hardware(_Strict):
    """One engine (one vLLM instance, `gpus_per_engine` GPUs, the tensor-parallel degree) and
    its target-model step cost: linear, t = c_base_s + c_seq_s * requests_in_step + c_tok_s *
    tokens_in_step + c_ctx_s * sum(context of each request), or a `roofline` over the scenario's `model`. The KV cache
    holds `kv_capacity_tokens` tokens per engine (or what `memory_bytes` leaves after the
    weights; None: unlimited)."""

    name: str = "custom"
    gpus_per_engine: int = Field(1, ge=1)
    c_base_s: Optional[float] = Field(None, gt=0, description="fixed cost of one target forward (s)")
    c_tok_s: Optional[float] = Field(None, ge=0, description="cost per token processed in the step (s)")
    c_ctx_s: float = Field(0.0, ge=0, description="cost per context token per request per step: KV reads (s)")
    c_seq_s: float = Field(0.0, ge=0, description="cost per request in the step (scheduling, sampling) (s)")
    fit_samples: Optional[list[tuple[float, float]]] = Field(
        None, description="[[tokens_in_step, seconds], ...]: c_base_s and c_tok_s fitted by least squares"
    )
    max_num_seqs: int = Field(256, ge=1, description="requests decoded concurrently per engine")
    roofline: Optional[RooflineSpec] = None
    kv_capacity_tokens: Optional[int] = Field(None, ge=1, description="KV cache tokens per engine")
    memory_bytes: Optional[float] = Field(None, gt=0, description="memory per GPU (derives kv_capacity_tokens)")
    memory_utilization: float = Field(0.9, gt=0, le=1, description="vLLM gpu_memory_utilization")

    @model_validator(mode="after")
    def _costs(self):
        given = self.c_base_s is not None or self.c_tok_s is not None
        if self.roofline is not None:
            if given or self.fit_samples is not None or self.c_ctx_s or self.c_seq_s:
                raise ValueError("give either a roofline or the linear constants (c_base_s, c_tok_s, c_ctx_s, "
                                 "c_seq_s, fit_samples), not both")
            return self
        if self.fit_samples is not None and given:
            raise ValueError("give either c_base_s and c_tok_s, or fit_samples, not both")
        if self.fit_samples is None and (self.c_base_s is None or self.c_tok_s is None):
            raise ValueError("need c_base_s and c_tok_s (or fit_samples to fit them, or a roofline)")
        if self.fit_samples is not None:
            from nemo_rl_specdec.sim.fit import fit_cost_model

            try:
                self.c_base_s, self.c_tok_s = fit_cost_model(self.fit_samples, pin=False)
            except ValueError as e:
                raise _PathError("hardware.fit_samples", self.fit_samples, str(e)) from None
        return self

    def roofline_model(self) -> Optional[Roofline]:
        r = self.roofline
        if r is None:
            return None
        return Roofline(r.mem_bw_Bps, r.flops_per_s, r.overhead_s, self.gpus_per_engine,
                        r.allreduce_bw_Bps or math.inf, r.allreduce_latency_s, r.sizes(), r.eager_overhead_s,
                        r.overhead_per_seq_s)


class Cluster(_Strict):
    num_engines: int = Field(1, ge=1, description="data-parallel generation engines")


class Drafter(_Strict):
    """Drafting cost per step. Model drafters run max(d) sequential forwards per step; block
    drafters (dflash, dspark) one parallel forward over all draft positions; list drafters
    (suffix, ngram) look drafts up on the host, per request, and find one for a share
    `coverage` of request-steps. A drafter forward is priced by the roofline of `model` when
    given, plus `fwd_base_s`."""

    name: str = Field("suffix", description="a registered or published drafter (kind implied), or 'custom'")
    kind: Optional[Literal["list", "model", "block"]] = None
    fwd_base_s: float = Field(0.0, ge=0, description="fixed cost of one draft forward")
    tok_s: float = Field(0.0, ge=0, description="cost per draft token")
    ctx_s: float = Field(0.0, ge=0, description="cost per context token per draft token (drafter KV reads)")
    per_request_s: float = Field(0.0, ge=0, description="host time per drafting request per step")
    step_overhead_s: float = Field(
        0.0, ge=0, description="fixed cost of a speculative step (rejection sampling; list drafters: the host sync)")
    coverage: float = Field(1.0, gt=0, le=1, description="list drafters: share of request-steps with a match")
    model: Optional[ModelSpec] = Field(None, description="the drafter's shape, for the roofline")

    @model_validator(mode="after")
    def _kind(self):
        kinds = drafter_kinds()
        if self.name != "custom" and self.name not in kinds:
            raise _PathError("drafter.name", self.name, f"one of {sorted(kinds) + ['custom']}")
        default = kinds.get(self.name)
        if self.kind is None:
            if default is None:
                raise ValueError("drafter 'custom' needs kind: list | model | block")
            self.kind = default
        elif default is not None and self.kind != default:
            raise ValueError(f"drafter {self.name!r} is a {default} drafter; kind={self.kind!r} contradicts it")
        if self.coverage < 1 and self.kind != "list":
            raise _PathError("drafter.coverage", self.coverage, "1.0 for a model or block drafter (it always drafts)")
        return self


class Acceptance(_Strict):
    """Exactly one of: alpha (position j accepted, given j-1 was, with probability
    alpha * decay**(j-1); decay 1 is geometric), conditional (those conditionals given
    directly), per_position (measured unconditional acceptance of positions 1, 2, ...),
    mean_accepted_length (tokens per step, bonus included, measured at `measured_at_k` drafts,
    default speculation.k; alpha is solved from it with the given decay, so changing k keeps
    the per-position acceptance when measured_at_k is given), or bench_json (a bench result's
    accepted_per_position). See sim/acceptance.py."""

    alpha: Optional[float] = Field(None, ge=0, le=1)
    conditional: Optional[list[float]] = None
    per_position: Optional[list[float]] = None
    mean_accepted_length: Optional[float] = Field(None, ge=1)
    bench_json: Optional[str] = Field(None, description="a `nemo-rl-specdec bench --json` file")
    bench_result: Optional[str] = Field(None, description="the result's name in bench_json (default: the only one)")
    measured_at_k: Optional[int] = Field(
        None, ge=1, description="the k at which mean_accepted_length was measured (default: speculation.k)"
    )
    decay: float = Field(1.0, gt=0, le=1, description="conditional acceptance falls by this factor per position")
    spread: float = Field(0.0, ge=0, le=0.5, description="std of a per-request alpha; keeps the mean accepted length")
    by_response_position: Optional[list[list[float]]] = Field(
        None, description="[[from_position, factor], ...]: from that many response tokens on, a request's accepted "
        "drafts per step are multiplied by factor (never above its drafts); first from_position 0, ascending")

    @model_validator(mode="after")
    def _one(self):
        forms = ("alpha", "conditional", "per_position", "mean_accepted_length", "bench_json")
        given = [n for n in forms if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(forms)} (got {given or 'none'})")
        if self.conditional is not None:
            if not self.conditional or any(not 0 <= x <= 1 for x in self.conditional):
                raise _PathError("acceptance.conditional", self.conditional, "a non-empty list of values in [0, 1]")
            self.per_position = acc.from_conditional(self.conditional)
        if self.bench_json is not None:
            try:
                self.per_position = acc.curve_from_bench(self.bench_json, self.bench_result)
            except (OSError, ValueError) as e:
                raise _PathError("acceptance.bench_json", self.bench_json, f"a readable bench JSON ({e})") from None
        elif self.bench_result is not None:
            raise _PathError("acceptance.bench_result", self.bench_result, "null unless bench_json is given")
        if self.by_response_position is not None:
            pts = self.by_response_position
            ok = (pts and all(len(p) == 2 and p[1] >= 0 for p in pts) and pts[0][0] == 0
                  and all(a[0] < b[0] for a, b in zip(pts, pts[1:])))
            if not ok:
                raise _PathError("acceptance.by_response_position", pts,
                                 "[[from_position, factor], ...] with the first from_position 0, from_positions "
                                 "strictly ascending and factors >= 0")
        if self.per_position is not None:
            expected_accepted(self.per_position, len(self.per_position))  # validates the curve
            for key in ("spread", "decay"):
                if getattr(self, key) != (0.0 if key == "spread" else 1.0):
                    raise _PathError(f"acceptance.{key}", getattr(self, key),
                                     "its default: it applies to alpha / mean_accepted_length, not to a measured curve")
        return self


class Speculation(_Strict):
    enabled: bool = True
    k: int = Field(3, ge=1, le=64, description="num_speculative_tokens")
    placement: Literal["contiguous", "round_robin", "length_aware"] = "contiguous"
    budget: Literal["uniform", "length_aware", "das", "adaptive"] = "uniform"
    long_fraction: float = Field(0.25, gt=0, le=1)
    short_fraction: float = Field(0.25, ge=0, lt=1)
    medium_k: Optional[int] = Field(None, ge=0)
    k_by_batch_size: Union[None, Literal["auto", "per_step"], list[tuple[int, int, int]]] = None
    budget_interval_steps: int = Field(64, ge=1, description="recompute budgets at least this often")
    auto_disable: bool = Field(False, description="list drafters: the engines' per-step off switch "
                               "(speculative_decoding.auto_disable), judged at every event")

    @model_validator(mode="after")
    def _check(self):
        if self.auto_disable and self.budget == "adaptive":
            raise _PathError("auto_disable", True, "false with budget: adaptive, which already drafts nothing where "
                             "no draft token pays")
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
    steady_state: bool = Field(
        False, description="serving benchmark: every request released at once, max_num_seqs always in flight")
    history_rollouts: int = Field(8, ge=0, description="earlier rollouts per problem the predictor has seen")


class Phase(_Strict):
    fixed_s: float = Field(0.0, ge=0)
    per_ktoken_s: float = Field(0.0, ge=0, description="seconds per 1000 tokens (prompt + response) in the batch")
    flops_per_token: float = Field(0.0, ge=0, description="FLOPs per batch token (6 x params to train, 2 x to score)")


class RL(_Strict):
    mode: Literal["sync", "async"] = "sync"
    max_policy_lag: int = Field(1, ge=1, description="async: a batch may be generated with a policy this many versions old")
    num_steps: int = Field(4, ge=2)
    logprob: Phase = Phase()
    train: Phase = Phase()
    refit_s: float = Field(0.0, ge=0, description="weight update of the engines (blocks generation)")
    refit_blocks_training: bool = Field(False, description="async: the trainer also waits for the refit")
    colocated: Optional[bool] = Field(None, description="generation and training on the same GPUs (default: sync)")
    training_gpus: Optional[int] = Field(None, ge=1, description="GPUs of the training pool (default: generation's)")
    training_flops_per_s: float = Field(0.0, ge=0, description="effective FLOP/s per training GPU")

    @model_validator(mode="after")
    def _steps(self):
        if self.mode == "async" and self.num_steps < self.max_policy_lag + 2:
            raise ValueError(f"num_steps must be >= max_policy_lag + 2 = {self.max_policy_lag + 2} in async mode")
        if self.colocated and self.mode == "async":
            raise _PathError("rl.colocated", True, "false in async mode (generation and training overlap)")
        if self.colocated and self.training_gpus is not None:
            raise _PathError("rl.training_gpus", self.training_gpus, "null when colocated (the generation GPUs train)")
        for ph in ("logprob", "train"):
            if getattr(self, ph).flops_per_token and not self.training_flops_per_s:
                raise _PathError("rl.training_flops_per_s", 0.0, f"> 0 when rl.{ph}.flops_per_token is given")
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


class CalibrationPoint(_Strict):
    """Published figures of a variant of the scenario: `overrides` (key=value) applied to it."""

    name: str
    overrides: list[str] = []
    targets: dict[str, Target]


class Scenario(_Strict):
    name: str = "scenario"
    description: str = ""
    seed: int = Field(0, ge=0, description="seeds every random draw (numpy needs it >= 0)")
    model: Optional[ModelSpec] = Field(None, description="the target model's shape (the roofline needs it)")
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
    calibration_points: Optional[list[CalibrationPoint]] = Field(
        None, description="variants of this scenario (overrides) with their published figures")

    @model_validator(mode="after")
    def _coherent(self):
        if self.drafter.kind == "model" and self.speculation.auto_disable:
            raise _PathError(
                "speculation.auto_disable", True,
                f"false for model drafter {self.drafter.name!r}: vLLM fixes its k per batch size at engine start; "
                "use speculation.k_by_batch_size",
            )
        if self.drafter.kind == "model" and self.speculation.budget != "uniform":
            raise _PathError(
                "speculation.budget", self.speculation.budget,
                f"'uniform' for model drafter {self.drafter.name!r}: per-request budgets need a list drafter "
                "(suffix, ngram); use speculation.k_by_batch_size for model drafters",
            )
        self._check_costs()
        for key in self.calibration or {}:
            if key not in METRICS:
                raise _PathError(f"calibration.{key}", key, f"a reported metric, one of {list(METRICS)}")
        for i, pt in enumerate(self.calibration_points or []):
            for key in pt.targets:
                if key not in METRICS:
                    raise _PathError(f"calibration_points.{i}.targets.{key}", key,
                                     f"a reported metric, one of {list(METRICS)}")
        a = self.acceptance
        if a.measured_at_k is not None and a.mean_accepted_length is None:
            raise _PathError("acceptance.measured_at_k", a.measured_at_k, "null unless mean_accepted_length is given")
        at_k = a.measured_at_k or self.speculation.k
        if a.mean_accepted_length is not None and a.mean_accepted_length > at_k + 1:
            raise _PathError(
                "acceptance.mean_accepted_length", a.mean_accepted_length,
                f"<= k + 1 = {at_k + 1} (at most k drafts and one bonus token per step)",
            )
        if a.mean_accepted_length is not None:
            try:
                acc.solve_alpha(a.mean_accepted_length, at_k, a.decay)
            except ValueError as e:
                raise _PathError("acceptance.mean_accepted_length", a.mean_accepted_length, str(e)) from None
        if a.spread > 0:
            try:
                acc.spread_mean(self.alpha, a.decay, a.spread, at_k)
            except ValueError as e:
                raise _PathError("acceptance.spread", a.spread, str(e)) from None
        self._check_kv()
        return self

    def _check_costs(self) -> None:
        hw = self.hardware
        if hw.roofline is None:
            for key, v in (("model", self.model), ("drafter.model", self.drafter.model), ("hardware.memory_bytes",
                                                                                          hw.memory_bytes)):
                if v is not None:
                    raise _PathError(key, "given", "null without hardware.roofline (the linear cost model ignores it)")
            return
        if self.model is None:
            raise _PathError("model", None, "the target model's shape: hardware.roofline needs it")
        if hw.gpus_per_engine > 1 and (hw.roofline.allreduce_bw_Bps is None or not self.model.num_layers
                                       or not self.model.hidden_size):
            raise _PathError("hardware.roofline.allreduce_bw_Bps", hw.roofline.allreduce_bw_Bps,
                             "a link bandwidth, with model.num_layers and model.hidden_size, when gpus_per_engine > 1 "
                             "(tensor parallelism all-reduces every layer)")
        if self.drafter.kind in ("model", "block") and self.drafter.model is None and not self.drafter.fwd_base_s:
            raise _PathError("drafter.model", None, f"the {self.drafter.name} drafter's shape (or drafter.fwd_base_s)")

    @property
    def kv_capacity_tokens(self) -> Optional[float]:
        """KV cache tokens per engine: given, or what memory_bytes leaves after the weights."""
        hw = self.hardware
        if hw.kv_capacity_tokens is not None:
            return float(hw.kv_capacity_tokens)
        if hw.memory_bytes is None:
            return None
        m, d = self.model, self.drafter.model
        weights = m.shape().total_weight_bytes + (d.shape().total_weight_bytes if d else 0.0)
        per_token = m.kv_bytes_per_token + (d.kv_bytes_per_token if d else 0.0)
        free = hw.memory_bytes * hw.gpus_per_engine * hw.memory_utilization - weights
        return free / per_token if per_token > 0 else None

    def _check_kv(self) -> None:
        hw = self.hardware
        if hw.memory_bytes is not None and hw.kv_capacity_tokens is not None:
            raise _PathError("hardware.memory_bytes", hw.memory_bytes, "null when kv_capacity_tokens is given")
        if hw.memory_bytes is not None and not self.model.kv_bytes_per_token:
            raise _PathError("model.kv_bytes_per_token", 0, "> 0 to derive the KV capacity from hardware.memory_bytes")
        cap = self.kv_capacity_tokens
        if cap is None:
            return
        need = self.workload.prompt_len + self.workload.lengths.max_len + self.speculation.k + 1
        if cap < need:
            key = "hardware.kv_capacity_tokens" if hw.kv_capacity_tokens is not None else "hardware.memory_bytes"
            raise _PathError(key, getattr(hw, key.split(".")[1]),
                             f"room for one request of prompt_len + max_len + k + 1 = {need} tokens "
                             f"(the KV cache holds {cap:.0f})")

    # ------------------------------------------------------------------ derived
    @property
    def alpha(self) -> Optional[float]:
        """alpha of the conditionals alpha * decay**(j-1) (solved when mean_accepted_length is
        given); None for a measured curve."""
        a = self.acceptance
        if a.alpha is not None:
            return a.alpha
        if a.mean_accepted_length is not None:
            return acc.solve_alpha(a.mean_accepted_length, a.measured_at_k or self.speculation.k, a.decay)
        return None

    @property
    def acceptance_model(self) -> Union[float, list[float]]:
        """What the scheduling code takes as `acceptance`: alpha (geometric) or the unconditional
        per-position curve."""
        a = self.acceptance
        if self.alpha is not None:
            return self.alpha if a.decay == 1.0 else [float(x) for x in acc.decayed_curve(self.alpha, a.decay)]
        return list(a.per_position or [])


def solve_alpha(mean_accepted_length: float, k: int, decay: float = 1.0) -> float:
    """alpha with mean accepted length `mean_accepted_length` at k drafts (sim/acceptance.py)."""
    return acc.solve_alpha(mean_accepted_length, k, decay)


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
    """A scenario path; bare names (`nvidia_qwen3_8b_rlzero.yaml`, with or without .yaml,
    `predictions/s1_nvidia_rlthink_k3`, `configs/sim/cpu_tiny.yaml`) are looked up next to
    `relative_to`, then in the bundled configs/sim/ and configs/ (resources.py)."""
    p = Path(path)
    tries = [p]
    if relative_to is not None:
        tries.append(relative_to / p)
    tries += config_lookups(p, "sim")
    if p.suffix not in (".yaml", ".yml"):
        tries += [t.with_name(t.name + ".yaml") for t in list(tries)]
    for t in tries:
        if t.is_file():
            return t
    raise ScenarioError(f"scenario file {path!r} not found (looked in ., {SIM_CONFIGS})")


def scenario_files(directory: str) -> list[Path]:
    """The `*.yaml` scenarios of a folder (`simulate --all`); a folder not found from the working
    directory (`configs/sim/predictions`, `predictions`) is looked up in the bundled configs/."""
    for d in [Path(directory), *config_lookups(directory, "sim")]:
        if d.is_dir():
            files = sorted(d.glob("*.yaml"))
            if files:
                return files
            break
    raise ScenarioError(f"--all {directory!r}: not a directory with *.yaml scenarios (looked in ., {SIM_CONFIGS})")


def _load_tree(path: Path, seen: tuple[Path, ...] = ()):
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if path.resolve() in seen:
        raise ScenarioError(f"{path}: `extends` forms a cycle ({' -> '.join(str(s) for s in seen)})")
    cfg = yaml_loader.read(path, ScenarioError, what="scenario")
    parent = cfg.pop("extends", None) if "extends" in cfg else None
    if parent is None:
        return cfg
    base = _load_tree(resolve_scenario_path(str(parent), path.parent), seen + (path.resolve(),))
    try:
        return OmegaConf.merge(base, cfg)
    except OmegaConfBaseException as e:
        raise ScenarioError(f"{path}: cannot merge it over the scenario it extends ({parent}): {e}") from None


def load_scenario(path: str, overrides: list[str] | tuple[str, ...] = ()) -> Scenario:
    """Load a scenario YAML (and what it `extends`), apply overrides, resolve (yaml_loader.py), validate."""
    p = resolve_scenario_path(path)
    cfg = yaml_loader.apply_overrides(_load_tree(p), overrides, p, ScenarioError, example="speculation.k=4")
    return validate_scenario(yaml_loader.resolve(cfg, p, ScenarioError))
