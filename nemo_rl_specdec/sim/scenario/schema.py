"""The scenario's root: its blocks together, the checks across blocks, the KV capacity, the
acceptance the scheduling code takes, and the work of a simulated run (`Scenario.work`)."""
from __future__ import annotations

from typing import Any

from pydantic import Field, PrivateAttr, model_validator

from nemo_rl_specdec.config.schema import PathError, short
from nemo_rl_specdec.cost.schema import Hardware, ModelSpec, _Strict
from nemo_rl_specdec.sim import acceptance as acc
from nemo_rl_specdec.sim.scenario.comparison import METRICS, Baseline, CalibrationPoint, Sweep, Target
from nemo_rl_specdec.sim.scenario.drafting import Acceptance, Drafter, Hybrid
from nemo_rl_specdec.sim.scenario.limits import (
    MAX_EVENTS_PER_RUN,
    MAX_K_AUTO_EVALS,
    MAX_SEED,
    MAX_SWEEP_POINTS,
    MIN_SPREAD,
)
from nemo_rl_specdec.sim.scenario.speculation import Speculation
from nemo_rl_specdec.sim.scenario.workload import RL, Cluster, Workload


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
                raise PathError("drafter.name", self.drafter.name, "a model or block drafter with hybrid: (the "
                                 "scenario's drafter is the hybrid's model half)")
            if self.hybrid.model_k is not None and self.hybrid.model_k > self.speculation.num_speculative_tokens:
                raise PathError("hybrid.model_k", self.hybrid.model_k,
                                 f"<= speculation.num_speculative_tokens = {self.speculation.num_speculative_tokens}")
            if self.speculation.scheduling.k_schedule is not None:
                raise PathError("speculation.scheduling", "k by batch size", "none with hybrid: (its rule cuts "
                                 "every request's drafts at every event)")
        if self.drafter.kind == "model" and self.speculation.auto_disable:
            raise PathError(
                "speculation.auto_disable", True,
                f"false for model drafter {self.drafter.name!r}: vLLM fixes its k per batch size at engine start; "
                "use speculation.scheduling.k_by_batch_size or scheduling.k",
            )
        if self.drafter.kind == "model" and self.speculation.scheduling.budget != "uniform":
            raise PathError(
                "speculation.scheduling.budget", self.speculation.scheduling.budget,
                f"'uniform' for model drafter {self.drafter.name!r}: per-request budgets need a list drafter "
                "(suffix, ngram); use speculation.scheduling.k_by_batch_size or scheduling.k for model drafters",
            )
        self._check_costs()
        for key in self.calibration or {}:
            if key not in METRICS:
                raise PathError(f"calibration.{key}", key, f"a reported metric, one of {list(METRICS)}")
        for i, pt in enumerate(self.calibration_points or []):
            for key in pt.targets:
                if key not in METRICS:
                    raise PathError(f"calibration_points.{i}.targets.{key}", key,
                                     f"a reported metric, one of {list(METRICS)}")
        a = self.acceptance
        if a.measured_at_k is not None and a.mean_accepted_length is None:
            raise PathError("acceptance.measured_at_k", a.measured_at_k, "null unless mean_accepted_length is given")
        at_k = a.measured_at_k or self.speculation.num_speculative_tokens
        if a.mean_accepted_length is not None and a.mean_accepted_length > at_k + 1:
            raise PathError(
                "acceptance.mean_accepted_length", a.mean_accepted_length,
                f"<= k + 1 = {at_k + 1} (at most k drafts and one bonus token per step)",
            )
        if a.mean_accepted_length is not None:
            try:
                acc.solve_alpha(a.mean_accepted_length, at_k, a.decay)
            except ValueError as e:
                raise PathError("acceptance.mean_accepted_length", a.mean_accepted_length, str(e)) from None
        if a.trained_depth is not None and a.spread > 0:
            raise PathError("acceptance.trained_depth", a.trained_depth, "null with acceptance.spread (per-request "
                             "alphas are drawn as geometric curves)")
        if a.trained_depth is not None and a.trained_depth < at_k and a.mean_accepted_length is not None:
            raise PathError("acceptance.trained_depth", a.trained_depth,
                             f">= the k the acceptance was measured at ({at_k})")
        if 0 < a.spread < MIN_SPREAD:
            raise PathError("acceptance.spread", a.spread, f"0 (every request alike) or from {MIN_SPREAD:g} to 0.5")
        if a.spread > 0:
            assert self.alpha is not None   # Acceptance refuses a spread with a measured curve
            try:
                acc.spread_mean(self.alpha, a.decay, a.spread, at_k)
            except ValueError as e:
                raise PathError("acceptance.spread", a.spread, str(e)) from None
        self._check_kv()
        sp = self.speculation.scheduling
        ks = self.sweep.num_speculative_tokens
        if sp.medium_k is not None and sp.budget == "length_aware" and min(ks) < sp.medium_k:
            raise PathError("sweep.num_speculative_tokens", ks, f"values >= speculation.scheduling.medium_k = "
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
        key = max(parts, key=parts.__getitem__)
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
            name, value = at or (key, short(self._get(key)))
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
            raise PathError(name, value, f"a run of at most {MAX_EVENTS_PER_RUN:,} simulated events; this one needs "
                             f"about {events:,} ({what}): {hint}")
        sp = self.speculation
        k = sp.num_speculative_tokens if k is None else k
        evals = self.hardware.max_num_seqs * (k + 1)
        if sp.enabled and sp.scheduling.k == "auto" and evals > MAX_K_AUTO_EVALS:
            name, value = at or ("speculation.scheduling.k", "auto")
            raise PathError(name, value, f"at most {MAX_K_AUTO_EVALS:,} step prices for the k-by-batch-size table "
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
                    raise PathError(key, "given", "null without hardware.roofline (the linear cost model ignores it)")
            return
        if self.model is None:
            raise PathError("model", None, "the target model's shape: hardware.roofline needs it")
        if hw.gpus_per_engine > 1 and (hw.roofline.allreduce_bw_Bps is None or not self.model.num_layers
                                       or not self.model.hidden_size):
            raise PathError("hardware.roofline.allreduce_bw_Bps", hw.roofline.allreduce_bw_Bps,
                             "a link bandwidth, with model.num_layers and model.hidden_size, when gpus_per_engine > 1 "
                             "(tensor parallelism all-reduces every layer)")
        if self.drafter.kind in ("model", "block") and self.drafter.model is None and not self.drafter.fwd_base_s:
            raise PathError("drafter.model", None, f"the {self.drafter.name} drafter's shape (or drafter.fwd_base_s)")

    @property
    def kv_capacity_tokens(self) -> float | None:
        """KV cache tokens per engine: given, or what memory_bytes leaves after the weights."""
        hw = self.hardware
        if hw.kv_capacity_tokens is not None:
            return float(hw.kv_capacity_tokens)
        if hw.memory_bytes is None:
            return None
        m, d = self.model, self.drafter.model
        assert m is not None   # memory_bytes needs a roofline (_check_costs), and a roofline the model
        weights = m.shape().total_weight_bytes + (d.shape().total_weight_bytes if d else 0.0)
        per_token = m.kv_bytes_per_token + (d.kv_bytes_per_token if d else 0.0)
        free = hw.memory_bytes * hw.gpus_per_engine * hw.memory_utilization - weights
        return free / per_token if per_token > 0 else None

    def _check_kv(self) -> None:
        hw = self.hardware
        if hw.memory_bytes is not None and hw.kv_capacity_tokens is not None:
            raise PathError("hardware.memory_bytes", hw.memory_bytes, "null when kv_capacity_tokens is given")
        if hw.memory_bytes is not None and not (self.model and self.model.kv_bytes_per_token):
            raise PathError("model.kv_bytes_per_token", 0, "> 0 to derive the KV capacity from hardware.memory_bytes")
        cap = self.kv_capacity_tokens
        if cap is None:
            return
        need = self.workload.prompt_len + self.workload.lengths.max_len + self.speculation.num_speculative_tokens + 1
        if cap < need:
            key = "hardware.kv_capacity_tokens" if hw.kv_capacity_tokens is not None else "hardware.memory_bytes"
            raise PathError(key, getattr(hw, key.split(".")[1]),
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
