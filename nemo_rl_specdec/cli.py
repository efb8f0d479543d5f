"""`nemo-rl-specdec` command line: validate | generate | demo | bench | simulate.

Argument parsing lives here; each subcommand's work lives in the module named after it and is
imported only when that subcommand runs (so `validate` never imports vLLM).
Exit codes: 0 ok, 2 invalid input (config or arguments), 1 runtime failure.
"""
from __future__ import annotations

import argparse
import json
import sys


def _validate(args) -> int:
    from nemo_rl_specdec.config import load_run_config, to_vllm_speculative_config
    from nemo_rl_specdec.models import paths_only

    with paths_only():  # validating a run file never downloads or converts a model
        cfg = load_run_config(args.run_yaml, args.overrides)
    out = {
        "source": cfg.source,
        "speculative_decoding": cfg.spec.model_dump(mode="json"),
        "vllm_speculative_config": to_vllm_speculative_config(cfg.spec, cfg.generation.temperature),
    }
    print(json.dumps(out, indent=2))
    return 0


def _generate(args) -> int:
    from nemo_rl_specdec.engine.generate_cli import run

    return run(args)


def _demo(args) -> int:
    from nemo_rl_specdec.demo.run import run

    return run(args)


def _bench(args) -> int:
    from nemo_rl_specdec.bench import run

    return run(args)


def _simulate(args) -> int:
    from nemo_rl_specdec.sim.cli import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="nemo-rl-specdec", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("validate", help="validate a run file's speculative_decoding block")
    p.add_argument("run_yaml")
    p.add_argument("overrides", nargs="*", help="key=value overrides (NeMo-RL style)")
    p.set_defaults(func=_validate)

    p = sub.add_parser("generate", help="roll out prompts from a JSONL file with (or without) speculation")
    p.add_argument("run_yaml")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--prompts", required=True, help="JSONL: prompt | prompt_token_ids, optional problem_id")
    p.add_argument("--out", required=True, help="JSONL of rollouts")
    p.add_argument("--n", type=int, default=1, help="samples per prompt")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-spec", action="store_true", help="turn speculation off (baseline)")
    p.set_defaults(func=_generate)

    p = sub.add_parser("demo", help="GRPO loop on CPU with speculative rollouts (embedded default)")
    p.add_argument("run_yaml", nargs="?", default=None)
    p.add_argument("overrides", nargs="*")
    p.add_argument("--out", default=None, help="output dir (default runs/<name>/)")
    p.set_defaults(func=_demo)

    p = sub.add_parser("bench", help="A/B benchmark of drafters, k, placement and budgets")
    p.add_argument("run_yaml")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--json", default=None, help="write results JSON here")
    p.add_argument("--suite", default=None,
                   help="drafters (default) | das | scheduling | lockstep | parametric | refresh | costmodel")
    p.set_defaults(func=_bench)

    p = sub.add_parser("simulate", help="simulate RL steps with speculative decoding")
    p.add_argument("scenario")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--json", default=None)
    p.add_argument("--plots", default=None, help="directory for PNG plots")
    p.add_argument("--all", action="store_true",
                   help="SCENARIO is a directory: simulate every *.yaml in it and print one summary table")
    p.add_argument("--crosscheck", default=None, metavar="BENCH_JSON",
                   help="predict the measured results of a `bench --suite drafters` JSON with this scenario")
    p.set_defaults(func=_simulate)
    return ap


ENGINE_COMMANDS = ("generate", "demo", "bench")  # commands that start vLLM engines


def main(argv: list[str] | None = None) -> int:
    from nemo_rl_specdec.config import ConfigError

    # overrides may be interleaved with options (`x.yaml a=b --n 2 c=d`)
    args, extra = build_parser().parse_known_args(argv)
    stray = [e for e in extra if "=" not in e or e.startswith("-")]
    if stray:
        print(f"error: unrecognized arguments: {' '.join(stray)}", file=sys.stderr)
        return 2
    if hasattr(args, "overrides"):
        args.overrides = list(args.overrides) + extra
    if argv is None and args.command in ENGINE_COMMANDS:
        from nemo_rl_specdec.openmp import reexec_with_iomp

        reexec_with_iomp(sys.argv[1:])  # vLLM CPU wants Intel OpenMP preloaded; returns if n/a
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
