"""Predict our own measured CPU A/B results with the simulator, and say how far off it is.

For each result of a bench JSON (`nemo-rl-specdec bench ... --json`), the scenario (normally
configs/sim/cpu_tiny_demo.yaml) is re-run with what the bench measured: k, the drafter, the
per-position acceptance and the response lengths. The prediction's rollout speedup is set
beside the measured wall-clock ratio. The cost constants themselves stay the scenario's.
"""
from __future__ import annotations

import json
from pathlib import Path

from nemo_rl_specdec.drafters.base import LIST
from nemo_rl_specdec.drafters.registry import DRAFTERS
from nemo_rl_specdec.sim.acceptance import monotone_curve
from nemo_rl_specdec.sim.scenario import ScenarioError



def overrides_for(result: dict) -> list:
    missing = [k for k in ("k", "drafter", "accepted_per_position", "lengths") if not result.get(k)]
    if missing:
        raise ScenarioError(f"bench result {result.get('name')!r} lacks {missing}; rerun the bench (suite drafters)")
    per_pos = monotone_curve(result["accepted_per_position"])
    # our drafters are the simulator's by the same name; model drafters take no per-request budget
    budget = [] if DRAFTERS[result["drafter"]].kind == LIST else ["speculation.budget=uniform"]
    return budget + [f"speculation.k={int(result['k'])}", f"drafter.name={result['drafter']}",
            "acceptance.alpha=null", "acceptance.mean_accepted_length=null",
            f"acceptance.per_position={per_pos}", "workload.lengths.dist=values",
            f"workload.lengths.values={[int(x) for x in result['lengths']]}"]


def crosscheck(scenario: str, bench_json: str, extra: list = ()) -> list:
    from nemo_rl_specdec.sim.report import simulate
    from nemo_rl_specdec.sim.scenario import load_scenario

    data = json.loads(Path(bench_json).read_text())
    rows = []
    for r in data.get("results", []):
        if r.get("drafter") not in DRAFTERS:
            continue
        sc = load_scenario(scenario, overrides_for(r) + list(extra))
        res = simulate(sc)
        pred, meas = float(res["rollout_speedup"]), float(r["wall_clock_ratio"])
        rows.append({"name": r["name"], "k": r["k"], "measured_speedup": meas, "predicted_speedup": pred,
                     "relative_error": (pred - meas) / meas})
    return rows
