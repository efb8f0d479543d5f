"""n-gram prompt lookup: the baseline list drafter, nothing to refresh.

`ngram.backend: vllm` is vLLM's own `ngram` method. `ngram.backend: specdec` runs the same
matcher (vLLM's numba kernel, through its `NgramProposer`) as our custom_class proposer
`NgramProposer`, which adds the per-step rule of `drafters/machinery/step_judge.py`: `auto_disable` keeps a
step's drafts only where they are predicted to pay, `scheduling.budget: adaptive` cuts each draft
to its best length. Its acceptance estimates come from an `AcceptanceCalibration` by draft
position (prompt lookup carries no probability), fed from what the target accepted, and from
what it produced where a draft was withheld.
"""
from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, Literal

from pydantic import Field, model_validator

from nemo_rl_specdec.config.schema import PathError
from nemo_rl_specdec.drafters.base import HOST, LIST, Drafter
from nemo_rl_specdec.drafters.machinery.calibration import AcceptanceCalibration, resolve_withheld
from nemo_rl_specdec.drafters.machinery.proposer import SpecdecProposer
from nemo_rl_specdec.drafters.roles import Block, DrafterSettings


class NgramConfig(DrafterSettings):
    backend: Literal["vllm", "specdec"] = "vllm"
    prompt_lookup_min: int = Field(2, ge=1)
    prompt_lookup_max: int = Field(4, ge=1)

    @model_validator(mode="after")
    def _order(self) -> NgramConfig:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise PathError(
                "prompt_lookup_min", self.prompt_lookup_min,
                f"a value <= prompt_lookup_max ({self.prompt_lookup_max})",
            )
        return self


class Ngram(Drafter):
    """What both n-gram backends share: the sub-block."""

    name = "ngram"
    kind = LIST
    draft_cost = HOST
    config = NgramConfig
    variants = (("ngram", ("ngram.backend=vllm",)), ("ngram (judged)", ("ngram.backend=specdec",)))


class VllmNgram(Ngram):
    """`ngram.backend: vllm`: vLLM's own `ngram` method."""

    backend = "vllm"
    cost_entry = "ngram"

    def vllm_config(self, spec: Block, temperature: float) -> dict:
        c = spec.ngram
        return {"method": "ngram", "num_speculative_tokens": spec.num_speculative_tokens,
                "prompt_lookup_min": c.prompt_lookup_min, "prompt_lookup_max": c.prompt_lookup_max}


class SpecdecNgram(Ngram):
    """`ngram.backend: specdec`: the same matcher in our proposer (`NgramProposer`), which cuts each
    step's drafts."""

    backend = "specdec"
    judges_steps = True
    cost_entry = "ngram_specdec"

    def vllm_config(self, spec: Block, temperature: float) -> dict:
        return {"method": "custom_class", "model": f"{__name__}.NgramProposer",
                "num_speculative_tokens": spec.num_speculative_tokens}


class NgramProposer(SpecdecProposer):
    """vLLM custom_class proposer: vLLM's n-gram prompt lookup under the per-step rule (module doc)."""

    metrics_prefix = "ngram"

    def __init__(self, vllm_config: Any):
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        sched = getattr(vllm_config, "scheduler_config", None)
        self.max_num_seqs = int(getattr(sched, "max_num_seqs", 0) or 256)
        self.runner = None
        self.counters = {"calls": 0, "rows": 0, "drafts": 0, "draft_tokens": 0, "withheld_drafts": 0,
                         "propose_s": 0.0, "propose_cpu_s": 0.0}
        self._reqs: dict = {}  # request id -> [tokens of its last proposed draft or None, withheld drafts]
        self.settings: dict | None = None
        self.configure(None)

    def configure(self, spec: dict | None) -> None:
        """Settings from the speculative block (`None`: schema defaults)."""
        c = NgramConfig(**{k: v for k, v in ((spec or {}).get("ngram") or {}).items()})
        old = self.settings or {}
        if (old.get("prompt_lookup_min"), old.get("prompt_lookup_max")) != (c.prompt_lookup_min, c.prompt_lookup_max):
            self.matcher = self._matcher(c)  # built at __init__, and again at attach only if the lookup changed
        self.settings = c.model_dump()
        self.calibration = AcceptanceCalibration(sources=("ngram",), positions=max(self.k, 1))
        self.judge = self.make_judge("n-gram", spec)
        self._reqs.clear()

    def _matcher(self, c: NgramConfig) -> Any:
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer as VllmNgram

        # vLLM's proposer reads only these fields of its config; building it runs a warm-up lookup
        return VllmNgram(SimpleNamespace(
            speculative_config=SimpleNamespace(prompt_lookup_min=c.prompt_lookup_min,
                                               prompt_lookup_max=c.prompt_lookup_max, num_speculative_tokens=self.k),
            model_config=SimpleNamespace(max_model_len=self.max_model_len),
            scheduler_config=SimpleNamespace(max_num_seqs=max(self.max_num_seqs, 1024)),
            parallel_config=SimpleNamespace(tensor_parallel_size=1)))

    def specdec_stats(self) -> dict:
        return {"counters": dict(self.counters), "active_requests": len(self._reqs), "k": self.k,
                "settings": dict(self.settings or {}), "calibration": self.calibration.table(), **self.judge.stats()}

    def acceptance_metrics(self) -> dict:
        """By draft position: `pos<j>`, j = 1 for the first draft token."""
        return {f"pos{j + 1}": r for j, r in enumerate(self.calibration.rates[0])}

    def propose(self, sampled_token_ids: Any, num_tokens_no_spec: Any, token_ids_cpu: Any,
                slot_mappings: Any = None) -> list:
        t0, cpu0 = time.perf_counter(), time.thread_time()
        rows = len(sampled_token_ids)
        c = self.counters
        c["calls"] += 1
        if self.runner is None or self.k <= 0:
            return [[] for _ in range(rows)]
        req_ids = self.runner.input_batch.req_ids
        skipped = self.judge.skip(rows)  # this batch size is off: no lookup (module doc of machinery/step_judge.py)
        drafts = [[] for _ in range(rows)] if skipped else \
            self.matcher.propose(self.k, sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        calib, reqs = self.calibration, self._reqs
        seen, pending = set(), []
        verified = ctx_sum = 0
        new_rows = False  # a request seen for the first time: the step that just ran prefilled it
        for i in range(rows):
            rid = req_ids[i]
            if rid is None:
                drafts[i] = []
                continue
            seen.add(rid)
            st = reqs.get(rid)
            if st is None:
                st = reqs[rid] = [None, []]
                new_rows = True
            sampled = sampled_token_ids[i]
            if not sampled:  # partial prefill chunk: nothing to verify yet
                drafts[i] = []
                continue
            if st[0] is not None:  # this step verified the last draft: accepted = sampled - 1
                calib.record(0, st[0], len(sampled) - 1)
                st[0] = None
            if st[1]:
                st[1] = resolve_withheld(calib, st[1], sampled)
            verified += 1
            ctx_sum += int(num_tokens_no_spec[i])
            if drafts[i]:
                pending.append(i)
        if pending and self.judge.active:
            lengths = [len(drafts[i]) for i in pending]
            gains = calib.rate_matrix([0] * len(pending), [drafts[i] for i in pending], self.k)
            keep = self.judge.choose(gains, lengths, verified, ctx_sum)
            if keep is not None:
                for i, d in zip(pending, keep, strict=True):
                    if d == 0:  # withheld: scored against what the target produces
                        reqs[req_ids[i]][1].append((0, drafts[i], drafts[i], 0))
                        c["withheld_drafts"] += 1
                    drafts[i] = drafts[i][:d]
        drafted = drafted_tokens = 0
        for i in pending:
            if drafts[i]:
                reqs[req_ids[i]][0] = drafts[i]
                drafted += 1
                drafted_tokens += len(drafts[i])
        self.judge.called(t0, verified, verified + drafted_tokens, ctx_sum, prefilled=new_rows, skipped=skipped)
        if len(reqs) > len(seen):  # finished or preempted requests: drop their state
            for rid in [r for r in reqs if r not in seen]:
                del reqs[rid]
        c["rows"] += verified
        c["drafts"] += drafted
        c["draft_tokens"] += drafted_tokens
        c["propose_s"] += time.perf_counter() - t0
        c["propose_cpu_s"] += time.thread_time() - cpu0
        return drafts
