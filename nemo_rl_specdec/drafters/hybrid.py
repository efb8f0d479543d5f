"""The `hybrid` drafter: history drafts (DAS) and a model drafter (eagle3, dflash, draft_model, mtp),
chosen per request and per engine step.

`Hybrid` declares the drafter: its `hybrid:` sub-block names the two parts
(``hybrid: {history: suffix, model: eagle3}``); each part keeps its own sub-block (``suffix:``
with ``backend: das``, ``eagle3: {model: ...}``). vLLM runs the model part as its own method
(the model part's ``speculative_config``, with greedy drafts, and vLLM's synchronous scheduling:
`engine_args`); `HybridProposer`, attached to the model runner by the worker extension, routes
every step's drafting through itself (`engine/vllm_compat.py` `draft_beside`,
which also hands it the step's verified tokens from vLLM's padded batch).

Per engine step, :meth:`HybridProposer.propose`:

- looks up every request's history draft first (host; DAS's `lookup`, not cut), with the
  calibrated acceptance of each of its tokens (DAS's calibration);
- takes the model half's acceptance by draft position, measured on the model drafts this engine
  verified (`ModelAcceptance`);
- takes the step's costs from the engine's step-cost fit (`StepCostFit(draft_forwards=True)`,
  fitted online on the time between calls, with the model's draft forwards as columns of their
  own): t0, c_tok (per verified token, up to the draft tokens the step holds), and the cost of the
  model half's skippable draft forwards for this batch. A cost object set as `cost` in their place
  (`split(requests, ctx_sum, draft_tokens=...)`, and `forward_s(requests, k)`) prices them
  instead;
- decides with `drafters/machinery/hybrid_choice.py` `choose`: history drafts only, or run the
  model half and let each request take the better of its two drafts, drafts cut to what pays;
- runs the model half's draft forwards only when that pays. Where it does not, vLLM's proposer
  still runs its first forward over the step's verified tokens with zero draft tokens (vLLM's own
  k = 0 path): the Eagle/draft-model KV cache and hidden states of those positions are written
  there, and a later step's draft attends to them. What is skipped is the k - 1 sequential draft
  forwards (eagle3, draft_model, mtp) or DFlash's sampling of its block (its one forward is the
  context forward), so DFlash saves least;
- hands vLLM one draft per request, of the length chosen (0 to k), from either half.

The model half can be kept to the rollout's tail (`hybrid.tail_requests`): on a step with more
requests decoding than that, it offers no draft, its draft forwards do not run, and the step is the
history half's, cut by the same choice. Its KV forward (vLLM's k = 0 first forward) still runs
there: an Eagle3 or MTP drafter's KV of a position is computed from the target's hidden states at
that position, which vLLM keeps for the step alone, so a drafter that skipped it could catch up
only by keeping them or by running the target again (docs/drafters.md, "The model half at the tail").

Until the step-cost fit is ready (warm-up), the model half runs at every step but one in
`PROBE_EVERY` (steps with and without its draft forwards are what the fit tells its cost from),
and each request takes the draft with more expected accepted tokens, uncut.

Drafts of both halves are greedy (`draft_sample_method: greedy`): vLLM's rejection sampler takes
one draft distribution per step for the whole batch, and a history draft has none, so a mixed
batch is verified as deterministic drafts, which is exact for greedy model drafts. Outputs are
exactly the policy's (greedy: identical; T > 0: the same distribution).

Refresh (`refresh.mode`, one setting for both halves, the model part's modes): every update that
refreshes the drafter loads the model part's new weights (refit, online) and rebuilds the
history store from the step's rollouts, in the same RPC; a failure in either half fails the
update (`engine/worker_extension.py`).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import Field

from nemo_rl_specdec.config.schema import PathError
from nemo_rl_specdec.drafters.base import MODEL, SEQUENTIAL, Drafter, ModelDrafter
from nemo_rl_specdec.drafters.roles import Block, DrafterSettings, ModelWeights, TeacherForced, TrainerStreams

if TYPE_CHECKING:
    from nemo_rl_specdec.cost.online import HybridStepCost

_HISTORY, _MODEL = "history", "model"  # the sources of `hybrid_choice.HybridChoice`
PROBE_EVERY = 4  # warm-up: one step in this many skips the model's draft forwards (the fit needs both kinds)


class HybridConfig(DrafterSettings):
    """The two parts of `drafter: hybrid`; each part's own settings are in its own sub-block."""

    history: str = Field("suffix", description="the history part: 'suffix' (DAS, suffix.backend: das)")
    model: str = Field("eagle3", description="the model part: eagle3 | dflash | draft_model | mtp (its checkpoint "
                       "and settings come from its own sub-block)")
    model_k: int | None = Field(None, ge=1, description="the model part's draft depth (at most "
                                "num_speculative_tokens, the history part's); null: num_speculative_tokens")
    tail_requests: int | None = Field(None, ge=1, description="the model part drafts only on steps with at most "
                                      "this many requests decoding (the rollout's tail); a step with more is the "
                                      "history part's alone. The model part's KV forward still runs on every step "
                                      "(vLLM's k = 0 first forward). null: on every step, the per-step choice decides")


class Hybrid(Drafter):
    """A hybrid composed of its two parts, as the registry resolves a block's `hybrid:` sub-block
    (`registry.resolve`): the history part (DAS) and the model part. Its weights are the model
    part's: the registry hands the model part to whoever asks for `ModelWeights` or `TeacherForced`."""

    name = "hybrid"
    kind = MODEL
    draft_cost = SEQUENTIAL
    config = HybridConfig
    worker_modules = ("arctic_inference.suffix_decoding",)  # the history part's suffix trees
    # the model-runner path the hybrid drafts through (lists of any length from our proposer beside a
    # model method, the k = 0 KV-only forward) came with vLLM's custom_class; NeMo-RL v0.7.0's vLLM has neither
    needs_vllm_methods = ("custom_class",)
    trainer_stream = "the model part's (hybrid.model) trainer stream"
    refit_hint = "refit needs the trainer to stream the model part's weights (see hybrid.model's drafter)"
    # `online` with no trainer: the model part stays its checkpoint (an update says so), the store rebuilds
    variants = (("hybrid (DAS + eagle3)", ("hybrid.model=eagle3", "num_speculative_tokens=4", "refresh.mode=online",
                                           "suffix.max_match_len=8")),
                # the model half at the rollout's tail only (at most 4 requests decoding: the tail of the das
                # and hybrid bench tables); a batch of more is the history half's alone
                ("hybrid (DAS + eagle3 at the tail)", ("hybrid.model=eagle3", "num_speculative_tokens=4",
                                                       "refresh.mode=online", "suffix.max_match_len=8",
                                                       "hybrid.tail_requests=4")))

    def __init__(self, history: Drafter, model: ModelDrafter):
        """`history`, `model`: the registered drafters the block names (a model drafter as the model part:
        the registry refuses any other; `check` refuses a history part other than DAS)."""
        self.history, self.model = history, model
        self.refresh_modes = model.refresh_modes  # the model part's modes govern both halves
        self.cost_parts = {"history": history.cost_entry, "model": model.cost_entry}

    def as_role(self, role: type) -> Any:
        return self.model if role in (ModelWeights, TeacherForced) else self

    @property
    def described(self) -> str:
        return (f"drafter 'hybrid' (the model part {self.model.name!r}'s modes; every refresh that is not frozen "
                "also rebuilds the history part's store from the step's rollouts)")

    @property
    def cost_entry(self) -> str:
        return self.model.cost_entry

    # ------------------------------------------------------------------ Declared
    def check(self, spec: Block) -> None:
        h, m = self.history, self.model
        if h.name != "suffix":
            why = (f"{h.name!r} is a model drafter: it belongs in hybrid.model" if h.kind == MODEL
                   else "only DAS drafts carry the calibrated acceptance the per-step choice prices")
            raise PathError("hybrid.history", h.name, f"'suffix' (DAS, suffix.backend: das): {why}")
        if h.backend != "das":
            raise PathError("suffix.backend", h.backend, "'das' with drafter 'hybrid': vLLM's own suffix "
                            "proposer cannot run beside a model method in one engine")
        if not m.weights_in_policy_checkpoint and not m.checkpoint(spec):
            raise PathError(f"{m.name}.model", None, f"a checkpoint path: hybrid.model is {m.name!r}, whose "
                            "weights are a checkpoint of its own")
        m.check(spec)
        if spec.hybrid.model_k is not None and spec.hybrid.model_k > spec.num_speculative_tokens:
            raise PathError("hybrid.model_k", spec.hybrid.model_k, f"at most num_speculative_tokens "
                            f"({spec.num_speculative_tokens}), the engine's k, or null")
        if spec.scheduling.k == "auto":
            raise PathError("scheduling.k", "auto", "null with drafter 'hybrid': it decides at every step whether the "
                            "model drafts and how much of each draft is verified (k: auto would re-choose the "
                            "model's k from steps the hybrid shaped)")
        if spec.draft_sample_method == "probabilistic":
            raise PathError("draft_sample_method", "probabilistic", "auto or greedy with drafter 'hybrid': vLLM's "
                            "rejection sampler takes one draft distribution per step, and history drafts have none")

    def check_policy(self, spec: Block, policy_dir: Any) -> None:
        try:
            self.model.check_policy(spec, policy_dir)
        except PathError as e:
            if e.rel_path != "drafter":
                raise
            raise PathError("hybrid.model", self.model.name, e.allowed.replace("a drafter other than",
                                                                                "a model part other than")) from None

    def checkpoint(self, spec: Block) -> str | None:
        return self.model.checkpoint(spec)

    # ------------------------------------------------------------------ VllmMapping: the model part's method, greedy
    def vllm_config(self, spec: Block, temperature: float) -> dict:
        return {**self.model.vllm_config(spec, temperature), "draft_sample_method": "greedy"}

    def draft_sample_method(self, spec: Block, temperature: float) -> str:
        return "greedy"

    def engine_args(self, spec: Block) -> dict:
        # per-request drafts of any length take vLLM's list path, which needs synchronous scheduling
        return {"async_scheduling": False}

    def engine_proposer(self, runner: Any, spec: dict) -> HybridProposer:
        return HybridProposer(runner, spec)

    # ------------------------------------------------------------------ Refreshable: DAS's rollouts
    def rollout_prompt_tail(self, spec: Block) -> int | None:
        return self.history.rollout_prompt_tail(spec)

    # ------------------------------------------------------------------ NemoRLRules: the model part's weights
    def weight_source(self, spec: Block, streams: TrainerStreams) -> str:
        return self.model.weight_source(spec, streams)

    def check_nemo_rl(self, spec: Block, policy: dict) -> None:
        self.model.check_nemo_rl(spec, policy)


class ModelAcceptance:
    """The model half's acceptance by draft position, on the model drafts this engine verified:
    rate j = P(draft token j is accepted) (the marginal, as `step_judge` reads gains), with one
    prior draft accepted at every position where none was verified yet (`prior`)."""

    def __init__(self, k: int, prior: float = 0.5):
        self.k = int(k)
        self.drafted = np.zeros(self.k)
        self.accepted = np.zeros(self.k)
        self.prior = float(prior)

    def record(self, length: int, accepted: int) -> None:
        d = min(int(length), self.k)
        self.drafted[:d] += 1
        self.accepted[:min(int(accepted), d)] += 1

    def rates(self) -> np.ndarray:
        r = (self.accepted + self.prior) / (self.drafted + 1.0)
        return np.minimum.accumulate(r)

    def optimistic(self) -> np.ndarray:
        """The rates the per-step choice weighs: each one standard error above its estimate. A model
        half verified on few drafts (at the tail only, `hybrid.tail_requests`, a few dozen a rollout)
        keeps being tried until its drafts show that it loses, instead of being dropped for good
        after one early miss (nothing it does not draft is measured); with many drafts the bonus
        vanishes and the choice weighs the estimate itself."""
        n = self.drafted + 1.0
        r = (self.accepted + self.prior) / n
        bonus = np.where(self.drafted > 0, np.sqrt(r * (1.0 - r) / n), 0.0)  # the prior alone: as it is
        return np.minimum.accumulate(np.minimum(1.0, r + bonus))


class HybridProposer:
    """The per-step choice between the history half (`history`, a `DASProposer`) and the model half
    (vLLM's proposer of the model part); see the module doc. Built and attached by the worker
    extension, which refreshes, saves and restores the history half itself (`vllm_compat.rollout_store`);
    the model half's weights travel as the model drafter's, and its acceptance by position and the
    step-cost fit are measured again within the first steps of a resumed run."""

    metrics_prefix = "hybrid"

    def __init__(self, runner: Any, spec: dict):
        from nemo_rl_specdec.cost.online import StepCostFit
        from nemo_rl_specdec.drafters.suffix import DASProposer

        self.runner = runner
        self.k = int(runner.vllm_config.speculative_config.num_speculative_tokens)
        part = spec.get("hybrid") or {}
        self.model_k = int(part.get("model_k") or self.k)  # the model half's depth
        # the model half drafts only on steps of at most this many decoding requests (None: every step)
        self.tail_requests = None if part.get("tail_requests") is None else int(part["tail_requests"])
        self.history = DASProposer(runner.vllm_config)
        # the hybrid cuts the history drafts itself: DAS's own per-step rule stays off
        scheduling = {**(spec.get("scheduling") or {}), "budget": "uniform"}
        das_spec = {**spec, "auto_disable": False, "scheduling": scheduling}
        self.history.specdec_attach(runner, das_spec)
        self.model = ModelAcceptance(self.model_k)
        self.cost: HybridStepCost = StepCostFit(draft_forwards=True)
        self._last: tuple | None = None  # (start, requests, verified tokens, ctx_sum, forwards, prefilled)
        self._model_rows: dict = {}  # request id -> length of the model draft proposed for it last step
        self._history_rows: dict = {}  # request id -> length of the history draft proposed for it last step
        self.steps = 0
        # the last call: its host thread time (the lookups and the choice, not the model half's
        # forwards) and the model half's forwards it ran (k, or 1: the KV forward), for engine traces
        self.last_host_s = 0.0
        self.last_forwards = 0
        self.trace: list | None = None  # per step (sources, lengths, run_model) when tracing
        self._window: dict = {}  # the counters at the last policy update
        self.last_window: dict = {}  # their change over the generation between the last two updates
        self.counters = {"steps": 0, "rows": 0, "from_history": 0, "from_model": 0, "from_none": 0,
                         "history_draft_tokens": 0, "history_accepted": 0, "model_draft_tokens": 0,
                         "model_accepted": 0, "model_runs": 0, "model_skipped": 0, "skipped_draft_forwards": 0,
                         "above_tail_steps": 0, "warmup_steps": 0, "model_s": 0.0, "propose_s": 0.0}

    # ------------------------------------------------------------------ costs
    def costs(self, requests: int, ctx_sum: int, k: int, draft_tokens: float,
              model: bool = True) -> tuple[float, float, float] | None:
        """(t0, c_tok, the model half's skippable draft forwards' cost) for this step, or None (warm-up).
        c_tok is the cost's per-token secant up to `draft_tokens`, the drafts the step holds (as DAS's own
        per-step rule asks it: a cost that is not linear, a GPU's roofline, prices a token by how many
        the step verifies). `model=False`: the model half offers no draft this step, its forwards are
        not priced (0)."""
        split = self.cost.split(requests, ctx_sum, draft_tokens=draft_tokens)
        if split is None:
            return None
        t0, c_tok = split
        return t0, c_tok, float(self.cost.forward_s(requests, k)) if model else 0.0

    def _sample(self, start: float, requests: int, verified_tokens: int, ctx_sum: int, forwards: int,
                prefilled: bool) -> None:
        last, self._last = self._last, (start, requests, verified_tokens, ctx_sum, forwards, prefilled)
        if last is not None and not last[5] and not prefilled:
            self.cost.add(last[1], last[2], last[3], start - last[0], forwards=last[4])

    # ------------------------------------------------------------------ the gains the choice weighs
    def history_gains(self, pending: list, decode: list, k: int) -> list:
        """Per decode row: the acceptance probability of each token of its history draft (DAS's
        calibration; an empty row where DAS found none). `pending`: DAS's drafts of the step."""
        gains = self.history.gains(pending)
        at = {p[0]: j for j, p in enumerate(pending)}
        rows = [gains[at[i]] if i in at else np.zeros(0) for i in decode]
        return [r[~np.isnan(r)][:k] for r in rows]

    def model_gains(self, decode: list, k: int) -> list:
        """Per decode row: the acceptance probability of each position of its model draft (measured on
        the model drafts this engine verified, optimistic while they are few; the same for every
        request)."""
        return [self.model.optimistic()[:k]] * len(decode)

    def model_offered(self, requests: int) -> bool:
        """Whether the model half may draft on a step of `requests` decoding requests: at or below
        `hybrid.tail_requests` (every step when it is null)."""
        return self.tail_requests is None or requests <= self.tail_requests

    # ------------------------------------------------------------------ a step
    def propose(self, call_model: Any, scheduler_output: Any, sampled_token_ids: Any,
                num_tokens: Any = None) -> list:
        """One step's drafts (a list per request). `sampled_token_ids`: the tokens each request's last
        step verified; `num_tokens`: each request's tokens with them (default: the input batch's
        `num_tokens_no_spec`); `call_model()` runs vLLM's proposer of the model part as the model
        runner would (it reads `scheduler_output.num_spec_tokens_to_schedule`)."""
        from nemo_rl_specdec.drafters.machinery.hybrid_choice import choose

        t_start, cpu_start = time.perf_counter(), time.thread_time()
        c = self.counters
        batch = self.runner.input_batch
        counts = batch.num_tokens_no_spec if num_tokens is None else num_tokens
        step = self.history.lookup(sampled_token_ids, counts, batch.token_ids_cpu)
        rows = len(sampled_token_ids)
        req_ids = batch.req_ids
        k_step = int(getattr(scheduler_output, "num_spec_tokens_to_schedule", self.k) or 0)  # this batch's k
        k_model = min(k_step, self.model_k)
        # feedback: the model drafts the step just verified
        last_model, self._model_rows = self._model_rows, {}
        last_history, self._history_rows = self._history_rows, {}
        decode = []
        for i in range(rows):
            sampled = sampled_token_ids[i]
            rid = req_ids[i]
            if not sampled or rid is None:
                continue
            decode.append(i)
            d = last_model.get(rid)
            if d:
                acc = min(len(sampled) - 1, d)
                self.model.record(d, acc)
                c["model_accepted"] += acc
            d = last_history.get(rid)
            if d:
                c["history_accepted"] += min(len(sampled) - 1, d)
        if step is None or k_model <= 0 or self.k <= 0:  # nothing to draft: the model still writes its KV
            if step is not None:  # the history drafts are scored against what the target produces
                for entry in step.pending:
                    self.history.withhold(entry)
                step.pending = []
                self.history.emit(step)
            saved = scheduler_output.num_spec_tokens_to_schedule
            scheduler_output.num_spec_tokens_to_schedule = 0
            cpu_model = time.thread_time()
            try:
                call_model()
            finally:
                scheduler_output.num_spec_tokens_to_schedule = saved
            self.last_host_s, self.last_forwards = cpu_model - cpu_start, 1
            return [[] for _ in range(rows)]
        hist_by_row = {p[0]: p for p in step.pending}
        history_rows = self.history_gains(step.pending, decode, k_step)
        offered = self.model_offered(len(decode))
        # above the tail the model half has no draft to offer: the choice is the history half's cut alone
        model_rows = self.model_gains(decode, k_model) if offered else [np.zeros(0)] * len(decode)
        if not offered:
            c["above_tail_steps"] += 1
        ctx_sum = step.ctx_sum
        held = sum(max(len(h), len(m)) for h, m in zip(history_rows, model_rows, strict=True))
        cost = self.costs(len(decode), ctx_sum, k_model, float(held), model=offered)
        self.steps += 1
        if cost is None:  # warm-up: the model runs but one step in PROBE_EVERY; no cuts
            c["warmup_steps"] += 1
            run_model = offered and self.steps % PROBE_EVERY != 0
            sources, lengths = [], []
            for h, m in zip(history_rows, model_rows, strict=True):
                if run_model and float(m.sum()) >= float(h.sum()):
                    sources.append(_MODEL)
                    lengths.append(k_model)
                elif h.size:
                    sources.append(_HISTORY)
                    lengths.append(int(h.size))
                else:
                    sources.append("none")
                    lengths.append(0)
        else:
            t0, c_tok, fwd_s = cost
            ch = choose(history_rows, model_rows, t0, c_tok, fwd_s, requests=len(decode))
            run_model, sources, lengths = ch.run_model, list(ch.source), list(ch.lengths)
        t_model, cpu_model = time.perf_counter(), time.thread_time()
        saved = scheduler_output.num_spec_tokens_to_schedule
        scheduler_output.num_spec_tokens_to_schedule = k_model if run_model else 0
        try:
            drafts = call_model()  # at 0 vLLM's proposer still writes its KV for the verified tokens
        finally:
            scheduler_output.num_spec_tokens_to_schedule = saved
        c["model_s"] += time.perf_counter() - t_model
        cpu_after_model = time.thread_time()
        model_drafts = drafts.tolist() if hasattr(drafts, "tolist") else list(drafts or [])
        out: list = [[] for _ in range(rows)]
        kept = []
        for i, src, d in zip(decode, sources, lengths, strict=True):
            h = hist_by_row.get(i)
            if src == _HISTORY and h is not None and d:
                _, rid, st, tokens, probs, hs = h
                kept.append((i, rid, st, tokens[:d], probs[:d], hs))
                self._history_rows[rid] = d
                c["from_history"] += 1
                c["history_draft_tokens"] += d
                continue
            if h is not None:
                self.history.withhold(h)
            if src == _MODEL and d and run_model:
                out[i] = [int(t) for t in model_drafts[i][:d]]
                self._model_rows[req_ids[i]] = len(out[i])
                c["from_model"] += 1
                c["model_draft_tokens"] += len(out[i])
            else:
                c["from_none"] += 1
        step.pending = kept
        model_tokens = sum(len(r) for r in out)
        history_out = self.history.emit(step, extra_tokens=model_tokens)
        for i, r in enumerate(history_out):
            if r:
                out[i] = list(r)
        c["steps"] += 1
        c["rows"] += len(decode)
        c["model_runs" if run_model else "model_skipped"] += 1
        if not run_model:
            c["skipped_draft_forwards"] += max(0, k_model - 1)
        self._sample(t_start, len(decode), len(decode) + sum(len(r) for r in out), ctx_sum,
                     k_model if run_model else 1, step.new_rows)
        if self.trace is not None:
            self.trace.append((tuple(sources), tuple(lengths), bool(run_model)))
        c["propose_s"] += time.perf_counter() - t_start
        self.last_host_s = (cpu_model - cpu_start) + (time.thread_time() - cpu_after_model)
        self.last_forwards = k_model if run_model else 1
        return out

    def specdec_disable(self, reason: str) -> None:
        """Stop drafting from both halves (on_refresh_error=disable)."""
        self.history.specdec_disable(reason)
        self.k = 0

    # ------------------------------------------------------------------ metrics
    def specdec_new_policy(self, version: int) -> None:
        """A policy update arrived (the worker extension calls this first in every update): what the
        counters did since the previous one is the last training step's generation (`step/*` metrics)."""
        now = {k: v for k, v in self.counters.items()}
        self.last_window = {k: v - self._window.get(k, 0) for k, v in now.items()}
        self._window = now

    @staticmethod
    def _shares(c: dict) -> dict:
        rows, out = max(1, c.get("rows", 0)), {}
        for half in ("history", "model", "none"):
            out[f"share_{half}"] = c.get(f"from_{half}", 0) / rows
        for half in ("history", "model"):
            if c.get(f"{half}_draft_tokens"):
                out[f"{half}_acceptance"] = c[f"{half}_accepted"] / c[f"{half}_draft_tokens"]
        out["model_skipped"] = c.get("model_skipped", 0)
        out["above_tail_steps"] = c.get("above_tail_steps", 0)
        out["skipped_draft_forwards"] = c.get("skipped_draft_forwards", 0)
        return out

    def specdec_stats(self) -> dict:
        return {"counters": dict(self.counters), "history": self.history.specdec_stats(),
                "model_acceptance": self.model.rates().tolist(), "step_cost": self.cost.metrics()}

    def specdec_metrics(self) -> dict:
        """Flat numbers for the trainer's metrics: `hybrid/*` since engine start (the counters, the
        share of decode rows drafted by each half or by neither, each half's acceptance, the skipped
        model draft steps and forwards, the model's acceptance by position, the step-cost fit),
        `hybrid/step/*` the same shares, acceptance and skips over the last training step's
        generation (between the last two policy updates), and the history half's own (`das/*`)."""
        c, p = self.counters, self.metrics_prefix
        out = {f"{p}/{k}": float(v) for k, v in c.items()}
        out.update({f"{p}/{k}": float(v) for k, v in self._shares(c).items()})
        if self.last_window.get("steps"):
            out.update({f"{p}/step/{k}": float(v) for k, v in self._shares(self.last_window).items()})
        das = self.history.counters
        for j, r in enumerate(self.model.rates()):
            out[f"{p}/model_acceptance_by_pos/{j + 1}"] = float(r)
        out.update({f"{p}/step_cost/{k}": float(v) for k, v in self.cost.metrics().items()
                    if isinstance(v, (int, float))})
        out.update({f"das/{k}": float(v) for k, v in das.items()})
        return out


__all__ = ["Hybrid", "HybridConfig", "HybridProposer", "ModelAcceptance"]
