"""Scenario files for the simulator: schema, loading, `key=value` overrides, clear errors.

A scenario is a YAML file (loaded with OmegaConf, so `${...}` interpolation works) that
describes one engine's hardware cost model, the cluster, the drafter and its acceptance, the
speculation and scheduling policies, the rollout workload, the RL step around the rollout,
the sweeps to plot, and optionally the published figures it should reproduce. Every key is
documented in docs/simulator.md. Unknown keys are errors; types are strict (schema.Strict: `true`
is not a number, "3" and 3.5 are not integers), numbers finite and within a plausible range, and
the sizes together within a work budget (`Scenario.work`; docs/simulator.md, "Limits"). Every
error names the file and the dotted key path (e.g. `scenario.acceptance.alpha: got 1.3; allowed:
...`), on one line per key.

`extends: other.yaml` at the top level starts from another scenario (looked up next to the
file, then in configs/sim/) and overrides its keys. Reading, overrides (`key=value`, `+key=value`,
`++key=value`, `~key`) and interpolation are yaml_loader.py's.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator

from nemo_rl_specdec import yaml_loader
from nemo_rl_specdec.cost.price import PricedDrafter
from nemo_rl_specdec.cost.profile import load_profile, profile_path
from nemo_rl_specdec.cost.schema import (  # noqa: F401  (the scenario's blocks and limits, named here too)
    BANDWIDTH_BPS,
    FLOP_RATE,
    GPU_MEMORY_BYTES,
    MAX_ATTN_FLOPS_PER_CTX,
    MAX_CAPTURE_SIZE,
    MAX_EXPERTS,
    MAX_FLOPS_PER_TOKEN,
    MAX_GPUS_PER_ENGINE,
    MAX_KV_BYTES_PER_TOKEN,
    MAX_KV_TOKENS,
    MAX_LIST,
    MAX_NUM_SEQS,
    MAX_STEP_COST_S,
    MAX_TOKENS,
    MIN_STEP_BASE_S,
    MODEL_BYTES,
    CostError,
    DraftCost,
    Experts,
    Hardware,
    ModelSpec,
    RooflineSpec,
    _short,
    _Strict,
    _tuples,
    _unit,
    format_errors,
)
from nemo_rl_specdec.drafters.base import HOST, PARALLEL, SEQUENTIAL
from nemo_rl_specdec.drafters.registry import registered
from nemo_rl_specdec.resources import config_lookups, config_path
from nemo_rl_specdec.scheduling.budget import expected_accepted
from nemo_rl_specdec.schema import PathError as _PathError, k_by_batch_size_table
from nemo_rl_specdec.sim import acceptance as acc

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
    return {**PUBLISHED_DRAFTERS, **{n: SIM_KIND[d.draft_cost] for n, d in registered(PricedDrafter).items()}}


class ScenarioError(CostError):
    """Invalid scenario; the message names the dotted key path, the value and what is allowed."""


# --------------------------------------------------------------------------- limits
# The plausible range of every number of a scenario (docs/simulator.md, "Limits"; the cost blocks' in
# cost/schema.py). Each admits
# every bundled scenario and prediction with room to spare; outside it a number is a typo or
# would make the simulation overflow or run for hours.
MAX_PHASE_S = 86400.0             # RL phases and the weight update (seconds)
MAX_PROMPTS = 100_000             # workload.num_prompts
MAX_GENERATIONS = 1024            # workload.generations_per_prompt
MAX_HISTORY = 1024                # workload.history_rollouts
MAX_STEPS = 1000                  # rl.num_steps
MAX_POLICY_LAG = 100
MAX_ENGINES = 16_384              # cluster.num_engines, sweep.num_engines
MAX_TRAINING_GPUS = 1_000_000
MAX_K = 64                        # speculation.num_speculative_tokens
MAX_BUDGET_INTERVAL = 1_000_000
MAX_SWEEP_POINTS = 32
MAX_SEED = 2 ** 32 - 1
MAX_CURVE = 1024                  # acceptance curves and segments
MAX_FACTOR = 1000.0               # acceptance.by_response_position factors
MAX_SIGMA = 5.0                   # log-std of the lognormal lengths
MIN_SPREAD = 1e-3                 # acceptance.spread: 0, or a spread a Beta distribution can take
# work of one simulated run (baseline or speculative): requests and history draws, budget
# recomputations, acceptance segments and engine-steps, each counted as one event
# (`Scenario.work`); the largest bundled scenario needs about 0.22 M
MAX_EVENTS_PER_RUN = 1_000_000
# `speculation.scheduling.k: auto` prices every batch size 1..max_num_seqs at every d = 0..k
MAX_K_AUTO_EVALS = 65_536


class Cluster(_Strict):
    num_engines: int = Field(1, ge=1, le=MAX_ENGINES, description="data-parallel generation engines")


class Drafter(DraftCost):
    """A scenario's drafter: `DraftCost` (cost/schema.py) whose `name` is a registered or published
    drafter, which implies its kind."""

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
        return self.check_coverage()


class Acceptance(_Strict):
    """Exactly one of: alpha (position j accepted, given j-1 was, with probability
    alpha * decay**(j-1); decay 1 is geometric), conditional (those conditionals given
    directly), per_position (measured unconditional acceptance of positions 1, 2, ...),
    mean_accepted_length (tokens per step, bonus included, measured at `measured_at_k` drafts,
    default speculation.num_speculative_tokens; alpha is solved from it with the given decay, so changing k keeps
    the per-position acceptance when measured_at_k is given), or bench_json (a bench result's
    accepted_per_position). See sim/acceptance.py."""

    alpha: float | None = Field(None, ge=0, le=1)
    conditional: list[float] | None = None
    per_position: list[float] | None = None
    mean_accepted_length: float | None = Field(None, ge=1, le=MAX_K + 1)
    bench_json: str | None = Field(None, description="a `nemo-rl-specdec bench --json` file")
    bench_result: str | None = Field(None, description="the result's name in bench_json (default: the only one)")
    measured_at_k: int | None = Field(
        None, ge=1, le=MAX_K, description="the k at which mean_accepted_length was measured (default: "
        "speculation.num_speculative_tokens)"
    )
    decay: float = Field(1.0, gt=0, le=1, description="conditional acceptance falls by this factor per position")
    trained_depth: int | None = Field(
        None, ge=1, le=MAX_K, description="the deepest draft position the drafter was trained for (and its "
        "acceptance measured at): positions past it are credited no acceptance (none is extrapolated)")
    spread: float = Field(0.0, ge=0, le=0.5, description="std of a per-request alpha; keeps the mean accepted length")
    by_response_position: list[list[float]] | None = Field(
        None, description="[[from_position, factor], ...]: from that many response tokens on, a request's accepted "
        "drafts per step are multiplied by factor (never above its drafts); first from_position 0, ascending")

    @model_validator(mode="after")
    def _one(self):
        forms = ("alpha", "conditional", "per_position", "mean_accepted_length", "bench_json")
        given = [n for n in forms if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(forms)} (got {given or 'none'})")
        for key in ("conditional", "per_position"):
            v = getattr(self, key)
            if v is not None and (not 1 <= len(v) <= MAX_CURVE or any(not 0 <= x <= 1 for x in v)):
                raise _PathError(f"acceptance.{key}", v, f"a list of 1 to {MAX_CURVE} values from 0 to 1 (position 1 "
                                 "first)")
        if self.conditional is not None:
            self.per_position = acc.from_conditional(self.conditional)
        if self.bench_json is not None:
            try:
                self.per_position = acc.curve_from_bench(self.bench_json, self.bench_result)
            except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
                why = e if isinstance(e, (OSError, ValueError)) else f"{type(e).__name__}: {e}"
                raise _PathError("acceptance.bench_json", self.bench_json,
                                 f"a readable bench JSON ({_short(why, 200)})") from None
        elif self.bench_result is not None:
            raise _PathError("acceptance.bench_result", self.bench_result, "null unless bench_json is given")
        if self.by_response_position is not None:
            pts = self.by_response_position
            ok = (pts and len(pts) <= MAX_CURVE and all(len(p) == 2 and 0 <= p[1] <= MAX_FACTOR for p in pts)
                  and pts[0][0] == 0 and all(a[0] < b[0] for a, b in zip(pts, pts[1:], strict=False))
                  and pts[-1][0] <= MAX_TOKENS)
            if not ok:
                raise _PathError("acceptance.by_response_position", pts,
                                 f"1 to {MAX_CURVE} [from_position, factor] pairs with the first from_position 0, "
                                 f"from_positions strictly ascending up to {MAX_TOKENS:,} and factors from 0 to "
                                 f"{MAX_FACTOR:g}")
        if self.per_position is not None:
            try:
                expected_accepted(self.per_position, len(self.per_position))  # validates the curve
            except ValueError as e:
                key = next(k for k in ("per_position", "conditional", "bench_json") if getattr(self, k) is not None)
                raise _PathError(f"acceptance.{key}", getattr(self, key), str(e)) from None
            for key in ("spread", "decay"):
                if getattr(self, key) != (0.0 if key == "spread" else 1.0):
                    raise _PathError(f"acceptance.{key}", getattr(self, key),
                                     "its default: it applies to alpha / mean_accepted_length, not to a measured curve")
        return self


class SpecScheduling(_Strict):
    """`speculation.scheduling`: the run config's `speculative_decoding.scheduling` keys, plus what
    only the simulator prices (`k: per_step`, `medium_k`, `budget_interval_steps`)."""

    placement: Literal["contiguous", "round_robin", "length_aware"] = "contiguous"
    budget: Literal["uniform", "length_aware", "das", "adaptive"] = "uniform"
    # [[batch_lo, batch_hi, k], ...], as the run config's
    k_by_batch_size: list[tuple[int, int, int]] | None = None
    # auto: k by batch size, the best for each batch size under the cost model (the run config's
    # k: auto, with the model as the oracle); per_step: every d = 0..k priced at every event
    k: Literal["auto", "per_step"] | None = None
    long_fraction: float = Field(0.25, gt=0, le=1)
    short_fraction: float = Field(0.25, ge=0, lt=1)
    medium_k: int | None = Field(None, ge=0, le=MAX_K)
    budget_interval_steps: int = Field(64, ge=1, le=MAX_BUDGET_INTERVAL, description="recompute budgets at least "
                                       "this often")

    @field_validator("k_by_batch_size", mode="before")
    @classmethod
    def _k_table(cls, v):
        return k_by_batch_size_table(v)

    @property
    def k_schedule(self) -> None | str | list[tuple[int, int, int]]:
        """What sets k per batch size: 'auto', 'per_step', the table, or None (k throughout)."""
        return self.k if self.k is not None else self.k_by_batch_size


class Speculation(_Strict):
    """`speculation`: the run config's `speculative_decoding` names for what the simulator prices."""

    enabled: bool = True
    num_speculative_tokens: int = Field(3, ge=1, le=MAX_K)
    # default false, where the run config's unset auto_disable is on for DAS: a scenario's `suffix` names
    # no proposer, and vLLM's own suffix and n-gram proposers have no off switch
    auto_disable: bool = Field(False, description="list drafters: the engines' per-step off switch "
                               "(speculative_decoding.auto_disable), judged at every event")
    scheduling: SpecScheduling = SpecScheduling()

    @model_validator(mode="after")
    def _check(self):
        s, k = self.scheduling, self.num_speculative_tokens
        if self.auto_disable and s.budget == "adaptive":
            raise _PathError("speculation.auto_disable", True, "false with scheduling.budget: adaptive, which "
                             "already drafts nothing where no draft token pays")
        if s.long_fraction + s.short_fraction > 1:
            raise _PathError("speculation.scheduling.short_fraction", s.short_fraction,
                             f"<= 1 - long_fraction = {1 - s.long_fraction:g} (long_fraction + short_fraction <= 1)")
        if s.medium_k is not None and s.medium_k > k:
            raise _PathError("speculation.scheduling.medium_k", s.medium_k, f"<= num_speculative_tokens = {k}")
        if s.k is not None and s.k_by_batch_size is not None:
            raise _PathError("speculation.scheduling.k_by_batch_size", _short(s.k_by_batch_size),
                             f"null with scheduling.k: {s.k}, which sets k per batch size itself")
        table = s.k_by_batch_size
        if table is not None:
            if not table or len(table) > MAX_NUM_SEQS:
                raise _PathError("speculation.scheduling.k_by_batch_size", _short(table),
                                 f"1 to {MAX_NUM_SEQS} [batch_lo, batch_hi, k] ranges (or scheduling.k: auto | "
                                 "per_step)")
            for i, (lo, hi, kk) in enumerate(table):
                if hi > 10 ** 9 or kk > k:
                    raise _PathError(f"speculation.scheduling.k_by_batch_size.{i}", [lo, hi, kk],
                                     f"ranges with batch_hi <= 1e9 and k <= num_speculative_tokens = {k}")
        return self


# Keys of the speculation and sweep blocks renamed to the run config's names: the old key -> the new one.
RENAMED_SWEEP_KEYS = {"k": "num_speculative_tokens"}
RENAMED_SPECULATION_KEYS = {
    "k": "num_speculative_tokens",
    "placement": "scheduling.placement",
    "budget": "scheduling.budget",
    "long_fraction": "scheduling.long_fraction",
    "short_fraction": "scheduling.short_fraction",
    "medium_k": "scheduling.medium_k",
    "budget_interval_steps": "scheduling.budget_interval_steps",
    "k_by_batch_size": "scheduling.k_by_batch_size (a table) or scheduling.k (auto | per_step)",
}


class Lengths(_Strict):
    """Response lengths. lognormal: each problem has its own median, drawn around `median` with
    log-std `sigma_between`; its samples spread around it with log-std `sigma_within`; lengths
    are clipped to [min_len, max_len]. values: measured lengths, drawn with replacement.
    groups: measured lengths per problem; each simulated problem is one group."""

    dist: Literal["lognormal", "values", "groups"] = "lognormal"
    median: float = Field(1000.0, gt=0, le=MAX_TOKENS, **_unit("tokens"))
    sigma_between: float = Field(0.5, ge=0, le=MAX_SIGMA)
    sigma_within: float = Field(0.5, ge=0, le=MAX_SIGMA)
    min_len: int = Field(1, ge=1, le=MAX_TOKENS, **_unit("tokens"))
    max_len: int = Field(8192, ge=1, le=MAX_TOKENS, **_unit("tokens"))
    values: list[int] | None = None
    groups: list[list[int]] | None = None

    @model_validator(mode="after")
    def _check(self):
        if self.min_len > self.max_len:
            raise _PathError("workload.lengths.min_len", self.min_len, f"<= max_len={self.max_len}")
        for key in ("values", "groups"):
            if getattr(self, key) is not None and self.dist != key:
                raise _PathError(f"workload.lengths.{key}", _short(getattr(self, key)),
                                 f"null unless dist is '{key}' (dist is {self.dist!r}; it would be ignored)")
        if self.dist == "values" and not self.values:
            raise _PathError("workload.lengths.values", self.values, "a non-empty list of lengths with dist 'values'")
        if self.dist == "groups" and (not self.groups or any(not g for g in self.groups)):
            raise _PathError("workload.lengths.groups", _short(self.groups),
                             "a non-empty list of non-empty groups with dist 'groups'")
        measured = (self.values or []) + [x for g in (self.groups or []) for x in g]
        if len(measured) > MAX_LIST:
            raise _PathError(f"workload.lengths.{self.dist}", f"{len(measured):,} lengths", f"at most {MAX_LIST:,}")
        for v in measured:
            if not 1 <= v <= MAX_TOKENS:
                raise _PathError(f"workload.lengths.{self.dist}", v,
                                 f"measured lengths from 1 to {MAX_TOKENS:,} tokens")
        return self


class Workload(_Strict):
    num_prompts: int = Field(64, ge=1, le=MAX_PROMPTS, description="prompts (GRPO groups) per step")
    generations_per_prompt: int = Field(16, ge=1, le=MAX_GENERATIONS)
    prompt_len: int = Field(256, ge=0, le=MAX_TOKENS, **_unit("tokens"))
    lengths: Lengths = Lengths()
    prediction: Literal["history", "oracle", "none"] = "history"
    steady_state: bool = Field(
        False, description="serving benchmark: every request released at once, max_num_seqs always in flight")
    history_rollouts: int = Field(8, ge=0, le=MAX_HISTORY, description="earlier rollouts per problem the predictor "
                                  "has seen")


class Phase(_Strict):
    fixed_s: float = Field(0.0, ge=0, le=MAX_PHASE_S, **_unit("s"))
    per_ktoken_s: float = Field(0.0, ge=0, le=MAX_STEP_COST_S, description="seconds per 1000 tokens (prompt + "
                                "response) in the batch", **_unit("s"))
    flops_per_token: float = Field(0.0, ge=0, le=MAX_FLOPS_PER_TOKEN, description="FLOPs per batch token (6 x params "
                                   "to train, 2 x to score)")


class RL(_Strict):
    mode: Literal["sync", "async"] = "sync"
    max_policy_lag: int = Field(1, ge=1, le=MAX_POLICY_LAG, description="async: a batch may be generated with a "
                                "policy this many versions old")
    num_steps: int = Field(4, ge=2, le=MAX_STEPS)
    logprob: Phase = Phase()
    train: Phase = Phase()
    refit_s: float = Field(0.0, ge=0, le=MAX_PHASE_S, description="weight update of the engines (blocks generation)",
                           **_unit("s"))
    refit_blocks_training: bool = Field(False, description="async: the trainer also waits for the refit")
    colocated: bool | None = Field(None, description="generation and training on the same GPUs (default: sync)")
    training_gpus: int | None = Field(None, ge=1, le=MAX_TRAINING_GPUS, description="GPUs of the training pool "
                                         "(default: generation's)")
    training_flops_per_s: float = Field(0.0, ge=0, le=FLOP_RATE[1], description="effective FLOP/s per training GPU "
                                        "(0: not given)", **_unit("FLOP/s"))

    @model_validator(mode="after")
    def _steps(self):
        if self.mode == "async" and self.num_steps < self.max_policy_lag + 2:
            raise ValueError(f"num_steps must be >= max_policy_lag + 2 = {self.max_policy_lag + 2} in async mode")
        if 0 < self.training_flops_per_s < FLOP_RATE[0]:
            raise _PathError("rl.training_flops_per_s", self.training_flops_per_s,
                             f"0 (not given) or a number from {FLOP_RATE[0]:g} to {FLOP_RATE[1]:g} (FLOP/s)")
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
                raise _PathError(f"sweep.{key}", v, f"a list of 1 to {MAX_SWEEP_POINTS} values from {lo:,} to {hi:,}"
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


class Hybrid(_Strict):
    """`hybrid`: the scenario's drafter is a hybrid (`drafters/machinery/hybrid_choice.py`): the
    `drafter` and `acceptance` blocks are its model half, and this block its history half, read from
    a `bench --suite hybrid --json` result (`bench_result`, default ``das_all``: DAS with every draft
    verified): its `coverage` (share of request-steps with a history draft) and
    `accepted_per_position` (acceptance of those drafts by position). At every event the engine
    applies `hybrid_choice.choose`: history drafts only, or the model half's `model_k` forwards too,
    each request taking the better of its two drafts; the history proposer's host time and the model
    half's first forward (the engine runs it where the model half is skipped too: it writes the
    head's KV of the verified tokens) are paid on every step."""

    bench_json: str = Field(description="a `nemo-rl-specdec bench --suite hybrid --json` file (a path, or relative "
                            "to configs/sim/)")
    bench_result: str = Field("das_all", description="the history half's result in bench_json")
    profile_entry: str = Field("das", description="with hardware_profile: the entry pricing the history proposer")
    per_request_s: float = Field(0.0, ge=0, le=MAX_STEP_COST_S, description="history proposer host time per request "
                                 "per step", **_unit("s"))
    step_overhead_s: float = Field(0.0, ge=0, le=MAX_STEP_COST_S, description="history proposer host time per step",
                                   **_unit("s"))
    model_k: int | None = Field(None, ge=1, le=MAX_K, description="the model half's draft depth (forwards when it "
                                "runs; default speculation.num_speculative_tokens)")
    replicas: int = Field(20, ge=1, le=1000, description="a request stands for this many, round(coverage * replicas) "
                          "of them with a history draft (the coverage's resolution)")
    coverage: float | None = Field(None, description="read from bench_json (not given)")
    per_position: list[float] | None = Field(None, description="read from bench_json (not given)")

    @model_validator(mode="after")
    def _read(self):
        import json

        if self.coverage is not None or self.per_position is not None:
            raise _PathError("hybrid.coverage", self.coverage, "not given: both are read from hybrid.bench_json")
        path = next((p for p in [Path(self.bench_json), *config_lookups(self.bench_json, "sim")] if _is(p, "file")),
                    None)
        if path is None:
            raise _PathError("hybrid.bench_json", self.bench_json, "a bench JSON file (a path, or relative to "
                             "configs/sim/)")
        try:
            rows = {r.get("name"): r for r in json.loads(path.read_text()).get("results", [])}
            row = rows[self.bench_result]
            cov, curve = float(row["coverage"]), acc.monotone_curve(row["accepted_per_position"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise _PathError("hybrid.bench_json", self.bench_json, f"a bench --suite hybrid JSON with a result "
                             f"{self.bench_result!r} carrying coverage and accepted_per_position "
                             f"({_short(_one_line(e), 200)})") from None
        if not 0 < cov <= 1 or not curve:
            raise _PathError("hybrid.bench_json", self.bench_json, f"result {self.bench_result!r} with coverage in "
                             f"(0, 1] and a non-empty accepted_per_position (got {cov}, {curve})")
        self.coverage, self.per_position = cov, curve
        return self


class Scenario(_Strict):
    name: str = "scenario"
    description: str = ""
    seed: int = Field(0, ge=0, le=MAX_SEED, description="seeds every random draw (numpy needs it >= 0)")
    model: ModelSpec | None = Field(None, description="the target model's shape (the roofline needs it)")
    hardware: Hardware
    cluster: Cluster = Cluster()
    drafter: Drafter = Drafter()
    acceptance: Acceptance
    hybrid: Hybrid | None = Field(None, description="a hybrid drafter: drafter/acceptance are its model half, "
                                  "this its history half")
    speculation: Speculation = Speculation()
    workload: Workload = Workload()
    rl: RL = RL()
    baseline: Baseline = Baseline()
    sweep: Sweep = Sweep()
    calibration: dict[str, Target] | None = Field(
        None, description="published figures to reproduce; null drops an extended file's"
    )
    calibration_points: list[CalibrationPoint] | None = Field(
        None, max_length=MAX_SWEEP_POINTS, description="variants of this scenario (overrides) with their published "
        "figures")
    _source: str | None = PrivateAttr(None)

    @property
    def source(self) -> str:
        """The file the scenario was loaded from (load_scenario), else its name."""
        return self._source or self.name

    @model_validator(mode="after")
    def _coherent(self):
        if self.hybrid is not None:
            if self.drafter.kind not in ("model", "block"):
                raise _PathError("drafter.name", self.drafter.name, "a model or block drafter with hybrid: (the "
                                 "scenario's drafter is the hybrid's model half)")
            if self.hybrid.model_k is not None and self.hybrid.model_k > self.speculation.num_speculative_tokens:
                raise _PathError("hybrid.model_k", self.hybrid.model_k,
                                 f"<= speculation.num_speculative_tokens = {self.speculation.num_speculative_tokens}")
            if self.speculation.scheduling.k_schedule is not None:
                raise _PathError("speculation.scheduling", "k by batch size", "none with hybrid: (its rule cuts "
                                 "every request's drafts at every event)")
        if self.drafter.kind == "model" and self.speculation.auto_disable:
            raise _PathError(
                "speculation.auto_disable", True,
                f"false for model drafter {self.drafter.name!r}: vLLM fixes its k per batch size at engine start; "
                "use speculation.scheduling.k_by_batch_size or scheduling.k",
            )
        if self.drafter.kind == "model" and self.speculation.scheduling.budget != "uniform":
            raise _PathError(
                "speculation.scheduling.budget", self.speculation.scheduling.budget,
                f"'uniform' for model drafter {self.drafter.name!r}: per-request budgets need a list drafter "
                "(suffix, ngram); use speculation.scheduling.k_by_batch_size or scheduling.k for model drafters",
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
        at_k = a.measured_at_k or self.speculation.num_speculative_tokens
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
        if a.trained_depth is not None and a.spread > 0:
            raise _PathError("acceptance.trained_depth", a.trained_depth, "null with acceptance.spread (per-request "
                             "alphas are drawn as geometric curves)")
        if a.trained_depth is not None and a.trained_depth < at_k and a.mean_accepted_length is not None:
            raise _PathError("acceptance.trained_depth", a.trained_depth,
                             f">= the k the acceptance was measured at ({at_k})")
        if 0 < a.spread < MIN_SPREAD:
            raise _PathError("acceptance.spread", a.spread, f"0 (every request alike) or from {MIN_SPREAD:g} to 0.5")
        if a.spread > 0:
            try:
                acc.spread_mean(self.alpha, a.decay, a.spread, at_k)
            except ValueError as e:
                raise _PathError("acceptance.spread", a.spread, str(e)) from None
        self._check_kv()
        sp = self.speculation.scheduling
        ks = self.sweep.num_speculative_tokens
        if sp.medium_k is not None and sp.budget == "length_aware" and min(ks) < sp.medium_k:
            raise _PathError("sweep.num_speculative_tokens", ks, f"values >= speculation.scheduling.medium_k = "
                             f"{sp.medium_k} (a length_aware budget gives medium requests medium_k <= k drafts)")
        self.check_work()
        return self

    # ------------------------------------------------------------------ work
    def work(self, k: int | None = None, num_engines: int | None = None,
             num_prompts: int | None = None) -> tuple[int, str, str]:
        """(events, key, what) of one simulated run with these overrides (the sweeps'): an upper
        estimate of the simulator's work in events (docs/simulator.md, "Limits"), the key that
        contributes most, and the sum spelled out. Counted: every request and history draw, every
        engine at every RL step, every change of acceptance segment, and every budget recomputation
        (one per `budget_interval_steps` steps of every engine's longest wave, weighted by the
        requests it re-plans / 8); all times k + 1 with `k_by_batch_size: per_step` (every d is
        priced at every event) and times 4 with `budget: adaptive` or `auto_disable` (every
        request's draft is judged at every event)."""
        wl, sp, hw = self.workload, self.speculation, self.hardware
        sched = sp.scheduling
        k = sp.num_speculative_tokens if k is None else k
        E = self.cluster.num_engines if num_engines is None else num_engines
        P = wl.num_prompts if num_prompts is None else num_prompts
        G, H, N = wl.generations_per_prompt, wl.history_rollouts, self.rl.num_steps
        per_step = P * G
        requests, history = per_step * N, P * H * N
        budgets = 0
        if sp.enabled and sched.budget != "uniform":
            busy = min(E, per_step)
            active = min(hw.max_num_seqs, -(-per_step // busy))
            waves = -(-per_step // (busy * hw.max_num_seqs))
            budgets = busy * N * waves * -(-wl.lengths.max_len // sched.budget_interval_steps) * max(1, active // 8)
        segments = requests * (len(self.acceptance.by_response_position or [[0, 1]]) - 1)
        parts = {"workload.num_prompts": requests, "workload.history_rollouts": history,
                 "speculation.scheduling.budget_interval_steps": budgets,
                 "acceptance.by_response_position": segments,
                 "cluster.num_engines": E * N}
        factor = ((k + 1) if sp.enabled and sched.k == "per_step" else 1) \
            * (4 if sp.enabled and (sched.budget == "adaptive" or sp.auto_disable) else 1)
        events = sum(parts.values()) * factor
        what = " + ".join(f"{v:,} {name}" for v, name in (
            (requests, f"requests ({P:,} prompts x {G} x {N} steps)"), (history, "history draws"),
            (budgets, "weighted budget recomputations"), (segments, "acceptance segment changes"),
            (E * N, "engine-steps")) if v) + (f", x {factor} (drafts judged at every event)" if factor > 1 else "")
        key = max(parts, key=parts.get)
        if factor > 1 and parts[key] * factor > MAX_EVENTS_PER_RUN >= sum(parts.values()):
            key = "speculation.scheduling.k" if sched.k == "per_step" else "speculation.scheduling.budget"
        return events, key, what

    def check_work(self, k: int | None = None, num_engines: int | None = None,
                   num_prompts: int | None = None, at: tuple[str, Any] | None = None) -> None:
        """Refuse a run whose `work` exceeds MAX_EVENTS_PER_RUN, or whose k-by-batch-size table
        (`auto`) prices more than MAX_K_AUTO_EVALS steps. The error names the key that contributes
        most, or `at` (key, value): the sweep that asked for the run."""
        events, key, what = self.work(k, num_engines, num_prompts)
        if events > MAX_EVENTS_PER_RUN:
            name, value = at or (key, _short(self._get(key)))
            hint = {"speculation.scheduling.budget_interval_steps": "make speculation.scheduling.budget_interval_steps "
                                                                    "larger (or workload.lengths.max_len smaller)",
                    "acceptance.by_response_position": "give fewer acceptance.by_response_position segments",
                    "cluster.num_engines": "make cluster.num_engines or rl.num_steps smaller",
                    "speculation.scheduling.k": "make speculation.num_speculative_tokens smaller or give "
                                                "scheduling.k_by_batch_size as a list",
                    "speculation.scheduling.budget": "make the workload smaller or use another "
                                                     "speculation.scheduling.budget",
                    }.get(key, "make workload.num_prompts, generations_per_prompt, history_rollouts or rl.num_steps "
                               "smaller")
            if at is not None:
                hint = f"give smaller {at[0]} values" + (" (or sweep.cluster_scaling: strong, which keeps the batch)"
                                                         if at[0] == "sweep.num_engines" else "")
            raise _PathError(name, value, f"a run of at most {MAX_EVENTS_PER_RUN:,} simulated events; this one needs "
                             f"about {events:,} ({what}): {hint}")
        sp = self.speculation
        k = sp.num_speculative_tokens if k is None else k
        evals = self.hardware.max_num_seqs * (k + 1)
        if sp.enabled and sp.scheduling.k == "auto" and evals > MAX_K_AUTO_EVALS:
            name, value = at or ("speculation.scheduling.k", "auto")
            raise _PathError(name, value, f"at most {MAX_K_AUTO_EVALS:,} step prices for the k-by-batch-size table "
                             f"(auto): hardware.max_num_seqs {self.hardware.max_num_seqs:,} x (k + 1 = {k + 1}) = "
                             f"{evals:,}; give the table as a list, or lower max_num_seqs or k")

    def _get(self, dotted: str) -> Any:
        node: Any = self
        for part in dotted.split("."):
            node = getattr(node, part)
        return node

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
    def kv_capacity_tokens(self) -> float | None:
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
        need = self.workload.prompt_len + self.workload.lengths.max_len + self.speculation.num_speculative_tokens + 1
        if cap < need:
            key = "hardware.kv_capacity_tokens" if hw.kv_capacity_tokens is not None else "hardware.memory_bytes"
            raise _PathError(key, getattr(hw, key.split(".")[1]),
                             f"room for one request of prompt_len + max_len + k + 1 = {need} tokens "
                             f"(the KV cache holds {cap:.0f})")

    # ------------------------------------------------------------------ derived
    @property
    def alpha(self) -> float | None:
        """alpha of the conditionals alpha * decay**(j-1) (solved when mean_accepted_length is
        given); None for a measured curve."""
        a = self.acceptance
        if a.alpha is not None:
            return a.alpha
        if a.mean_accepted_length is not None:
            at_k = a.measured_at_k or self.speculation.num_speculative_tokens
            return acc.solve_alpha(a.mean_accepted_length, at_k, a.decay)
        return None

    @property
    def acceptance_model(self) -> float | list[float]:
        """What the scheduling code takes as `acceptance`: alpha (geometric) or the unconditional
        per-position curve."""
        a = self.acceptance
        if self.alpha is not None:
            if a.decay == 1.0 and a.trained_depth is None:
                return self.alpha
            curve = [float(x) for x in acc.decayed_curve(self.alpha, a.decay)]
        else:
            curve = list(a.per_position or [])
        if a.trained_depth is not None:   # no acceptance credited past the trained depth
            curve = [x if j < a.trained_depth else 0.0 for j, x in enumerate(curve)]
        return curve


def solve_alpha(mean_accepted_length: float, k: int, decay: float = 1.0) -> float:
    """alpha with mean accepted length `mean_accepted_length` at k drafts (sim/acceptance.py)."""
    return acc.solve_alpha(mean_accepted_length, k, decay)


# --------------------------------------------------------------------------- errors

def _one_line(e: Exception) -> str:
    """An OmegaConf error's first line."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _format(err: ValidationError) -> list[str]:
    """One line per key at fault: `scenario.<dotted key>: got <value>; allowed: <what is>`."""
    return format_errors(err, Scenario, "scenario")


# --------------------------------------------------------------------------- loading

def _is(path: Path, kind: str) -> bool:
    """path.is_file() / is_dir(), False for a path the OS cannot look up (too long, NUL byte)."""
    try:
        return path.is_file() if kind == "file" else path.is_dir()
    except (OSError, ValueError):
        return False


def validate_scenario(raw: Any, source: str | Path | None = None) -> Scenario:
    """The scenario of a resolved mapping; a ScenarioError naming `source` (the file) and each key at
    fault, one per line, otherwise."""
    where = f"{source}: " if source is not None else ""
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}scenario: got {type(raw).__name__}; allowed: a mapping of scenario keys")
    keys = [str(k) for k in raw]
    if not raw:
        raise ScenarioError(f"{where}the scenario is empty; allowed: a mapping with at least hardware: and "
                            "acceptance: (docs/simulator.md)")
    if "policy" in raw and "hardware" not in raw:
        raise ScenarioError(f"{where}a run file (it has a policy: block), not a simulator scenario; allowed: a "
                            "scenario with hardware: and acceptance: (configs/sim/); run files are for validate, "
                            "generate, demo and bench")
    unknown = [k for k in keys if k not in Scenario.model_fields and k != "hardware_profile"]
    if unknown and not {"hardware", "acceptance"} & set(keys):
        raise ScenarioError(f"{where}not a simulator scenario: no hardware: or acceptance:, and keys a scenario does "
                            f"not have ({_short(unknown)}); allowed: a mapping with hardware: and acceptance: "
                            "(docs/simulator.md)")
    lines = [f"scenario.{block}.{k}: renamed to {block}.{renames[k]} (the run config's name)"
             for block, renames in (("speculation", RENAMED_SPECULATION_KEYS), ("sweep", RENAMED_SWEEP_KEYS))
             if isinstance(raw.get(block), dict) for k in raw[block] if k in renames]
    if lines:
        more = f" (and {len(lines) - 1} more below)" if len(lines) > 1 else ""
        raise ScenarioError(where + lines[0] + more + "".join(f"\n  {line}" for line in lines[1:]))
    if "hardware_profile" in raw:
        raw = with_profile(raw, where)
    try:
        sc = Scenario.model_validate(raw)
    except ValidationError as e:
        lines = _format(e)
        more = f" (and {len(lines) - 1} more below)" if len(lines) > 1 else ""
        raise ScenarioError(where + lines[0] + more + "".join(f"\n  {line}" for line in lines[1:])) from None
    if source is not None:
        sc._source = str(source)
    return sc


# what `hardware_profile` gives a scenario, and so what the scenario may not give itself
PROFILE_GIVES = {"model": None, "hardware": ("roofline", "c_base_s", "c_tok_s", "c_ctx_s", "c_seq_s", "fit_samples"),
                 "drafter": ("kind", "model", "fwd_base_s", "tok_s", "ctx_s", "per_request_s", "step_overhead_s")}


def with_profile(raw: dict, where: str = "") -> dict:
    """`raw` with `hardware_profile: NAME` (configs/hardware/, cost/profile.py) replaced by what the
    profile prices: the target's shape (`model`), the roofline (`hardware.roofline`, and
    `memory_bytes` unless given), and the costs of the drafter named by `drafter.name`
    (`drafter.profile_entry` names another entry, e.g. `das` or `vllm_suffix` for the suffix
    drafter): the one cost model the priced benches use."""
    raw = dict(raw)
    name = raw.pop("hardware_profile")
    if not isinstance(name, str):
        raise ScenarioError(f"{where}hardware_profile: got {name!r}; allowed: a profile name in configs/hardware/")
    for key in ("hardware", "drafter", "hybrid"):
        if raw.get(key) is not None and not isinstance(raw[key], dict):
            raise ScenarioError(f"{where}{key}: got {_short(raw[key])}; allowed: a mapping of settings")
    for key, fields in PROFILE_GIVES.items():
        given = raw.get(key) or {}
        clash = ([key] if fields is None and key in raw and raw[key] is not None else
                 [f"{key}.{f}" for f in (fields or ()) if isinstance(given, dict) and given.get(f) is not None])
        if clash:
            got = given if fields is None else given[clash[0].split(".")[1]]
            raise ScenarioError(f"{where}{clash[0]}: got {_short(got)}; allowed: null with hardware_profile ({name} "
                                "gives it)")
    try:
        path = profile_path(name)
    except CostError as e:
        raise ScenarioError(f"{where}hardware_profile: {e}") from None
    prof = yaml_loader.load(path, error=ScenarioError, what="hardware profile")
    dr = {k: v for k, v in dict(raw.get("drafter") or {}).items() if v is not None}
    entry = dr.pop("profile_entry", dr.get("name", Drafter().name))
    entries = prof.get("drafters") or {}
    if entry not in entries:
        raise ScenarioError(f"{where}drafter.profile_entry: {path}: drafters.{entry}: not in this hardware profile; "
                            f"it prices {sorted(entries)}")
    try:
        d = Drafter.model_validate(entries[entry])   # the entry's kind checked against the registry
        d.fwd_base_s = load_profile(str(path)).drafter(entry).fwd_base_s   # as the profile prices it
    except (ValidationError, ValueError, KeyError, CostError) as e:
        raise ScenarioError(f"{where}hardware_profile: {path}: {_short(e, 300)}") from None
    raw["model"] = prof["model"]
    hw = {k: v for k, v in dict(raw.get("hardware") or {}).items() if v is not None}
    hw["roofline"] = prof["hardware"]["roofline"]
    hw.setdefault("memory_bytes", prof["hardware"].get("memory_bytes"))
    hw.setdefault("name", prof["hardware"].get("name", name))
    raw["hardware"] = hw
    dr.setdefault("name", d.name)
    if dr["name"] != d.name:
        raise ScenarioError(f"{where}drafter.name: got {dr['name']!r}; {name}'s entry {entry!r} prices {d.name!r}")
    dr.update(d.model_dump(mode="json", include={"kind", "model", "fwd_base_s", "tok_s", "ctx_s", "per_request_s",
                                                 "step_overhead_s"}))
    raw["drafter"] = dr
    hy = raw.get("hybrid")
    if isinstance(hy, dict):
        hy = {key: v for key, v in hy.items() if v is not None}
        h_entry = hy.get("profile_entry", "das")
        h = entries.get(h_entry)
        if not isinstance(h, dict) or not (h.get("per_request_s") or h.get("step_overhead_s")):
            raise ScenarioError(f"{where}hybrid.profile_entry: {path}: drafters.{h_entry}: not a history proposer's "
                                f"entry with its host time; it prices {sorted(entries)}")
        clash = [f for f in ("per_request_s", "step_overhead_s") if f in hy]
        if clash:
            raise ScenarioError(f"{where}hybrid.{clash[0]}: got {hy[clash[0]]!r}; allowed: null with hardware_profile "
                                f"({name} gives it)")
        raw["hybrid"] = {**hy, "per_request_s": float(h.get("per_request_s") or 0.0),
                         "step_overhead_s": float(h.get("step_overhead_s") or 0.0)}
    return raw


def resolve_scenario_path(path: str, relative_to: Path | None = None) -> Path:
    """A scenario path; bare names (`nvidia_qwen3_8b_rlzero.yaml`, with or without .yaml,
    `predictions/s1_nvidia_rlthink_k3`, `configs/sim/cpu_tiny.yaml`) are looked up next to
    `relative_to`, then in the bundled configs/sim/ and configs/ (resources.py)."""
    if not isinstance(path, str) or not path.strip() or "\0" in path:
        raise ScenarioError(f"scenario file {_short(path)!r}: allowed: a path or the name of a bundled scenario")
    p = Path(path)
    tries = [p]
    if relative_to is not None:
        tries.append(relative_to / p)
    tries += config_lookups(p, "sim")
    if p.suffix not in (".yaml", ".yml"):
        tries += [t.with_name(t.name + ".yaml") for t in list(tries) if t.name]
    for t in tries:
        if _is(t, "file"):
            return t
    if _is(p, "dir"):
        raise ScenarioError(f"scenario file {path!r} is a directory; allowed: a scenario file (simulate --all DIR "
                            "simulates every *.yaml of a directory)")
    raise ScenarioError(f"scenario file {_short(path)!r} not found (looked in ., {SIM_CONFIGS})")


def scenario_files(directory: str) -> list[Path]:
    """The `*.yaml` scenarios of a folder (`simulate --all`); a folder not found from the working
    directory (`configs/sim/predictions`, `predictions`) is looked up in the bundled configs/."""
    if "\0" not in directory:
        for d in [Path(directory), *config_lookups(directory, "sim")]:
            if _is(d, "dir"):
                try:
                    files = sorted(f for f in d.glob("*.yaml") if _is(f, "file"))
                except OSError as e:
                    raise ScenarioError(f"--all {directory!r}: cannot list the directory ({e.strerror})") from None
                if files:
                    return files
                break
    raise ScenarioError(f"--all {_short(directory)!r}: not a directory with *.yaml scenarios (looked in ., "
                        f"{SIM_CONFIGS})")


def _load_tree(path: Path, seen: tuple[Path, ...] = ()):
    from omegaconf.errors import OmegaConfBaseException

    if path.resolve() in seen:
        raise ScenarioError(f"{path}: `extends` forms a cycle ({' -> '.join(str(s) for s in seen)})")
    cfg = yaml_loader.read(path, ScenarioError, what="scenario")
    if "extends" not in cfg:
        return cfg
    try:
        parent = cfg.pop("extends")
    except OmegaConfBaseException as e:
        raise ScenarioError(f"{path}: extends: {_one_line(e)}; allowed: a scenario file name") from None
    if parent is None:
        return cfg
    if not isinstance(parent, str):
        raise ScenarioError(f"{path}: extends: got {_short(parent)!r}; allowed: a scenario file name (looked up next "
                            "to the file, then in configs/sim/)")
    base = _load_tree(resolve_scenario_path(parent, path.parent), seen + (path.resolve(),))
    return yaml_loader.merge(base, cfg, path, ScenarioError, parent=f"the scenario it extends ({parent})")


def load_scenario(path: str, overrides: list[str] | tuple[str, ...] = ()) -> Scenario:
    """Load a scenario YAML (and what it `extends`), apply overrides, resolve (yaml_loader.py), validate.
    Every error is a ScenarioError naming the file."""
    p = resolve_scenario_path(path)
    try:
        cfg = yaml_loader.apply_overrides(_load_tree(p), overrides, p, ScenarioError,
                                          example="speculation.num_speculative_tokens=4")
        raw = yaml_loader.resolve(cfg, p, ScenarioError)
    except RecursionError:
        raise ScenarioError(f"{p}: nested too deeply to read (mappings, lists or `extends` hundreds of levels "
                            "deep); allowed: a scenario as in configs/sim/") from None
    return validate_scenario(raw, p)
