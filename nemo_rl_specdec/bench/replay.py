"""List drafters replayed on one recorded text (the ``replay_*`` figures of ``bench --suite das``).

At T > 0 every engine samples its own text, so engine rows compare drafters on different texts.
Here each drafter proposes on the same text: batches of rollouts a no-spec engine generated, fed
as a vLLM model runner feeds its proposer (every running request once per target forward, its
verified tokens in ``token_ids_cpu``), with every draft verified against the recorded tokens.
For a deterministic draft, accepting a drafted token iff the recorded sample equals it has the
acceptance distribution of vLLM's rejection sampler, so tokens per target forward are measured
without the sampling noise between engines, and without any step time: what the per-step rules
(``auto_disable``, ``budget: adaptive``) would withhold is verified here too.

Drafters: our custom_class proposers (DAS; n-gram with ``ngram.backend: specdec``) and vLLM's own
``suffix`` and ``ngram`` proposers, each built from the speculative block its engine gets. DAS gets
each batch's rollouts after the batch (``specdec_rebuild``, version = batch index + 1), as
``refresh.mode: rebuild`` does; the others keep their own state, as in an engine. A
`ReplayDrafter` takes the place of the block's proposer where the drafts come from elsewhere
(`bench/hybrid.py`: a model drafter's drafts replayed from the recorded text), and `BesideReplay`
drives the proposer the engine runs beside a model drafter (the hybrid's `HybridProposer`) with
the model's drafts read from a table.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from nemo_rl_specdec.config.run import SpecDecConfig, to_vllm_speculative_config, validate_spec_block
from nemo_rl_specdec.cost.trace import HYBRID, Trace, TraceStep
from nemo_rl_specdec.drafters.roles import RolloutStore


class _Batch:
    """The fields of vLLM's InputBatch that the proposers read."""

    def __init__(self, req_ids: list, n: list, prompt_lens: list, width: int):
        self.req_ids = req_ids
        self.req_id_to_index = {r: i for i, r in enumerate(req_ids)}
        self.num_tokens_no_spec = np.asarray(n, dtype=np.int32)
        self.num_prompt_tokens = np.asarray(prompt_lens, dtype=np.int32)
        self.token_ids_cpu = np.zeros((len(req_ids), width), dtype=np.int32)


def _vllm_config(spec: SpecDecConfig, max_model_len: int, max_num_seqs: int, temperature: float):
    sc = to_vllm_speculative_config(spec, temperature)
    return SimpleNamespace(speculative_config=SimpleNamespace(**{"prompt_lookup_min": None, "prompt_lookup_max": None,
                                                                 **sc}),
                           model_config=SimpleNamespace(max_model_len=max_model_len),
                           scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
                           parallel_config=SimpleNamespace(tensor_parallel_size=1))


def _suffix(vc, k: int):
    from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

    p = SuffixDecodingProposer(vc)
    return lambda batch, sampled, requests: p.propose(k, batch, sampled)


def _ngram(vc, k: int):
    from vllm.v1.spec_decode.ngram_proposer import NgramProposer

    p = NgramProposer(vc)
    # its numba kernel compiles at the first call with a request to look up (vLLM's own warm-up call has none):
    # compile it here, off the replay's clock, as an engine's warm-up generate does
    warm = _Batch(["warm-up"], [4], [2], 8)
    p.propose(k, [[0]], warm.num_tokens_no_spec, warm.token_ids_cpu)
    return lambda batch, sampled, requests: [list(d) for d in p.propose(k, sampled, batch.num_tokens_no_spec,
                                                                         batch.token_ids_cpu)]


# vLLM's own list proposers by speculative_config.method, called as its model runner calls them
_VLLM_PROPOSERS = {"suffix": _suffix, "ngram": _ngram}


def make_proposer(spec: SpecDecConfig, max_model_len: int, max_num_seqs: int = 1024, temperature: float = 1.0,
                  step_cost=None, attached: Callable[[Any], None] | None = None):
    """(propose(batch, sampled) -> drafts, after_batch(rollouts, version)) for a list drafter's block.

    Without `step_cost` every draft is verified (there is no step time to judge by: `auto_disable`
    off, `scheduling.budget: uniform`). With one (`cost/price.py` `PricedStepCost`), our proposers keep
    the block's per-step rules and decide on its costs. `attached(proposer)`: called with our
    custom_class proposer once it is attached (a diagnosis reading its lookups); not for vLLM's own."""
    vc = _vllm_config(spec, max_model_len, max_num_seqs, temperature)
    method, k = vc.speculative_config.method, spec.num_speculative_tokens
    if method == "custom_class":
        import importlib

        mod, _, name = vc.speculative_config.model.rpartition(".")
        p = getattr(importlib.import_module(mod), name)(vc)
        runner = SimpleNamespace(input_batch=None, requests={})
        block = spec.model_dump(mode="json")
        if step_cost is None:
            block["auto_disable"] = False
            block["scheduling"] = {**block["scheduling"], "budget": "uniform"}
        p.specdec_attach(runner, validate_spec_block(block))
        if step_cost is not None:
            p.judge.fit = step_cost
        if attached is not None:
            attached(p)

        def propose(batch: _Batch, sampled: list, requests: dict) -> list:
            runner.input_batch, runner.requests = batch, requests
            return p.propose(sampled, batch.num_tokens_no_spec, batch.token_ids_cpu)

        def after_batch(rollouts: list, version: int) -> None:
            runner.input_batch, runner.requests = _Batch([], [], [], 1), {}
            p.propose([], np.zeros(0, dtype=np.int32), np.zeros((0, 1), dtype=np.int32))  # requests finished
            if isinstance(p, RolloutStore) and spec.refresh.mode == "rebuild":
                p.specdec_rebuild(rollouts, version)

        return propose, after_batch
    if step_cost is not None:
        raise ValueError(f"replay: drafter {spec.drafter!r} runs as vLLM's own {method!r} proposer, which has no "
                         "per-step rule to price; allowed with a step cost: our proposers (suffix.backend: das, "
                         "ngram.backend: specdec)")
    build = _VLLM_PROPOSERS.get(method)
    if build is None:
        raise ValueError(f"replay: drafter {spec.drafter!r} ({method}) is not a list drafter; allowed: those vLLM "
                         f"runs as {sorted(_VLLM_PROPOSERS)} or as our custom_class (a model drafter's drafts need "
                         "the model)")
    propose = build(vc, k)

    def after_batch(rollouts: list, version: int) -> None:
        propose(_Batch([], [], [], 1), [], {})  # requests finished: vLLM's suffix cache stops them

    return propose, after_batch


@dataclass
class ReplayDrafter:
    """A drafter the replay drives in place of the block's proposer: `propose(batch, sampled,
    requests) -> drafts` and `after_batch(rollouts, version)` as `make_proposer`'s, the trace's
    `kind` (and `parts`, for a hybrid), and for a hybrid `model_forwards()`: the model part's draft
    forwards in the step just proposed. The proposer's thread time is recorded for list and hybrid
    traces (a model drafter's is its forwards, priced from the profile)."""

    propose: Callable
    after_batch: Callable
    kind: str = "list"
    parts: dict | None = None
    model_forwards: Callable[[], int] | None = None


class BesideReplay:
    """The proposer a drafter runs beside the engine's model drafter (`VllmMapping.engine_proposer`:
    the hybrid's `HybridProposer`), the very class the engine's worker attaches, fed replayed steps
    as `engine/vllm_compat.py` `draft_beside` feeds it: at every step `propose(call_model,
    scheduler_output, verified, counts)`, where `call_model()` gives the model part's drafts at the
    `num_spec_tokens_to_schedule` the proposer set (none at 0). The model does not run here: its
    drafts come from `model_drafts(batch)`, one list per row (recorded from an engine, or
    teacher-forced). `cost`: the proposer's step costs in place of the engine's online fit
    (`cost/price.py` `PricedHybridCost`); `proposer_class`: a subclass of the engine's proposer
    built in its place (`bench/hybrid.py`'s hindsight oracle). Every refresh that is not frozen
    rebuilds its history half from the batch's rollouts, as the engine's update does."""

    def __init__(self, spec: SpecDecConfig, max_model_len: int, model_drafts: Callable[[Any], list], *, cost=None,
                 max_num_seqs: int = 1024, temperature: float = 1.0, proposer_class: type | None = None):
        from nemo_rl_specdec.drafters.registry import drafter
        from nemo_rl_specdec.drafters.roles import VllmMapping

        self.k = spec.num_speculative_tokens
        self.runner = SimpleNamespace(vllm_config=_vllm_config(spec, max_model_len, max_num_seqs, temperature),
                                      input_batch=_Batch([], [], [], 1), requests={})
        block = validate_spec_block(spec.model_dump(mode="json"))
        p = drafter(spec, VllmMapping).engine_proposer(self.runner, block)
        if p is None:
            raise ValueError(f"replay: drafter {spec.drafter!r} runs no proposer beside its model; allowed: a drafter "
                             "whose engine_proposer is one (hybrid)")
        if proposer_class is not None:
            if not issubclass(proposer_class, type(p)):
                raise ValueError(f"replay: proposer_class {proposer_class.__name__} is not a {type(p).__name__}")
            p = proposer_class(self.runner, block)
        if cost is not None:
            p.cost = cost
        self.proposer, self.model_drafts, self.rebuilds = p, model_drafts, spec.refresh.mode != "frozen"

    def propose(self, batch: Any, sampled: list, requests: dict) -> list:
        self.runner.input_batch, self.runner.requests = batch, requests
        sched = SimpleNamespace(num_spec_tokens_to_schedule=self.k)

        def call_model() -> list:
            k = sched.num_spec_tokens_to_schedule
            return [list(d)[:k] for d in self.model_drafts(batch)] if k else [[] for _ in batch.req_ids]

        return self.proposer.propose(call_model, sched, sampled, batch.num_tokens_no_spec)

    def after_batch(self, rollouts: list, version: int) -> None:
        if self.rebuilds:
            self.proposer.history.specdec_rebuild(rollouts, version)

    def drafter(self, kind: str, parts: dict | None = None) -> ReplayDrafter:
        """As `replay` drives it: a trace of `kind` (`hybrid`, with its `parts`' profile entries; `model`
        for a model drafter alone under the rule), the model part's forwards counted per step."""
        return ReplayDrafter(self.propose, self.after_batch, kind, parts, lambda: self.proposer.last_forwards)


def _field(r: Any, name: str):
    return r[name] if isinstance(r, dict) else getattr(r, name)


def replay(spec: SpecDecConfig, batches: Sequence[Sequence[Any]], max_model_len: int,
           temperature: float = 1.0, *, max_num_seqs: int | None = None, step_cost=None,
           label: str | None = None, drafter: ReplayDrafter | None = None) -> list[dict]:
    """Per batch: generated tokens, target forwards (the prefill's included, as in ``metrics.py``),
    drafts, draft tokens and accepted tokens of ``spec``'s drafter on the recorded rollouts
    (objects or dicts with ``problem_id``, ``prompt_token_ids``, ``token_ids``), and ``trace``: the
    batch's steps as a `Trace` (`cost/trace.py`, drafter named `label`), with the proposer's thread time
    per step. At most ``max_num_seqs`` requests decode at once (the rest wait, in order, as vLLM's
    scheduler admits them); their prefill is one step of its own as they enter."""
    cap = max(len(b) for b in batches)
    if drafter is None:
        propose, after_batch = make_proposer(spec, max_model_len, max_num_seqs or cap, temperature, step_cost)
        drafter = ReplayDrafter(propose, after_batch)
    propose, after_batch, kind = drafter.propose, drafter.after_batch, drafter.kind
    k = spec.num_speculative_tokens
    out = []
    for v, rollouts in enumerate(batches):
        recs = [(f"replay-{v}-{i}", _field(r, "problem_id"), list(_field(r, "prompt_token_ids")),
                 list(_field(r, "token_ids"))) for i, r in enumerate(rollouts)]
        text = {rid: np.asarray(p + t, dtype=np.int32) for rid, _, p, t in recs}
        plen = {rid: len(p) for rid, _, p, _ in recs}
        end = {rid: len(p) + len(t) for rid, _, p, t in recs}
        requests = {rid: SimpleNamespace(prompt_token_ids=p, sampling_params=SimpleNamespace(
            extra_args={} if pid is None else {"problem_id": pid})) for rid, pid, p, _ in recs}
        number = {rid: i for i, (rid, *_) in enumerate(recs)}   # a request's id in the trace
        n = {rid: plen[rid] + 1 for rid in text}  # the prefill forward sampled the first token
        sampled = {rid: [int(text[rid][n[rid] - 1])] for rid in text}
        row = {"generated_tokens": sum(len(t) for *_, t in recs), "target_forwards": len(recs), "drafts": 0,
               "draft_tokens": 0, "accepted_tokens": 0, "accepted_draft_tokens": 0}
        waiting = [rid for rid in text]
        active: list = []
        steps: list = []
        width = max(end.values()) + k + 1
        limit = max_num_seqs or len(waiting)
        while active or waiting:
            entering = []
            while waiting and len(active) + len(entering) < limit:
                entering.append(waiting.pop(0))
            if entering:   # their prefill samples each one's first token
                steps.append(TraceStep([], [], [], [], sum(plen[r] for r in entering), None, len(entering)))
                active += [r for r in entering if n[r] < end[r]]
                if not active:
                    continue
            batch = _Batch(active, [n[r] for r in active], [plen[r] for r in active], width)
            for i, rid in enumerate(active):
                batch.token_ids_cpu[i, :n[rid]] = text[rid][:n[rid]]
            cpu0 = time.thread_time()
            drafts = propose(batch, [sampled[r] for r in active], requests)
            proposer_s = time.thread_time() - cpu0
            # a request's context is what its KV cache holds: every token but the one it just sampled
            step = TraceStep([number[r] for r in active], [n[r] - 1 for r in active], [], [], 0,
                             proposer_s if kind in ("list", HYBRID) else None, 0,
                             drafter.model_forwards() if drafter.model_forwards is not None else 0)
            still = []
            for rid, d in zip(active, drafts, strict=True):
                d = list(d)[:k]
                t, m = text[rid], n[rid]
                a = 0
                while a < len(d) and m + a < end[rid] and d[a] == t[m + a]:
                    a += 1
                made = min(a + 1, end[rid] - m)  # the tokens past the response's end are never sampled
                sampled[rid] = [int(x) for x in t[m:m + made]]
                n[rid] = m + made
                step.drafts.append(len(d))
                step.accepted.append(made - 1)
                row["target_forwards"] += 1
                row["drafts"] += bool(d)
                row["draft_tokens"] += len(d)
                row["accepted_tokens"] += made - 1
                row["accepted_draft_tokens"] += a
                if n[rid] < end[rid]:
                    still.append(rid)
            steps.append(step)
            active = still
        after_batch([{"problem_id": pid, "prompt_token_ids": p, "token_ids": t, "policy_version": v}
                     for _, pid, p, t in recs], v + 1)
        row["tokens_per_target_forward"] = row["generated_tokens"] / row["target_forwards"]
        row["trace"] = Trace(kind, k, steps, label or spec.drafter, "replay",
                             {"version": v, "requests": len(recs), "max_num_seqs": max_num_seqs}, drafter.parts)
        out.append(row)
    return out
