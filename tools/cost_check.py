"""Check a hardware profile's one step-cost function: the cost paths' agreement, and its error on timed forwards.

    python -m tools.cost_check [--hardware h200_qwen3_8b] [--json OUT]

Two tables, deterministic for a profile (no wall clock is measured):

1. **Agreement.** Synthetic decode steps at 8, 64 and 200 requests (contexts 500-3000 tokens, DAS-like
   drafts of up to 8 tokens, seed 0) priced by every path that prices a step: the simulator's
   `CostModel.step_cost`, `price` of a trace of the step, the per-step rules' split
   (`PricedStepCost`, and `CostModel.split` as the simulator's rules take it: t0 + c_tok x drafts) and
   the engine's online fit (`StepCostFit`, its linear form fitted on 2,000 priced steps of 1-256
   requests). The ratio of the largest to the smallest is the disagreement. The rules see a step's
   sums (its contexts taken alike), and the online fit is a linear fit of a roofline: those two are
   the only departures left.
2. **Profile error.** Each timed forward of `--samples` (`nemo_rl_specdec/tools/time_forward.py` files: the target's
   and the drafts' forwards on one GPU, as the device check writes them) priced as the profile prices
   that forward (the roofline, and for a draft its fixed time per layer by width), against the time
   measured: median and largest relative error per file, and for a draft the median error with the
   target's fixed time per layer for every draft layer (the rule before the width term).
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

SIZES = (8, 64, 200)
K = 8
DEVICE_FILES = {"qwen3-8b": None, "eagle3-qwen3-8b": "eagle3", "mtp-qwen3-8b": "mtp", "dflash-qwen3-8b": "dflash",
                "qwen3-0.6b": "draft_model"}


def _steps(rng, n: int):
    ctx = rng.integers(500, 3000, n)
    return ctx, np.minimum(rng.geometric(0.3, n) - 1, K)


def agreement(profile, key: str = "das", seed: int = 0) -> list[dict]:
    """Table 1 (module doc): per batch size, each path's price of one step, in seconds."""
    from nemo_rl_specdec.cost.online import StepCostFit
    from nemo_rl_specdec.cost.price import PricedStepCost, price
    from nemo_rl_specdec.cost.trace import Trace, TraceStep

    rng = np.random.default_rng(seed)
    cm = profile.cost_model(key)
    fit = StepCostFit(window=4096, min_samples=64, refit_every=64)
    for _ in range(2000):
        n = int(rng.integers(1, 257))
        c, d = _steps(rng, n)
        fit.add(n, int(n + d.sum()), int(c.sum()), cm.step_cost(d.astype(float), c.astype(float), proposer=True).at(0))
    online = fit.cost_model()
    rows = []
    for n in SIZES:
        ctx, d = _steps(rng, n)
        D = float(d.sum())
        trace = Trace("list", K, [TraceStep(list(range(n)), ctx.tolist(), d.tolist(), [0] * n, 0, 0.0)], key)
        t0, c_tok = PricedStepCost(profile, key, K).split(n, int(ctx.sum()), D)
        s0, s_tok = cm.split(n, float(ctx.sum()), D)
        paths = {"step_cost": cm.step_cost(d.astype(float), ctx.astype(float), proposer=True).at(0),
                 "price": price(trace, profile).rollout_s, "priced_split": t0 + c_tok * D,
                 "simulator_split": s0 + s_tok * D,
                 "online_fit": online.step_cost(d.astype(float), ctx.astype(float)).at(0) if online else float("nan")}
        rows.append({"requests": n, "draft_tokens": int(D), **paths,
                     "max_over_min": max(paths.values()) / min(paths.values())})
    return rows


def profile_error(profile, samples_dir: Path) -> list[dict]:
    """Table 2 (module doc): per timed-forward file, the profile's median and largest relative error."""
    from nemo_rl_specdec.cost.fit import _samples_file

    roof = profile.hardware.roofline_model()
    out = []
    for stem, key in DEVICE_FILES.items():
        path = samples_dir / f"forward_{stem}.json"
        if not path.is_file():
            continue
        shape, samples, _, data = _samples_file(str(path))
        rel, flat = [], []
        for s in samples:
            if key is None:   # the target: the engine step's forward, its fixed time and per-request time included
                const, (m0, _, f0, _) = roof.forward(shape, s["tokens"], s["ctx_sum"], 0.0, s["attn_ctx"], 0.0)
                t = const + roof.overhead_per_seq_s * s["requests"] + max(m0, f0)
            else:             # a draft forward: the roofline of its shape and its fixed time by layers
                const, (m0, _, f0, _) = roof.forward(shape, s["tokens"], s["ctx_sum"], 0.0, s["attn_ctx"], 0.0,
                                                     overhead=False)
                t = const + max(m0, f0) + profile.drafter(key).fwd_base_s
                # as before the width term: the target's fixed time per layer for every draft layer
                flat.append(abs((const + max(m0, f0) + profile.layer_overhead_s * shape.num_layers) / s["seconds"]
                                - 1.0))
            rel.append(t / s["seconds"] - 1.0)
        out.append({"file": path.name, "entry": key or "target", "device": data.get("device", ""),
                    "num_layers": shape.num_layers, "hidden_size": shape.hidden_size, "samples": len(rel),
                    "median_abs_rel_error": statistics.median(abs(r) for r in rel),
                    "max_abs_rel_error": max(abs(r) for r in rel), "median_rel_error": statistics.median(rel),
                    "median_abs_rel_error_target_per_layer": statistics.median(flat) if flat else None})
    return out


def main(argv=None) -> int:
    from nemo_rl_specdec.cost.profile import load_profile

    ap = argparse.ArgumentParser(prog="python -m tools.cost_check", description=__doc__.split("\n")[0])
    ap.add_argument("--hardware", default="h200_qwen3_8b", help="a hardware profile (configs/hardware/NAME.yaml)")
    ap.add_argument("--samples", default="benchmarks/device_check/h200",
                    help="a folder of time_forward files (forward_<shape>.json) timed on the profile's GPU")
    ap.add_argument("--json", help="write both tables here")
    args = ap.parse_args(argv)
    profile = load_profile(args.hardware)
    agree = agreement(profile)
    print(f"cost paths on {profile.name}, one synthetic DAS step each (ms)")
    print(f"{'requests':>8}{'drafts':>8}{'step_cost':>11}{'price':>9}{'priced split':>14}{'sim split':>11}"
          f"{'online fit':>12}{'max/min':>9}")
    for r in agree:
        print(f"{r['requests']:>8}{r['draft_tokens']:>8}{1e3 * r['step_cost']:>11.3f}{1e3 * r['price']:>9.3f}"
              f"{1e3 * r['priced_split']:>14.3f}{1e3 * r['simulator_split']:>11.3f}{1e3 * r['online_fit']:>12.3f}"
              f"{r['max_over_min']:>9.4f}")
    err = profile_error(profile, Path(args.samples))
    if err:
        print(f"\n{profile.name} against the forwards timed in {args.samples} ({err[0]['device']})")
        print(f"{'file':<34}{'entry':<13}{'layers':>7}{'width':>7}{'samples':>8}{'median |err|':>13}"
              f"{'max |err|':>10}{'median err':>11}{'  median |err|, target per layer':>33}")
        for e in err:
            print(f"{e['file']:<34}{e['entry']:<13}{e['num_layers']:>7}{e['hidden_size']:>7}{e['samples']:>8}"
                  f"{100 * e['median_abs_rel_error']:>12.1f}%{100 * e['max_abs_rel_error']:>9.1f}%"
                  f"{100 * e['median_rel_error']:>10.1f}%" + (
                      "" if e["median_abs_rel_error_target_per_layer"] is None else
                      f"{100 * e['median_abs_rel_error_target_per_layer']:>32.1f}%"))
    if args.json:
        Path(args.json).write_text(json.dumps({"hardware": profile.name, "agreement": agree, "profile_error": err},
                                              indent=1), encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
