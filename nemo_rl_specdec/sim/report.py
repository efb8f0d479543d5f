"""A scenario's results: baseline vs speculative runs, calibration checks, sweeps.

- baseline: speculation off, `baseline.placement` (default `contiguous`, NeMo-RL today);
- placement only: speculation off, the scenario's placement (what scheduling alone gives);
- spec: speculation on with the scenario's drafter, k, placement and budget.

All three runs see the same batches (one seeded draw). Sweeps re-run the spec case (and the
baseline where it changes) over k, over the per-position acceptance alpha, and over the
number of engines. `format_table` and `format_summary` print them (the `simulate` command).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from nemo_rl_specdec.config.schema import PathError
from nemo_rl_specdec.cost.model import CostModel
from nemo_rl_specdec.sim.scenario import ScenarioError
from nemo_rl_specdec.sim.step import RunResult, simulate_rl
from nemo_rl_specdec.sim.workload import make_batches


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf")


def check_finite(value: Any, path: str = "result") -> None:
    """Raise SimulationError naming the first NaN or infinite number in a result."""
    if isinstance(value, dict):
        for k, v in value.items():
            check_finite(v, f"{path}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_finite(v, f"{path}[{i}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise SimulationError(f"{path} is {value}: the scenario's costs or workload make this result undefined "
                              "(a zero or infinite time); check the hardware and workload blocks")


class SimulationError(ScenarioError):
    """A result came out NaN or infinite: the scenario describes something the model cannot time."""


def compare(sc, base: RunResult, spec: RunResult, placement_only: RunResult | None = None) -> dict[str, Any]:
    gpus = spec.num_engines * sc.hardware.gpus_per_engine
    serving = sc.workload.steady_state        # no trainer: nothing waits for the rollouts
    sync = sc.rl.mode == "sync" and not serving
    out = {
        "rollout_s_baseline": base.rollout_s,
        "rollout_s_spec": spec.rollout_s,
        "rollout_speedup": _ratio(base.rollout_s, spec.rollout_s),
        "rollout_time_reduction": 1.0 - _ratio(spec.rollout_s, base.rollout_s),
        "step_s_baseline": base.step_s,
        "step_s_spec": spec.step_s,
        "step_speedup": _ratio(base.step_s, spec.step_s),
        "gen_fraction_baseline": _ratio(base.rollout_s, base.step_s) if sync else None,
        "gen_fraction_spec": _ratio(spec.rollout_s, spec.step_s) if sync else None,
        "gen_idle_fraction_baseline": base.gen_idle_fraction,
        "gen_idle_fraction_spec": spec.gen_idle_fraction,
        "mean_accepted_length": spec.mean_accepted_length,
        "tokens_per_gpu_s_baseline": base.response_tokens / len(base.release) / (base.rollout_s * gpus),
        "tokens_per_gpu_s_spec": spec.response_tokens / len(spec.release) / (spec.rollout_s * gpus),
        "target_steps_baseline": base.target_steps,
        "target_steps_spec": spec.target_steps,
        "draft_tokens_per_response_token": spec.draft_tokens / max(1, spec.response_tokens),
        "output_tokens_per_s_baseline": base.response_tokens / len(base.release) / base.rollout_s,
        "output_tokens_per_s_spec": spec.response_tokens / len(spec.release) / spec.rollout_s,
        "exposed_generation_s_baseline": None if serving else base.exposed_generation_s,
        "exposed_generation_s_spec": None if serving else spec.exposed_generation_s,
        "preemptions_baseline": base.preemptions,
        "preemptions_spec": spec.preemptions,
    }
    if spec.judged_by_batch:  # speculation.auto_disable: where the engines' rule turns speculation off
        out["auto_disable_off_share_by_batch"] = spec.off_share_by_batch
    if spec.hybrid_request_steps:  # a hybrid drafter: where its drafts came from, and its model forwards
        total = sum(spec.hybrid_request_steps.values())
        out["hybrid_share_by_source"] = {src: v / total for src, v in sorted(spec.hybrid_request_steps.items())}
        out["hybrid_model_forward_share"] = spec.hybrid_model_steps / max(1, spec.target_steps)
    if placement_only is not None:
        out["rollout_s_placement_only"] = placement_only.rollout_s
        out["rollout_speedup_placement_only"] = _ratio(base.rollout_s, placement_only.rollout_s)
    return out


def check_calibration(sc, metrics: dict[str, Any]) -> dict[str, Any]:
    """Each calibration target with the simulated value; `ok` is None when the metric is not
    defined for this run (e.g. the generation share of a step in async mode)."""
    return check_targets(sc.calibration or {}, metrics)


def check_targets(targets: dict, metrics: dict[str, Any]) -> dict[str, Any]:
    """Each target (`scenario.Target`) with the simulated value of its metric."""
    out = {}
    for key, target in targets.items():
        lo, hi = target.bounds()
        v = metrics.get(key)
        out[key] = {"predicted": None if v is None else float(v), "target": target.value,
                    "min": lo if math.isfinite(lo) else None, "max": hi if math.isfinite(hi) else None,
                    "ok": None if v is None else bool(lo <= float(v) <= hi), "source": target.source}
    return out


def calibration_variants(path: str, overrides: Sequence[str] = ()) -> list[tuple[Any, Any]]:
    """(point, its scenario) for each of the scenario's `calibration_points`: the scenario file at
    `path` with the point's overrides, then the caller's; loading them all first checks every
    variant before any is simulated (an error names the point)."""
    from nemo_rl_specdec.sim.scenario import load_scenario

    sc = load_scenario(path, list(overrides))
    out = []
    for i, pt in enumerate(sc.calibration_points or []):
        try:
            out.append((pt, load_scenario(path, [*pt.overrides, *overrides, "calibration_points=null"])))
        except ScenarioError as e:
            why = str(e).removeprefix(f"{sc.source}: ")
            raise ScenarioError(f"{sc.source}: calibration_points.{i} ({pt.name!r}), overrides {pt.overrides}: {why}") \
                from None
    return out


def check_calibration_points(path: str, overrides: Sequence[str] = (),
                             variants: list[tuple[Any, Any]] | None = None) -> list[dict[str, Any]]:
    """Each of the scenario's `calibration_points`: the variant simulated (scenario file at
    `path` with the point's overrides, then the caller's) and its targets checked; `variants`:
    `calibration_variants` already loaded."""
    out = []
    for pt, v in (calibration_variants(path, overrides) if variants is None else variants):
        out.append({"name": pt.name, "overrides": list(pt.overrides),
                    "calibration": check_targets(pt.targets, simulate(v))})
    return out


def check_sweeps(sc) -> None:
    """Refuse, before any run, sweeps that a run could not take: each point's work within the
    limit (`Scenario.check_work`), and with `acceptance.spread` each swept alpha one a spread can
    keep."""
    from nemo_rl_specdec.sim import acceptance as acc
    from nemo_rl_specdec.sim.scenario.limits import MAX_ENGINES

    def work(**kw) -> None:
        try:
            sc.check_work(**kw)
        except PathError as e:
            raise ScenarioError(f"{sc.source}: scenario.{e.rel_path}: got {e.value!r}; allowed: {e.allowed}") from None

    E0 = sc.cluster.num_engines
    ks = sc.sweep.num_speculative_tokens
    for k in ks:
        work(k=k, at=("sweep.num_speculative_tokens", ks))
    cap, wl = sc.kv_capacity_tokens, sc.workload
    need = wl.prompt_len + wl.lengths.max_len + max(ks) + 1
    if cap is not None and cap < need:
        raise ScenarioError(f"{sc.source}: scenario.sweep.num_speculative_tokens: got {ks}; allowed: k values whose "
                            f"requests fit the KV cache ({cap:.0f} tokens per engine): prompt_len + max_len + k + 1 = "
                            f"{need} for k = {max(ks)}")
    a = sc.acceptance
    if a.per_position is None and a.spread > 0:
        for alpha in sc.sweep.alpha:
            try:
                acc.spread_mean(alpha, a.decay, a.spread, a.measured_at_k or sc.speculation.num_speculative_tokens)
            except ValueError as e:
                raise ScenarioError(f"{sc.source}: scenario.sweep.alpha: got {alpha!r}; allowed: alphas that "
                                    f"acceptance.spread can keep ({e})") from None
    for E in _sweep_sizes(sc):
        if E > MAX_ENGINES:
            raise ScenarioError(f"{sc.source}: scenario.sweep.num_engines: got {sc.sweep.num_engines or E!r} (the "
                                f"default sizes are cluster.num_engines x 1/4 to x 4); allowed: sizes up to "
                                f"{MAX_ENGINES:,}: give sweep.num_engines")
        prompts = max(1, round(sc.workload.num_prompts * E / E0)) if sc.sweep.cluster_scaling == "weak" else None
        work(num_engines=E, num_prompts=prompts, at=("sweep.num_engines", sc.sweep.num_engines or
                                                     f"the default sizes {_sweep_sizes(sc)}"))


def _sweep_sizes(sc) -> list[int]:
    E0 = sc.cluster.num_engines
    return sc.sweep.num_engines or sorted({max(1, E0 // 4), max(1, E0 // 2), E0, 2 * E0, 4 * E0})


def simulate(sc, sweeps: bool = False) -> dict[str, Any]:
    """Everything the CLI prints and writes, as a JSON-able dict. The sweeps are checked before
    anything runs (`check_sweeps`); a result that comes out NaN or infinite, or a run the model
    cannot time, is a SimulationError naming the scenario's file."""
    if sweeps:
        check_sweeps(sc)
    try:
        with np.errstate(all="ignore"):      # an overflow shows as a NaN or infinite result: check_finite
            result = _simulate(sc, sweeps)
        check_finite(result)
    except SimulationError as e:
        raise SimulationError(f"{sc.source}: {e}") from None
    except (ValueError, ArithmeticError, RuntimeError) as e:
        if isinstance(e, ScenarioError):
            raise
        raise SimulationError(f"{sc.source}: the simulator cannot time this scenario ({type(e).__name__}: {e}); "
                              "check the hardware, workload and speculation blocks against docs/simulator.md") \
            from None
    return result


def _simulate(sc, sweeps: bool) -> dict[str, Any]:
    batches = make_batches(sc.workload, sc.rl.num_steps, sc.seed)
    base = simulate_rl(sc, speculative=False, placement=sc.baseline.placement, batches=batches)
    spec = simulate_rl(sc, speculative=True, batches=batches)
    p_only = None
    if sc.speculation.scheduling.placement != sc.baseline.placement:
        p_only = simulate_rl(sc, speculative=False, batches=batches)
    metrics = compare(sc, base, spec, p_only)
    cm = CostModel.from_scenario(sc)
    result: dict[str, Any] = {
        "scenario": sc.name,
        **metrics,
        "alpha": sc.alpha,
        "k": sc.speculation.num_speculative_tokens,
        "num_engines": sc.cluster.num_engines,
        "mode": "serving" if sc.workload.steady_state else sc.rl.mode,
        "cost_model": _cost_summary(sc, cm),
        "per_step": {
            "rollout_s_baseline": base.rollout_s_per_step,
            "rollout_s_spec": spec.rollout_s_per_step,
        },
    }
    if sc.calibration:
        result["calibration"] = check_calibration(sc, metrics)
    if sweeps:
        result["sweeps"] = run_sweeps(sc, base, batches)
    return result


def _cost_summary(sc, cm: CostModel) -> dict[str, Any]:
    kv = sc.kv_capacity_tokens
    if cm.roofline is None:
        return {"form": "linear", "c_base_s": cm.c_base, "c_tok_s": cm.c_tok, "c_ctx_s": cm.c_ctx,
                "c_seq_s": cm.c_seq, "kv_capacity_tokens": kv}
    ctx = sc.workload.prompt_len + sc.workload.lengths.median / 2
    b = sc.hardware.max_num_seqs
    fit = sc.hardware.roofline.fit
    measured = {"measured": sc.hardware.roofline.measured, "fit": fit} if fit else {}
    return {"form": "roofline", **measured, "kv_capacity_tokens": kv, "typical_context": ctx,
            "step_s_batch_1": cm.mean_step_time(1, 0, ctx), f"step_s_batch_{b}": cm.mean_step_time(b, 0, ctx),
            f"step_s_batch_{b}_k": cm.mean_step_time(b, sc.speculation.num_speculative_tokens, ctx)}


def run_sweeps(sc, base: RunResult | None = None, batches=None) -> dict[str, list[dict[str, float]]]:
    if batches is None:
        batches = make_batches(sc.workload, sc.rl.num_steps, sc.seed)
    if base is None:
        base = simulate_rl(sc, speculative=False, placement=sc.baseline.placement, batches=batches)
    out: dict[str, list[dict[str, float]]] = {"k": [], "alpha": [], "num_engines": []}
    for k in sc.sweep.num_speculative_tokens:
        r = simulate_rl(sc, speculative=True, k=k, batches=batches)
        out["k"].append(_point("k", k, base, r))
    if sc.acceptance.per_position is None:
        for a in sc.sweep.alpha:
            r = simulate_rl(sc, speculative=True, acceptance=a, batches=batches)
            out["alpha"].append(_point("alpha", a, base, r))
    E0 = sc.cluster.num_engines
    for E in _sweep_sizes(sc):
        prompts = None
        if sc.sweep.cluster_scaling == "weak":
            prompts = max(1, round(sc.workload.num_prompts * E / E0))
        bb = make_batches(sc.workload, sc.rl.num_steps, sc.seed, prompts)
        b = simulate_rl(sc, speculative=False, placement=sc.baseline.placement, num_engines=E, batches=bb)
        r = simulate_rl(sc, speculative=True, num_engines=E, batches=bb)
        out["num_engines"].append(_point("num_engines", E, b, r))
    return out


def _point(name: str, x, base: RunResult, r: RunResult) -> dict[str, float]:
    return {
        name: x,
        "rollout_speedup": _ratio(base.rollout_s, r.rollout_s),
        "step_speedup": _ratio(base.step_s, r.step_s),
        "rollout_s_baseline": base.rollout_s,
        "rollout_s_spec": r.rollout_s,
        "mean_accepted_length": r.mean_accepted_length,
    }


# --------------------------------------------------------------------------- tables (`nemo-rl-specdec simulate`)

def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isinf(v):
            return "inf"
        if abs(v) < 10:
            return f"{v:.3f}"
        return f"{v:,.1f}" if abs(v) < 10_000 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def format_table(res: dict[str, Any]) -> str:
    rows = [
        ("", "baseline", "speculative", "ratio"),
        ("rollout (s)", res["rollout_s_baseline"], res["rollout_s_spec"], res["rollout_speedup"]),
        ("step (s)", res["step_s_baseline"], res["step_s_spec"], res["step_speedup"]),
        ("generation share of step", res["gen_fraction_baseline"], res["gen_fraction_spec"], None),
        ("generation idle fraction", res["gen_idle_fraction_baseline"], res["gen_idle_fraction_spec"], None),
        ("tokens / GPU-s (rollout)", res["tokens_per_gpu_s_baseline"], res["tokens_per_gpu_s_spec"], None),
        ("target forward steps", res["target_steps_baseline"], res["target_steps_spec"], None),
        ("exposed generation (s)", res["exposed_generation_s_baseline"], res["exposed_generation_s_spec"], None),
        ("output tokens / s", res["output_tokens_per_s_baseline"], res["output_tokens_per_s_spec"], None),
        ("KV preemptions", res["preemptions_baseline"], res["preemptions_spec"], None),
    ]
    if "auto_disable_off_share_by_batch" in res:
        off = res["auto_disable_off_share_by_batch"]
        order = sorted(off, key=lambda b: int(b.split("-")[0]))
        rows.append(("auto_disable: steps off, by batch size", None, "  ".join(f"{b}: {off[b]:.0%}" for b in order),
                     None))
    if "hybrid_share_by_source" in res:
        share = res["hybrid_share_by_source"]
        rows.append(("hybrid: request-steps by draft source", None,
                     "  ".join(f"{src}: {v:.0%}" for src, v in share.items()), None))
        rows.append(("hybrid: steps running the model forwards", None,
                     f"{res['hybrid_model_forward_share']:.0%}", None))
    if "rollout_s_placement_only" in res:
        rows.append(("rollout, placement only (s)", res["rollout_s_baseline"], res["rollout_s_placement_only"],
                     res["rollout_speedup_placement_only"]))
    cells = [[_fmt(c) if i else c for i, c in enumerate(r)] for r in rows]
    w = [max(len(r[i]) for r in cells) for i in range(4)]
    e = res["num_engines"]
    lines = [f"scenario {res['scenario']}: {res['mode']}, {e} engine{'' if e == 1 else 's'}, k={res['k']}, "
             f"alpha={_fmt(res['alpha'])}, mean accepted length {_fmt(res['mean_accepted_length'])}"]
    fit = res.get("cost_model", {}).get("fit")
    if fit:
        lines.append(
            f"roofline fitted on {fit['samples']} measured forwards ({res['cost_model']['measured']}, "
            f"{fit['device']}): {fit['mem_bw_Bps'] / 1e12:.2f} TB/s, {fit['flops_per_s'] / 1e12:.0f} TFLOP/s, "
            f"{fit['overhead_s'] * 1e3:.2f} ms per step, {fit['overhead_per_seq_s'] * 1e6:.1f} us per request, "
            f"+{fit['eager_overhead_s'] * 1e3:.2f} ms eager; relative residual median "
            f"{fit['median_rel_residual']:.1%}, max {fit['max_rel_residual']:.1%}"
        )
    for r in cells:
        lines.append("  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r)))
    cal = res.get("calibration")
    if cal:
        lines.append("")
        lines.append("calibration (published figure -> simulated):")
        if res.get("overrides"):
            lines.append(
                f"  (with overrides {' '.join(res['overrides'])}: the figures describe the scenario as shipped)"
            )
        lines += _calibration_lines(cal)
    for pt in res.get("calibration_points") or []:
        lines.append(f"calibration point {pt['name']!r} ({' '.join(pt['overrides'])}):")
        lines += _calibration_lines(pt["calibration"])
    return "\n".join(lines)


def _calibration_lines(cal: dict[str, Any]) -> list[str]:
    out = []
    for key, c in cal.items():
        want = _fmt(c["target"]) if c["target"] is not None else f"[{_fmt(c['min'])}, {_fmt(c['max'])}]"
        tag = {True: "ok", False: "OUT OF RANGE", None: "n/a in this mode"}[c["ok"]]
        out.append(f"  {key}: {want} -> {_fmt(c['predicted'])}  {tag}   ({c['source']})")
    return out


def format_summary(results: list[dict[str, Any]]) -> str:
    """One line per scenario: the predictions a reader compares with published figures."""
    head = ("scenario", "mode", "k", "rollout_s base", "rollout_s spec", "rollout speedup", "step_s base",
            "step_s spec", "step speedup", "mean acc. length", "exposed gen s base", "exposed gen s spec")
    rows = [head] + [(r["scenario"], r["mode"], str(r["k"]), _fmt(r["rollout_s_baseline"]), _fmt(r["rollout_s_spec"]),
                      _fmt(r["rollout_speedup"]), _fmt(r["step_s_baseline"]), _fmt(r["step_s_spec"]),
                      _fmt(r["step_speedup"]), _fmt(r["mean_accepted_length"]),
                      _fmt(r["exposed_generation_s_baseline"]), _fmt(r["exposed_generation_s_spec"]))
                     for r in results]
    w = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w[i]) if i < 2 else c.rjust(w[i]) for i, c in enumerate(r)) for r in rows)
