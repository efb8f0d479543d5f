"""The work the simulator runs: the `cluster` of engines, the rollout `workload` (prompts, response
lengths, what the length predictor has seen) and the `rl` step around it."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from nemo_rl_specdec.config.schema import PathError, short
from nemo_rl_specdec.cost.schema import (
    FLOP_RATE,
    MAX_FLOPS_PER_TOKEN,
    MAX_LIST,
    MAX_STEP_COST_S,
    MAX_TOKENS,
    _Strict,
    _unit,
)
from nemo_rl_specdec.sim.scenario.limits import (
    MAX_ENGINES,
    MAX_GENERATIONS,
    MAX_HISTORY,
    MAX_PHASE_S,
    MAX_POLICY_LAG,
    MAX_PROMPTS,
    MAX_SIGMA,
    MAX_STEPS,
    MAX_TRAINING_GPUS,
)


class Cluster(_Strict):
    num_engines: int = Field(1, ge=1, le=MAX_ENGINES, description="data-parallel generation engines")


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
            raise PathError("min_len", self.min_len, f"<= max_len={self.max_len}")
        for key in ("values", "groups"):
            if getattr(self, key) is not None and self.dist != key:
                raise PathError(key, short(getattr(self, key)),
                                 f"null unless dist is '{key}' (dist is {self.dist!r}; it would be ignored)")
        if self.dist == "values" and not self.values:
            raise PathError("values", self.values, "a non-empty list of lengths with dist 'values'")
        if self.dist == "groups" and (not self.groups or any(not g for g in self.groups)):
            raise PathError("groups", short(self.groups),
                             "a non-empty list of non-empty groups with dist 'groups'")
        measured = (self.values or []) + [x for g in (self.groups or []) for x in g]
        if len(measured) > MAX_LIST:
            raise PathError(self.dist, f"{len(measured):,} lengths", f"at most {MAX_LIST:,}")
        for v in measured:
            if not 1 <= v <= MAX_TOKENS:
                raise PathError(self.dist, v,
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
            raise PathError("training_flops_per_s", self.training_flops_per_s,
                             f"0 (not given) or a number from {FLOP_RATE[0]:g} to {FLOP_RATE[1]:g} (FLOP/s)")
        if self.colocated and self.mode == "async":
            raise PathError("colocated", True, "false in async mode (generation and training overlap)")
        if self.colocated and self.training_gpus is not None:
            raise PathError("training_gpus", self.training_gpus, "null when colocated (the generation GPUs train)")
        for ph in ("logprob", "train"):
            if getattr(self, ph).flops_per_token and not self.training_flops_per_s:
                raise PathError("training_flops_per_s", 0.0, f"> 0 when rl.{ph}.flops_per_token is given")
        return self

    @property
    def lag(self) -> int:
        return 0 if self.mode == "sync" else self.max_policy_lag
