"""`nemo-rl-specdec simulate SCENARIO [key=value ...] [--json OUT] [--plots DIR]`, and
`nemo-rl-specdec simulate --all DIR [key=value ...] [--json OUT]`.

Prints a table (baseline vs speculative rollout and step times, speedups, acceptance, idle
fraction, and each calibration target with the predicted value), writes the result JSON, and,
with --plots, runs the sweeps over k, acceptance and cluster size and writes their PNGs (the
sweeps are also added to the JSON). A scenario's `calibration_points` are simulated too and
printed after its own targets. With --all, every scenario in the directory is simulated
and one line each is printed: predicted rollout speedup, step speedup, mean accepted length
and exposed generation (the JSON maps scenario names to results). Exit codes: 0 ok, 2 invalid scenario (raised as
ConfigError and reported by the top-level CLI).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from nemo_rl_specdec.sim.report import check_calibration_points, simulate
from nemo_rl_specdec.sim.scenario import load_scenario


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
    if "rollout_s_placement_only" in res:
        rows.append(("rollout, placement only (s)", res["rollout_s_baseline"], res["rollout_s_placement_only"],
                     res["rollout_speedup_placement_only"]))
    cells = [[_fmt(c) if i else c for i, c in enumerate(r)] for r in rows]
    w = [max(len(r[i]) for r in cells) for i in range(4)]
    e = res["num_engines"]
    lines = [f"scenario {res['scenario']}: {res['mode']}, {e} engine{'' if e == 1 else 's'}, k={res['k']}, "
             f"alpha={_fmt(res['alpha'])}, mean accepted length {_fmt(res['mean_accepted_length'])}"]
    for r in cells:
        lines.append("  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r)))
    cal = res.get("calibration")
    if cal:
        lines.append("")
        lines.append("calibration (published figure -> simulated):")
        if res.get("overrides"):
            lines.append(f"  (with overrides {' '.join(res['overrides'])}: the figures describe the scenario as shipped)")
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


def _run_all(args) -> int:
    from nemo_rl_specdec.sim.scenario import scenario_files

    files = scenario_files(args.scenario)
    overrides = list(getattr(args, "overrides", []) or [])
    results = [simulate(load_scenario(str(f), overrides)) for f in files]
    print(format_summary(results))
    out = getattr(args, "json", None)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({r["scenario"]: r for r in results}, indent=2))
        print(f"wrote {out}")
    return 0


def run(args) -> int:
    if getattr(args, "crosscheck", None):
        return _crosscheck(args)
    if getattr(args, "all", False):
        return _run_all(args)
    sc = load_scenario(args.scenario, list(getattr(args, "overrides", []) or []))
    plots_dir = getattr(args, "plots", None)
    res = simulate(sc, sweeps=bool(plots_dir))
    res["overrides"] = list(getattr(args, "overrides", []) or [])
    if sc.calibration_points:
        res["calibration_points"] = check_calibration_points(args.scenario, res["overrides"])
    print(format_table(res))
    if plots_dir:
        from nemo_rl_specdec.sim.plots import write_plots

        for p in write_plots(res, plots_dir):
            print(f"wrote {p}")
    out = getattr(args, "json", None)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(res, indent=2))
        print(f"wrote {out}")
    return 0


def _crosscheck(args) -> int:
    from nemo_rl_specdec.sim.crosscheck import crosscheck

    rows = crosscheck(args.scenario, args.crosscheck, list(getattr(args, "overrides", []) or []))
    print(f"{'bench result':<16}{'k':>4}{'measured':>11}{'predicted':>11}{'error':>9}")
    for r in rows:
        print(f"{r['name']:<16}{r['k']:>4}{r['measured_speedup']:>10.2f}x{r['predicted_speedup']:>10.2f}x"
              f"{100 * r['relative_error']:>8.0f}%")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"crosscheck": rows}, indent=2))
    return 0
