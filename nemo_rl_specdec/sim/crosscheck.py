"""Predict our own measured CPU A/B results with the simulator, and say how far off it is.

For each result of a bench JSON (`nemo-rl-specdec bench ... --json`), the scenario (normally
configs/sim/cpu_tiny_demo.yaml) is re-run with what the bench measured: k, the drafter, the
per-position acceptance and the response lengths. The prediction's rollout speedup is set
beside the measured wall-clock ratio. The cost constants themselves stay the scenario's.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeGuard

from nemo_rl_specdec.drafters.base import LIST
from nemo_rl_specdec.drafters.registry import DRAFTERS, drafter as drafter_of
from nemo_rl_specdec.drafters.roles import Declared
from nemo_rl_specdec.sim.acceptance import monotone_curve
from nemo_rl_specdec.sim.scenario import ScenarioError

MAX_LENGTHS = 100_000   # response lengths of one bench result (they become a scenario override)


BENCH = ("the JSON of `nemo-rl-specdec bench --suite drafters --json` (results with name, drafter, k, "
         "accepted_per_position, lengths, wall_clock_ratio)")


def _bench_error(path: str, what: str, allowed: str = BENCH) -> ScenarioError:
    return ScenarioError(f"--crosscheck {path}: {what}; allowed: {allowed}")


def _number(v: Any) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def read_bench(path: str) -> list[dict]:
    """The results of a bench JSON that name a registered drafter, each checked: a non-empty
    `name`, `k` from 1 to 64, `accepted_per_position` numbers from 0 to 1, `lengths` whole token
    counts, a finite positive `wall_clock_ratio`. Any other file is a ScenarioError naming it."""
    from nemo_rl_specdec.cost.schema import MAX_TOKENS
    from nemo_rl_specdec.sim.scenario.limits import MAX_CURVE, MAX_K

    p = Path(path)
    try:
        if not p.is_file():
            raise _bench_error(path, "a directory" if p.is_dir() else "not found")
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise _bench_error(path, f"not a text file (byte {e.start} is not UTF-8)") from None
    except (OSError, ValueError) as e:
        if isinstance(e, ScenarioError):
            raise
        raise _bench_error(path, f"cannot be read ({getattr(e, 'strerror', None) or e})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise _bench_error(path, f"not JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except (ValueError, RecursionError):
        raise _bench_error(path, "not JSON that can be read (nested too deeply)") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise _bench_error(path, f"got a {type(data).__name__} without a `results` list")
    rows = []
    for i, r in enumerate(data["results"]):
        if not isinstance(r, dict):
            raise _bench_error(path, f"results[{i}] is a {type(r).__name__}, not a mapping")
        if not isinstance(r.get("drafter"), str) or r["drafter"] not in DRAFTERS:
            continue              # the baseline and rows of drafters this package does not run
        where = f"results[{i}] ({str(r.get('name'))[:40]!r})"
        name, k, ratio = r.get("name"), r.get("k"), r.get("wall_clock_ratio")
        per_pos, lengths = r.get("accepted_per_position"), r.get("lengths")
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise _bench_error(path, f"{where}.name: got {name!r}", "a non-empty name")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise _bench_error(path, f"{where}.k: got {k!r}", f"an integer from 1 to {MAX_K}")
        if not _number(ratio) or not 0 < ratio <= 1e6:
            raise _bench_error(path, f"{where}.wall_clock_ratio: got {ratio!r}", "a finite number > 0 and <= 1e6")
        if (not isinstance(per_pos, list) or not 1 <= len(per_pos) <= MAX_CURVE
                or not all(_number(x) and 0 <= x <= 1 for x in per_pos)):
            raise _bench_error(path, f"{where}.accepted_per_position: got {str(per_pos)[:60]}",
                               f"1 to {MAX_CURVE} numbers from 0 to 1")
        if (not isinstance(lengths, list) or not 1 <= len(lengths) <= MAX_LENGTHS
                or not all(_number(x) and x == int(x) and 1 <= x <= MAX_TOKENS for x in lengths)):
            raise _bench_error(path, f"{where}.lengths: got {str(lengths)[:60]}",
                               f"1 to {MAX_LENGTHS:,} response lengths (whole numbers from 1 to {MAX_TOKENS:,})")
        rows.append(r)
    if not rows:
        raise _bench_error(path, f"no result of a drafter this package runs ({sorted(DRAFTERS)})")
    return rows


def overrides_for(result: dict) -> list:
    missing = [k for k in ("k", "drafter", "accepted_per_position", "lengths") if not result.get(k)]
    if missing:
        raise ScenarioError(f"bench result {result.get('name')!r} lacks {missing}; rerun the bench (suite drafters)")
    per_pos = monotone_curve(result["accepted_per_position"])
    # our drafters are the simulator's by the same name; model drafters take no per-request budget
    budget = [] if drafter_of(result["drafter"], Declared).kind == LIST else ["speculation.scheduling.budget=uniform"]
    return budget + [f"speculation.num_speculative_tokens={int(result['k'])}", f"drafter.name={result['drafter']}",
            "acceptance.alpha=null", "acceptance.mean_accepted_length=null",
            f"acceptance.per_position={per_pos}", "workload.lengths.dist=values", "++workload.lengths.groups=null",
            f"workload.lengths.values={[int(x) for x in result['lengths']]}"]


def crosscheck(scenario: str, bench_json: str, extra: Sequence[str] = ()) -> list:
    """The scenario's prediction of each result of `bench_json` beside the measured ratio. The file
    and every variant of the scenario are checked before anything is simulated."""
    from nemo_rl_specdec.sim.report import simulate
    from nemo_rl_specdec.sim.scenario import load_scenario

    results = read_bench(bench_json)
    runs = []
    for r in results:
        try:
            runs.append((r, load_scenario(scenario, overrides_for(r) + list(extra))))
        except ScenarioError as e:
            raise ScenarioError(f"--crosscheck {bench_json}: result {r['name']!r} on scenario {scenario}: {e}") \
                from None
    rows = []
    for r, sc in runs:
        res = simulate(sc)
        pred, meas = float(res["rollout_speedup"]), float(r["wall_clock_ratio"])
        rows.append({"name": r["name"], "k": r["k"], "measured_speedup": meas, "predicted_speedup": pred,
                     "relative_error": (pred - meas) / meas})
    return rows
