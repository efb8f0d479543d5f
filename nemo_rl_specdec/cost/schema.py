"""The schema of a GPU's step cost: the target's and a draft's shapes (`ModelSpec`), the engine's
hardware (`Hardware`: the roofline, or the linear form), and a drafter's costs (`DraftCost`).

Hardware profiles (`cost/profile.py`) and the simulator's scenarios (`sim/scenario/`) are made of
these blocks; an error names the dotted key, what was found and what is allowed (schema.py's
`format_errors`).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import ConfigDict, Field, PrivateAttr, field_validator, model_validator

from nemo_rl_specdec.config.schema import ConfigError, PathError, Strict, short
from nemo_rl_specdec.cost.model import ModelShape, Roofline, vllm_capture_sizes
from nemo_rl_specdec.resources import config_lookups


class CostError(ConfigError):
    """An invalid hardware profile or cost block; the message names the key, the value and what is allowed."""


# The plausible range of every number of a cost block (docs/simulator.md, "Limits"): outside it a
# number is a typo or would make a step's price overflow.
BANDWIDTH_BPS = (1e6, 1e15)       # HBM and tensor-parallel links, bytes/s per GPU
FLOP_RATE = (1e6, 1e18)           # FLOP/s per GPU
MODEL_BYTES = (1e3, 1e15)         # weights (and experts) of a model
GPU_MEMORY_BYTES = (1e6, 1e15)    # memory per GPU
MAX_STEP_COST_S = 3600.0          # any cost of one engine step, per token or per request (seconds)
MIN_STEP_BASE_S = 1e-9            # hardware.c_base_s: a step takes some time
MAX_FLOPS_PER_TOKEN = 1e15
MAX_KV_BYTES_PER_TOKEN = 1e9
MAX_ATTN_FLOPS_PER_CTX = 1e12
MAX_TOKENS = 1_000_000            # prompt and response lengths, tokens
MAX_KV_TOKENS = 10 ** 12
MAX_GPUS_PER_ENGINE = 1024
MAX_NUM_SEQS = 4096               # hardware.max_num_seqs
MAX_CAPTURE_SIZE = 65_536
MAX_LIST = 1_000_000              # measured lengths, samples
MAX_EXPERTS = 65_536


def _unit(unit: str) -> dict:
    return {"json_schema_extra": {"unit": unit}}


class _Strict(Strict):
    """The shared strict base (schema.py: unknown keys are errors, `true` is not a number, "3" is not
    an int, 2.5 is not an int, NaN and infinity are refused). Validators here fill in derived values
    after validation, so assignments are not re-validated."""

    model_config = ConfigDict(validate_assignment=False)


def _tuples(v: Any, size: int, what: str) -> Any:
    """A YAML list of `size`-element lists as a list of tuples (strict mode takes tuples only);
    anything else is left for the type check to refuse."""
    if isinstance(v, list) and all(isinstance(e, (list, tuple)) for e in v):
        for i, e in enumerate(v):
            if len(e) != size:
                raise ValueError(f"entry {i} ({e!r}): each entry is {what}")
        return [tuple(e) for e in v]
    return v


class Experts(_Strict):
    """Mixture-of-experts layers: `num` experts, `active` of them per token, `bytes` for all
    experts of all layers."""

    num: int = Field(ge=1, le=MAX_EXPERTS)
    active: int = Field(ge=1, le=MAX_EXPERTS)
    bytes: float = Field(ge=MODEL_BYTES[0], le=MODEL_BYTES[1], **_unit("bytes"))
    draft_correlation: float = Field(
        0.0, ge=0, le=1, description="routing overlap of a request's consecutive draft tokens (0: independent)")

    @model_validator(mode="after")
    def _check(self):
        if self.active > self.num:
            raise ValueError(f"active={self.active} must be <= num={self.num}")
        return self


class ModelSpec(_Strict):
    """A model's shape as the roofline needs it (see cost/model.py)."""

    name: str = ""
    weight_bytes: float = Field(ge=MODEL_BYTES[0], le=MODEL_BYTES[1], description="bytes every forward reads (MoE: "
                                "all but the experts)", **_unit("bytes"))
    flops_per_token: float = Field(ge=1e3, le=MAX_FLOPS_PER_TOKEN, description="2 x active parameters")
    kv_bytes_per_token: float = Field(0.0, ge=0, le=MAX_KV_BYTES_PER_TOKEN, description="KV cache bytes per context "
                                      "token", **_unit("bytes"))
    attn_flops_per_ctx: float = Field(0.0, ge=0, le=MAX_ATTN_FLOPS_PER_CTX,
                                      description="attention FLOPs per (query token, context token)")
    num_layers: int = Field(0, ge=0, le=10_000)
    hidden_size: int = Field(0, ge=0, le=1_000_000)
    activation_bytes: int = Field(2, ge=1, le=8)
    experts: Experts | None = None

    def shape(self) -> ModelShape:
        e = self.experts
        return ModelShape(self.weight_bytes, self.flops_per_token, self.kv_bytes_per_token, self.attn_flops_per_ctx,
                          self.num_layers, self.hidden_size, self.activation_bytes,
                          e.num if e else 0, e.active if e else 0, e.bytes if e else 0.0,
                          e.draft_correlation if e else 0.0)


class RooflineSpec(_Strict):
    """Per-GPU effective bandwidth and FLOP rate (data sheet x achievable share), the fixed
    overhead of a forward, the CUDA-graph capture sizes and the tensor-parallel link; or
    `measured`: the first five fitted on timed forwards (`nemo_rl_specdec/tools/time_forward.py`, cost/fit.py)."""

    measured: str | None = Field(
        None, description="a time_forward samples JSON (a path, or a name below configs/sim/): mem_bw_Bps, "
                          "flops_per_s, overhead_s, eager_overhead_s and overhead_per_seq_s are fitted on it")
    mem_bw_Bps: float | None = Field(None, ge=BANDWIDTH_BPS[0], le=BANDWIDTH_BPS[1],
                                        description="effective HBM bandwidth per GPU, bytes/s", **_unit("B/s"))
    flops_per_s: float | None = Field(None, ge=FLOP_RATE[0], le=FLOP_RATE[1], description="effective dense FLOP/s "
                                         "per GPU at the model's precision", **_unit("FLOP/s"))
    overhead_s: float | None = Field(None, ge=0, le=MAX_STEP_COST_S, description="fixed time per forward: launch, "
                                        "scheduling, sampling", **_unit("s"))
    capture_sizes: Literal["vllm", "none"] | list[int] = "none"
    max_capture_size: int = Field(512, ge=1, le=MAX_CAPTURE_SIZE, description="the largest vLLM default capture size")
    eager_overhead_s: float | None = Field(None, ge=0, le=MAX_STEP_COST_S, description="extra time of a step past "
                                              "the largest capture size", **_unit("s"))
    overhead_per_seq_s: float | None = Field(None, ge=0, le=MAX_STEP_COST_S, description="time per request in a "
                                                "step", **_unit("s"))
    allreduce_bw_Bps: float | None = Field(None, ge=BANDWIDTH_BPS[0], le=BANDWIDTH_BPS[1],
                                              description="tensor-parallel link bandwidth per GPU", **_unit("B/s"))
    allreduce_latency_s: float = Field(0.0, ge=0, le=MAX_STEP_COST_S, description="latency of one all-reduce",
                                       **_unit("s"))
    _fit: dict | None = PrivateAttr(None)

    @property
    def fit(self) -> dict | None:
        """The fit of `measured` (constants, residuals), None for data-sheet constants."""
        return self._fit

    @field_validator("capture_sizes")
    @classmethod
    def _sizes(cls, v):
        if isinstance(v, list) and (not v or len(v) > MAX_CAPTURE_SIZE
                                    or any(not 1 <= x <= MAX_CAPTURE_SIZE for x in v)):
            raise ValueError(f"'vllm', 'none' or a non-empty list of batch sizes from 1 to {MAX_CAPTURE_SIZE:,}")
        return v

    @model_validator(mode="after")
    def _constants(self):
        from nemo_rl_specdec.cost.fit import ROOFLINE_FITTED, roofline_from_file

        if self.measured is None:
            for key in ("mem_bw_Bps", "flops_per_s"):
                if getattr(self, key) is None:
                    raise PathError(key, None, "a positive number (or roofline.measured)")
            for key in ROOFLINE_FITTED:
                if getattr(self, key) is None:
                    setattr(self, key, 0.0)
            return self
        for key in ROOFLINE_FITTED:
            if getattr(self, key) is not None:
                raise PathError(key, getattr(self, key),
                                 "null with roofline.measured (it is fitted on the measured samples)")
        path = next((p for p in [Path(self.measured), *config_lookups(self.measured, "sim")] if p.is_file()), None)
        if path is None:
            raise PathError("measured", self.measured,
                             "a time_forward samples JSON: a path, or a name below configs/sim/")
        try:
            self._fit = roofline_from_file(str(path))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError, ArithmeticError,
                RecursionError) as e:
            why = e if isinstance(e, (OSError, ValueError)) else f"{type(e).__name__}: {e}"
            raise PathError("measured", self.measured,
                             f"samples the roofline can be fitted on ({short(why, 200)})") from None
        for key in ROOFLINE_FITTED:
            setattr(self, key, self._fit[key])
        for key, (lo, hi) in (("mem_bw_Bps", BANDWIDTH_BPS), ("flops_per_s", FLOP_RATE),
                              *((k, (0.0, MAX_STEP_COST_S)) for k in ROOFLINE_FITTED[2:])):
            v = getattr(self, key)
            if not (isinstance(v, float) and math.isfinite(v) and lo <= v <= hi):
                raise PathError("measured", self.measured,
                                 f"samples whose fitted {key} lies from {lo:g} to {hi:g} (the fit gives {v!r})")
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
    gpus_per_engine: int = Field(1, ge=1, le=MAX_GPUS_PER_ENGINE)
    c_base_s: float | None = Field(None, ge=MIN_STEP_BASE_S, le=MAX_STEP_COST_S,
                                      description="fixed cost of one target forward (s)", **_unit("s"))
    c_tok_s: float | None = Field(None, ge=0, le=MAX_STEP_COST_S, description="cost per token processed in the "
                                     "step (s)", **_unit("s"))
    c_ctx_s: float = Field(0.0, ge=0, le=MAX_STEP_COST_S, description="cost per context token per request per step: "
                           "KV reads (s)", **_unit("s"))
    c_seq_s: float = Field(0.0, ge=0, le=MAX_STEP_COST_S, description="cost per request in the step (scheduling, "
                           "sampling) (s)", **_unit("s"))
    fit_samples: list[tuple[float, float]] | None = Field(
        None, description="[[tokens_in_step, seconds], ...]: c_base_s and c_tok_s fitted by least squares"
    )
    max_num_seqs: int = Field(256, ge=1, le=MAX_NUM_SEQS, description="requests decoded concurrently per engine")
    roofline: RooflineSpec | None = None
    kv_capacity_tokens: int | None = Field(None, ge=1, le=MAX_KV_TOKENS, description="KV cache tokens per engine")
    memory_bytes: float | None = Field(None, ge=GPU_MEMORY_BYTES[0], le=GPU_MEMORY_BYTES[1],
                                          description="memory per GPU (derives kv_capacity_tokens)", **_unit("bytes"))
    memory_utilization: float = Field(0.9, gt=0, le=1, description="vLLM gpu_memory_utilization")

    @field_validator("fit_samples", mode="before")
    @classmethod
    def _pairs(cls, v):
        return _tuples(v, 2, "[tokens_in_step, seconds]")

    @field_validator("fit_samples")
    @classmethod
    def _samples(cls, v):
        if v is not None:
            if not 2 <= len(v) <= MAX_LIST:
                raise ValueError(f"from 2 to {MAX_LIST:,} [tokens_in_step, seconds] pairs")
            for i, (n, t) in enumerate(v):
                if not (0 <= n <= 100 * MAX_TOKENS and 0 < t <= MAX_STEP_COST_S):
                    raise ValueError(f"entry {i} ({n!r}, {t!r}): tokens from 0 to {100 * MAX_TOKENS:,} and seconds "
                                     f"> 0 and <= {MAX_STEP_COST_S:g}")
        return v

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
            from nemo_rl_specdec.cost.fit import fit_cost_model

            try:
                self.c_base_s, self.c_tok_s = fit_cost_model(self.fit_samples, pin=False)
            except ValueError as e:
                raise PathError("fit_samples", self.fit_samples, str(e)) from None
        return self

    def roofline_model(self) -> Roofline | None:
        r = self.roofline
        if r is None:
            return None
        # after validation every fitted or given constant is a number
        return Roofline(cast(float, r.mem_bw_Bps), cast(float, r.flops_per_s), cast(float, r.overhead_s),
                        self.gpus_per_engine, r.allreduce_bw_Bps or math.inf, r.allreduce_latency_s, r.sizes(),
                        cast(float, r.eager_overhead_s), cast(float, r.overhead_per_seq_s))


class DraftCost(_Strict):
    """Drafting cost per step. Model drafters run max(d) sequential forwards per step; block
    drafters (dflash, dspark) one parallel forward over all draft positions; list drafters
    (suffix, ngram) look drafts up on the host, per request, and find one for a share
    `coverage` of request-steps. A drafter forward is priced by the roofline of `model` when
    given, plus `fwd_base_s`."""

    name: str = Field("suffix", description="the drafter; with the simulator, a registered or published one (kind "
                      "implied), or 'custom'")
    kind: Literal["list", "model", "block"] | None = None
    fwd_base_s: float = Field(0.0, ge=0, le=MAX_STEP_COST_S, description="fixed cost of one draft forward",
                              **_unit("s"))
    tok_s: float = Field(0.0, ge=0, le=MAX_STEP_COST_S, description="cost per draft token", **_unit("s"))
    ctx_s: float = Field(0.0, ge=0, le=MAX_STEP_COST_S, description="cost per context token per draft token (drafter "
                         "KV reads)", **_unit("s"))
    per_request_s: float = Field(0.0, ge=0, le=MAX_STEP_COST_S, description="host time per drafting request per step",
                                 **_unit("s"))
    step_overhead_s: float = Field(
        0.0, ge=0, le=MAX_STEP_COST_S, description="fixed cost of a speculative step (rejection sampling; list "
        "drafters: the host sync)", **_unit("s"))
    coverage: float = Field(1.0, gt=0, le=1, description="list drafters: share of request-steps with a match")
    model: ModelSpec | None = Field(None, description="the drafter's shape, for the roofline")

    @model_validator(mode="after")
    def _coverage(self):
        return self.check_coverage()

    def check_coverage(self):
        """Only a list drafter finds a draft for a share of its request-steps (a subclass that fills in
        `kind` checks again)."""
        if self.coverage < 1 and self.kind not in (None, "list"):
            raise PathError("coverage", self.coverage, "1.0 for a model or block drafter (it always drafts)")
        return self
