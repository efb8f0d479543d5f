"""The scenario's `speculation` block: the run config's `speculative_decoding` names for what the
simulator prices, and the keys renamed to them."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from nemo_rl_specdec.config.schema import KByBatchSize, PathError, short
from nemo_rl_specdec.cost.schema import MAX_NUM_SEQS, _Strict
from nemo_rl_specdec.sim.scenario.limits import MAX_BUDGET_INTERVAL, MAX_K


class SpecScheduling(_Strict):
    """`speculation.scheduling`: the run config's `speculative_decoding.scheduling` keys, plus what
    only the simulator prices (`k: per_step`, `medium_k`, `budget_interval_steps`)."""

    placement: Literal["contiguous", "round_robin", "length_aware"] = "contiguous"
    budget: Literal["uniform", "length_aware", "das", "adaptive"] = "uniform"
    # [[batch_lo, batch_hi, k], ...], as the run config's
    k_by_batch_size: KByBatchSize = None
    # auto: k by batch size, the best for each batch size under the cost model (the run config's
    # k: auto, with the model as the oracle); per_step: every d = 0..k priced at every event
    k: Literal["auto", "per_step"] | None = None
    long_fraction: float = Field(0.25, gt=0, le=1)
    short_fraction: float = Field(0.25, ge=0, lt=1)
    medium_k: int | None = Field(None, ge=0, le=MAX_K)
    budget_interval_steps: int = Field(64, ge=1, le=MAX_BUDGET_INTERVAL, description="recompute budgets at least "
                                       "this often")

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
            raise PathError("auto_disable", True, "false with scheduling.budget: adaptive, which "
                             "already drafts nothing where no draft token pays")
        if s.long_fraction + s.short_fraction > 1:
            raise PathError("scheduling.short_fraction", s.short_fraction,
                             f"<= 1 - long_fraction = {1 - s.long_fraction:g} (long_fraction + short_fraction <= 1)")
        if s.medium_k is not None and s.medium_k > k:
            raise PathError("scheduling.medium_k", s.medium_k, f"<= num_speculative_tokens = {k}")
        if s.k is not None and s.k_by_batch_size is not None:
            raise PathError("scheduling.k_by_batch_size", short(s.k_by_batch_size),
                             f"null with scheduling.k: {s.k}, which sets k per batch size itself")
        table = s.k_by_batch_size
        if table is not None:
            if not table or len(table) > MAX_NUM_SEQS:
                raise PathError("scheduling.k_by_batch_size", short(table),
                                 f"1 to {MAX_NUM_SEQS} [batch_lo, batch_hi, k] ranges (or scheduling.k: auto | "
                                 "per_step)")
            for i, (lo, hi, kk) in enumerate(table):
                if hi > 10 ** 9 or kk > k:
                    raise PathError(f"scheduling.k_by_batch_size.{i}", [lo, hi, kk],
                                     f"ranges with batch_hi <= 1e9 and k <= num_speculative_tokens = {k}")
        return self


# Keys of the speculation block renamed to the run config's names: the old key -> the new one.
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
