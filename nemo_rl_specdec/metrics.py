"""Speculative-decoding metrics: counter deltas from vLLM, acceptance figures, aggregation.

Definitions (per generate call, or summed over calls):
- drafts: verification steps that carried at least one draft token (vLLM's num_drafts);
- acceptance_rate = accepted_tokens / draft_tokens;
- acceptance_length = tokens per target forward = generated / (generated - accepted): each
  request-forward yields one target token plus the drafts it accepted, so this counts steps
  without drafts too (short requests under a length-aware budget), unlike vLLM's
  1 + accepted / drafts, which we report as `accepted_per_draft_step`. A request whose last
  forward accepted drafts up to its final token yields no bonus token there, but vLLM counts
  those drafts as accepted, so that forward is not counted: with short responses drafted to
  their end this overstates the figure (one forward per such request; bench/replay.py counts
  forwards exactly);
- accepted_per_position[i]: drafts whose i-th token was accepted, over drafts.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def read_counters(metrics: Iterable) -> dict:
    """vLLM `LLM.get_metrics()` -> {"drafts", "draft_tokens", "accepted_tokens", "per_pos"}."""
    out: dict[str, Any] = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "per_pos": []}
    for m in metrics:
        if m.name in COUNTERS:
            out[COUNTERS[m.name]] += int(m.value)
        elif m.name == PER_POS:
            vals = list(m.values)
            cur = out["per_pos"]
            out["per_pos"] = [a + b for a, b in zip(cur + [0] * (len(vals) - len(cur)), vals, strict=False)]
    return out


_OWN = {"counter_spec_decode_num_drafts": "drafts", "counter_spec_decode_num_draft_tokens": "draft_tokens",
        "counter_spec_decode_num_accepted_tokens": "accepted_tokens"}


def _child_total(child) -> int:
    return int(sum(s.value for m in child.collect() for s in m.samples if s.name.endswith("_total")))


def engine_counters(llm) -> dict | None:
    """This engine's own spec-decode counters, read from its own Prometheus stat logger.

    `LLM.get_metrics()` reads the process-global registry, and every new vLLM engine's
    PrometheusStatLogger unregisters the previous one's collectors: with several engines in one
    process it returns the most recently created engine's counts. None when the logger is not
    found (then fall back to `read_counters(llm.get_metrics())`)."""
    mgr = getattr(getattr(llm, "llm_engine", None), "logger_manager", None)
    for lg in getattr(mgr, "stat_loggers", None) or []:
        sd = getattr(lg, "spec_decoding_prom", None)
        if sd is None:
            continue
        out: dict[str, Any] = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0, "per_pos": []}
        if not getattr(sd, "spec_decoding_enabled", False):
            return out
        for attr, key in _OWN.items():
            out[key] = sum(_child_total(c) for c in getattr(sd, attr).values())
        for children in sd.counter_spec_decode_num_accepted_tokens_per_pos.values():
            vals = [_child_total(c) for c in children]
            cur = out["per_pos"]
            out["per_pos"] = [a + b for a, b in zip(cur + [0] * (len(vals) - len(cur)), vals, strict=False)]
        return out
    return None


@dataclass
class SpecMetrics:
    generated_tokens: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position_counts: list = field(default_factory=list)
    seconds: float = 0.0

    @classmethod
    def delta(cls, before: dict, after: dict, generated_tokens: int, seconds: float) -> SpecMetrics:
        n = max(len(before["per_pos"]), len(after["per_pos"]))
        b = before["per_pos"] + [0] * (n - len(before["per_pos"]))
        a = after["per_pos"] + [0] * (n - len(after["per_pos"]))
        return cls(generated_tokens=generated_tokens,
                   drafts=after["drafts"] - before["drafts"],
                   draft_tokens=after["draft_tokens"] - before["draft_tokens"],
                   accepted_tokens=after["accepted_tokens"] - before["accepted_tokens"],
                   accepted_per_position_counts=[y - x for x, y in zip(b, a, strict=True)],
                   seconds=seconds)

    def __add__(self, other: SpecMetrics) -> SpecMetrics:
        n = max(len(self.accepted_per_position_counts), len(other.accepted_per_position_counts))
        pa = self.accepted_per_position_counts + [0] * (n - len(self.accepted_per_position_counts))
        pb = other.accepted_per_position_counts + [0] * (n - len(other.accepted_per_position_counts))
        return SpecMetrics(self.generated_tokens + other.generated_tokens, self.drafts + other.drafts,
                           self.draft_tokens + other.draft_tokens, self.accepted_tokens + other.accepted_tokens,
                           [x + y for x, y in zip(pa, pb, strict=True)], self.seconds + other.seconds)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def acceptance_length(self) -> float:
        forwards = self.generated_tokens - self.accepted_tokens
        return self.generated_tokens / forwards if forwards > 0 else (1.0 if self.generated_tokens == 0 else 0.0)

    @property
    def accepted_per_draft_step(self) -> float:
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else 1.0

    @property
    def accepted_per_position(self) -> list:
        return [c / self.drafts for c in self.accepted_per_position_counts] if self.drafts else []

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def us_per_token(self) -> float:
        return 1e6 * self.seconds / self.generated_tokens if self.generated_tokens else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(acceptance_rate=self.acceptance_rate, acceptance_length=self.acceptance_length,
                 accepted_per_draft_step=self.accepted_per_draft_step,
                 accepted_per_position=self.accepted_per_position,
                 tokens_per_s=self.tokens_per_s, us_per_token=self.us_per_token)
        return d


def ratio(baseline_s: float, spec_s: float) -> float | None:
    """Wall-clock speedup: baseline time / speculative time on the same prompts and weights."""
    return baseline_s / spec_s if spec_s > 0 else None
