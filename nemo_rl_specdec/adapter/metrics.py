"""Step metrics of the NeMo-RL adapter. Pure functions; unit-tested without NeMo-RL.

NeMo-RL logs whatever `VllmGeneration.get_step_metrics()` returns under `train/`: its own
speculative counters arrive as `vllm/spec_*` (-> `train/vllm/spec_*`); ours are added as
`specdec/*` (-> `train/specdec/*`).

Per-step metrics for every drafter, and the key that carries each. NeMo-RL
already computes the acceptance figures from vLLM's counters (the same code on v0.7.0 and main:
`aggregate_spec_decode_counters` / `compute_spec_decode_metrics`, counter deltas over the step
summed over the engines, for any proposer, since vLLM's scheduler counts them), so they are not
repeated under `specdec/` (tests/adapter/test_contract.py checks them on NeMo-RL's source):

  acceptance length             vllm/spec_acceptance_length (1 + accepted / drafts)
  acceptance rate               vllm/spec_acceptance_rate (accepted / draft tokens)
  acceptance per position       vllm/spec_acceptance_rate-pos-<i> (drafts accepted at draft
                                position i, 1-based, over drafts) and the counts
                                vllm/vllm:spec_decode_num_accepted_tokens_per_pos-<i>
  drafts made                   vllm/spec_num_drafts (and vllm/spec_num_draft_tokens)
  acceptance vs policy age      specdec/acceptance_{length,rate}_by_lag/<a> (below)
  drafter version, refresh time specdec/drafter_version, specdec/refresh_s (below)

Policy age = policy version - drafter version, taken as the largest over the engines; it is
`specdec/drafter_lag` (the `lag` of the by-lag keys). The CPU demo calls it `policy_age`.

Ours:

  specdec/policy_version        lowest policy version among engines (weight updates received)
  specdec/drafter_version       lowest drafter version among engines
  specdec/drafter_lag           policy age: largest policy_version - drafter_version among engines
  specdec/engines_in_lockstep   1.0 when every engine reports the same (policy, drafter) versions
  specdec/disabled_engines      engines whose drafter was disabled after a refresh error
  specdec/refresh_s             slowest drafter refresh of the last update (max over engines): the
                                drafter's share of the refit, on the critical path
  specdec/refresh_staged        1.0 when every engine's last update installed a store rebuilt in the
                                background since generation ended (0.0: rebuilt inside the refit)
  specdec/staged_wait_s         how long the last update waited for that background rebuild (max over
                                engines; part of refresh_s, 0 when it had finished)
  specdec/staged_rebuild_s      the background rebuild's own time, off the critical path (max)
  specdec/stage_s               the last end-of-generation staging (swap, fetch, start the rebuild),
                                inside NeMo-RL's finish_generation: on the critical path (max)
  specdec/drafter_train_s       online distillation of the drafter applied last, slowest policy rank (s)
  specdec/drafter_train_share   that time over the policy step period it was made in
  specdec/tensors_applied       drafter tensors applied in the last update (max over engines)
  specdec/rollouts_staged       rollouts handed to the drafter with the last update (sum)
  specdec/rollouts_dropped      rollouts dropped because the stash hit its token cap (sum)
  specdec/generated_tokens      tokens the engines generated in NeMo-RL's metrics window (from its
                                `snapshot_step_metrics` to its `get_step_metrics`, vLLM's own
                                `vllm:generation_tokens` counter). Sync GRPO opens the window before the
                                step's rollouts; async GRPO opens it after the collector handed the
                                step's batch over, so it holds what the collector generated meanwhile,
                                and can be 0 (then `vllm/spec_*` are 0 too, and nothing is wrong)
  specdec/no_drafts             1.0 when speculation is on and the engines generated tokens in that
                                window without drafting any (omitted when they generated none)
  specdec/acceptance_length_by_lag/<a>, specdec/acceptance_rate_by_lag/<a>
                                acceptance against policy age: cumulative acceptance (NeMo-RL's
                                definitions) of the steps generated with drafter_lag a
  specdec/placement/*           predicted / actual load imbalance of the step's placement
  specdec/engine/<name>         numeric metrics an engine reports in `specdec_state()["metrics"]`,
                                averaged over engines: the DAS proposer's `das/*` (its counters since
                                engine start, e.g. `das/auto_disable_off_steps`; the step-cost fit
                                `das/step_cost/*`; acceptance per match confidence
                                `das/acceptance/<source>/bin<b>`; `DASProposer.specdec_metrics`), and
                                with `scheduling.k: auto` the sync worker's `k_auto/*` (the schedule's
                                switches, predicted regret and gain, mean k, acceptance by position,
                                step-cost fit; `KAuto.metrics`), and the hybrid drafter's `hybrid/*`
                                (since engine start) and `hybrid/step/*` (the last training step's
                                generation): the share of decode rows drafted by each half
                                (`share_history`, `share_model`, `share_none`), each half's
                                acceptance, the skipped model steps and draft forwards
                                (`HybridProposer.specdec_metrics`)
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from nemo_rl_specdec.metrics import COUNTERS

PREFIX = "specdec/"
NRL_DRAFTS = "vllm/spec_num_drafts"
NRL_DRAFT_TOKENS = "vllm/spec_num_draft_tokens"
NRL_ACCEPTED = "vllm/spec_num_accepted_tokens"
NRL_ACCEPTANCE_LENGTH = "vllm/spec_acceptance_length"
NRL_ACCEPTANCE_RATE = "vllm/spec_acceptance_rate"
NRL_ACCEPTANCE_RATE_AT_POSITION = "vllm/spec_acceptance_rate-pos-{}"  # .format(i), i = 1 for the first draft token
NRL_KEYS = (NRL_DRAFTS, NRL_DRAFT_TOKENS, NRL_ACCEPTED, NRL_ACCEPTANCE_LENGTH, NRL_ACCEPTANCE_RATE)
# an engine's cumulative counters (`counters_of`) <- vLLM's metric names, as NeMo-RL's workers read them
VLLM_COUNTERS = {"generated_tokens": "vllm:generation_tokens", **{key: name for name, key in COUNTERS.items()}}

NO_DRAFTS_HINT = (
    "speculative decoding is enabled but vLLM reported 0 drafts this step. Check that the engine "
    "log shows a speculative_config, that k_by_batch_size does not map this batch size to k=0, "
    "that num_speculative_tokens fits max_model_len, and (suffix/ngram) that prompts repeat "
    "enough to match. See docs/nemo_rl.md, Troubleshooting."
)


def _num(x: Any) -> float | None:
    if isinstance(x, bool):
        return float(x)
    if isinstance(x, (int, float)) and not (isinstance(x, float) and math.isnan(x)):
        return float(x)
    return None


def acceptance(drafts: float, draft_tokens: float, accepted: float) -> tuple[float, float]:
    """(acceptance length, acceptance rate) with NeMo-RL's definitions."""
    length = 1.0 + accepted / drafts if drafts > 0 else 1.0
    rate = accepted / draft_tokens if draft_tokens > 0 else 0.0
    return length, rate


def counters_of(raw: dict) -> dict[str, float]:
    """One engine's cumulative `VLLM_COUNTERS` from vLLM's metrics as NeMo-RL's worker reads them
    (`_get_raw_spec_counters`: metric name -> value)."""
    return {key: _num(raw.get(name)) or 0.0 for key, name in VLLM_COUNTERS.items()}


def window(start: list[dict], end: list[dict]) -> dict[str, float] | None:
    """The engines' `counters_of` summed, end minus start; None unless both reads cover the
    same engines (one entry per engine, in the worker group's order)."""
    if not start or len(start) != len(end):
        return None
    return {key: sum(e.get(key, 0.0) - s.get(key, 0.0) for s, e in zip(start, end, strict=True))
            for key in VLLM_COUNTERS}


def _no_drafts(vllm_metrics: dict, spec_enabled: bool, counted: dict[str, float] | None) -> bool | None:
    """Whether the step's window generated without drafting; None when that cannot be said (speculation
    off, no counters, or nothing generated in the window). With `counted` (a `window`), both figures
    come from the same two reads; without it, NeMo-RL's `vllm/spec_num_drafts` alone."""
    if not spec_enabled:
        return None
    if counted is not None:
        return None if counted["generated_tokens"] <= 0 else counted["drafts"] <= 0
    drafts = _num(vllm_metrics.get(NRL_DRAFTS))
    return None if drafts is None else drafts == 0


class AcceptanceByLag:
    """Cumulative spec counters grouped by the drafter lag (policy age: policy version - drafter
    version) the step was generated with."""

    def __init__(self):
        self.counts: dict[int, list[float]] = {}

    def add(self, lag: int, drafts: float, draft_tokens: float, accepted: float) -> None:
        c = self.counts.setdefault(int(lag), [0.0, 0.0, 0.0])
        c[0] += drafts
        c[1] += draft_tokens
        c[2] += accepted

    def metrics(self) -> dict[str, float]:
        out = {}
        for lag, (d, t, a) in sorted(self.counts.items()):
            length, rate = acceptance(d, t, a)
            out[f"{PREFIX}acceptance_length_by_lag/{lag}"] = length
            out[f"{PREFIX}acceptance_rate_by_lag/{lag}"] = rate
        return out


def version_metrics(reports: list[dict]) -> dict[str, float]:
    """Version / refresh metrics from the engines' `specdec_report` results (one per DP engine)."""
    states = [r.get("state") or {} for r in reports]
    out: dict[str, float] = {}
    pv = [v for v in (_num(s.get("policy_version")) for s in states) if v is not None]
    dv = [v for v in (_num(s.get("drafter_version")) for s in states) if v is not None]
    if pv and len(pv) == len(states):
        out[f"{PREFIX}policy_version"] = min(pv)
    if dv and len(dv) == len(states):
        out[f"{PREFIX}drafter_version"] = min(dv)
    if pv and dv and len(pv) == len(dv) == len(states):
        out[f"{PREFIX}drafter_lag"] = max(p - d for p, d in zip(pv, dv, strict=True))
        pairs = {(p, d) for p, d in zip(pv, dv, strict=True)}
        ranks_ok = all(r.get("ranks_agree", True) for r in reports)
        out[f"{PREFIX}engines_in_lockstep"] = 1.0 if (len(pairs) == 1 and ranks_ok) else 0.0
    if states:
        out[f"{PREFIX}disabled_engines"] = float(sum(bool(s.get("disabled")) for s in states))
    updates: list[dict] = [r["last_update"] for r in reports if r.get("last_update")]
    refresh = [v for v in (_num(u.get("refresh_s")) for u in updates) if v is not None]
    if refresh:
        out[f"{PREFIX}refresh_s"] = max(refresh)
    if any(u.get("mode") == "rebuild" for u in updates):  # a store rebuilt from rollouts (DAS)
        out[f"{PREFIX}refresh_staged"] = 1.0 if len(updates) == len(reports) and all(
            u.get("staged") for u in updates) else 0.0
    for key in ("staged_wait_s", "staged_rebuild_s"):
        vals = [v for v in (_num(u.get(key)) for u in updates) if v is not None]
        if vals:
            out[f"{PREFIX}{key}"] = max(vals)
    stage = [v for v in (_num((r.get("last_stage") or {}).get("stage_s")) for r in reports) if v is not None]
    if stage:
        out[f"{PREFIX}stage_s"] = max(stage)
    applied = [v for v in (_num(u.get("drafter_tensors_applied", u.get("tensors_applied"))) for u in updates)
               if v is not None]
    if applied:
        out[f"{PREFIX}tensors_applied"] = max(applied)
    staged = [_num(r.get("rollouts_staged")) for r in reports]
    if any(v is not None for v in staged):
        out[f"{PREFIX}rollouts_staged"] = sum(v for v in staged if v is not None)
    dropped = [_num(r.get("rollouts_dropped")) for r in reports]
    if any(v is not None for v in dropped):
        out[f"{PREFIX}rollouts_dropped"] = sum(v for v in dropped if v is not None)
    for key in ("drafter_train_s", "drafter_train_share"):  # online distillation in the policy workers
        vals = [v for v in (_num((r.get("distill") or {}).get(key)) for r in reports) if v is not None]
        if vals:
            out[f"{PREFIX}{key}"] = max(vals)
    out.update(engine_reported_metrics(states))
    return out


def engine_reported_metrics(states: list[dict]) -> dict[str, float]:
    """Numeric entries of each engine's `state["metrics"]`, averaged over the engines reporting them."""
    sums: dict[str, list[float]] = {}
    for s in states:
        for k, v in (s.get("metrics") or {}).items():
            x = _num(v)
            if x is not None:
                sums.setdefault(str(k), []).append(x)
    return {f"{PREFIX}engine/{k}": sum(v) / len(v) for k, v in sorted(sums.items())}


def imbalance(loads: Iterable[float]) -> float:
    """max / mean of per-engine loads (1.0 = perfectly balanced)."""
    loads = [float(x) for x in loads]
    if not loads or sum(loads) <= 0:
        return 1.0
    return max(loads) / (sum(loads) / len(loads))


def step_metrics(vllm_metrics: dict, reports: list[dict], tracker: AcceptanceByLag | None,
                 placement: dict | None = None, spec_enabled: bool = True,
                 counted: dict[str, float] | None = None) -> dict[str, float]:
    """Our `specdec/*` keys for one step (NeMo-RL's `vllm/spec_*` keys are returned unchanged beside
    them). `counted`: the engines' counters over NeMo-RL's metrics window (`window`), when read."""
    out = version_metrics(reports) if reports else {}
    if counted is not None:
        out[f"{PREFIX}generated_tokens"] = counted["generated_tokens"]
    no_drafts = _no_drafts(vllm_metrics, spec_enabled, counted)
    if no_drafts is not None:
        out[f"{PREFIX}no_drafts"] = 1.0 if no_drafts else 0.0
    drafts = _num(vllm_metrics.get(NRL_DRAFTS))
    if spec_enabled and drafts is not None:
        lag = out.get(f"{PREFIX}drafter_lag")
        if tracker is not None and lag is not None and drafts > 0:
            tracker.add(int(lag), drafts, _num(vllm_metrics.get(NRL_DRAFT_TOKENS)) or 0.0,
                        _num(vllm_metrics.get(NRL_ACCEPTED)) or 0.0)
    if tracker is not None:
        out.update(tracker.metrics())
    for k, v in (placement or {}).items():
        x = _num(v)
        if x is not None:
            out[f"{PREFIX}placement/{k}"] = x
    return out


def no_drafts_warning(vllm_metrics: dict, spec_enabled: bool,
                      counted: dict[str, float] | None = None) -> str | None:
    return NO_DRAFTS_HINT if _no_drafts(vllm_metrics, spec_enabled, counted) else None
