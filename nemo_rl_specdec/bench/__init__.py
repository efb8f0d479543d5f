"""`nemo-rl-specdec bench`: A/B benchmarks measured side by side in one run.

Each suite is one module with `run(cfg, args) -> list[dict]`; every result dict carries at least
`name`, `drafter`, `tokens_per_target_forward`, `acceptance_rate`, `wall_clock_ratio`
(no-spec time / spec time on the same prompts and weights) and `per_step` (may be empty for
single-batch suites); a suite that measures no speedup (`refresh`, `costmodel`, `distill`, `resume`) names its own
`REQUIRED` keys in its module. This module loads the run file, dispatches, prints a table, writes JSON.
"""
from __future__ import annotations

import importlib
import json
from pathlib import Path

SUITES = {
    "drafters": "nemo_rl_specdec.bench.drafters",      # each CPU drafter vs no-spec on the bundled workload
    "das": "nemo_rl_specdec.bench.das",                # suffix windows/scopes over RL steps vs vLLM suffix/ngram
    "scheduling": "nemo_rl_specdec.bench.scheduling",  # placement x budget on 2 engines
    "lockstep": "nemo_rl_specdec.bench.lockstep",      # frozen vs refit drafter across a policy update
    "parametric": "nemo_rl_specdec.bench.parametric",  # draft_model/eagle3 frozen vs online over GRPO updates
    "refresh": "nemo_rl_specdec.bench.refresh",        # DAS refresh at NeMo-RL scale: transport + rebuild on Ray
    "costmodel": "nemo_rl_specdec.bench.costmodel",    # engine step times for the simulator's CPU cost model
    "adaptive": "nemo_rl_specdec.bench.adaptive",      # fixed k vs auto per drafter and load regime, vs no-spec
    "distill": "nemo_rl_specdec.bench.distill",        # online distillers' step time and peak memory, full vocabulary
    "hybrid": "nemo_rl_specdec.bench.hybrid",          # history (DAS) vs model (Eagle3) vs the hybrid's choice, priced
    "resume": "nemo_rl_specdec.bench.resume",          # the drafter's checkpoint state: size, save and restore time
}
# bounds of the suites' sizes: beyond them a suite runs for many hours on a few CPU cores
MAX_STEPS, MAX_PROMPTS, MAX_SAMPLES, MAX_ENGINES, MAX_REPEATS = 100, 1024, 64, 16, 100
REQUIRED = ("name", "drafter", "tokens_per_target_forward", "acceptance_rate", "wall_clock_ratio", "per_step")


def say(suite: str, msg: str) -> None:
    """A timestamped progress line on the terminal's stderr (stdout carries the tables; `demo/console.py`)."""
    import time

    from nemo_rl_specdec.demo.console import err, line

    print(line(f"[bench {suite} {time.strftime('%H:%M:%S')}] {msg}"), file=err(), flush=True)


def release_memory() -> None:
    """Collect garbage, then give the heap's free pages back to the OS (glibc's malloc_trim; a no-op
    elsewhere): without it, a GRPO trainer's freed activations stay resident in the bench process
    for the rest of the run."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def suite_options(cfg, suite: str, allowed: str = "a mapping", known=None) -> dict:
    """The run file's `bench.<suite>` mapping ({} when absent), or a ConfigError naming the key; with
    `known` (the suite's option names), an unknown option is refused too, not ignored."""
    from nemo_rl_specdec.config.run import ConfigError

    b = cfg.get(f"bench.{suite}", {}) or {}
    if not isinstance(b, dict):
        raise ConfigError(f"bench.{suite}: got {b!r}; allowed: {allowed}")
    unknown = sorted(set(b) - set(known)) if known is not None else []
    if unknown:
        raise ConfigError(f"bench.{suite}.{unknown[0]}: unknown option; {nearest(unknown[0], known)}allowed: "
                          f"{sorted(known)}")
    return b


def nearest(key, known) -> str:
    """'did you mean 'x'? ' for the known name nearest to `key`, or ''."""
    import difflib

    close = difflib.get_close_matches(str(key), [str(k) for k in known], n=1, cutoff=0.5)
    return f"did you mean '{close[0]}'? " if close else ""


def option(b: dict, suite: str, key: str, default, lo, hi, kind: type = int):
    """`bench.<suite>.<key>` (or `default`) as an integer (kind int) or a finite number in [lo, hi]."""
    from nemo_rl_specdec.config.schema import float_setting, int_setting

    path = f"bench.{suite}.{key}"
    v = b.get(key, default)
    return int_setting(v, path, lo, hi) if kind is int else float_setting(v, path, lo, hi)


def names_option(o: dict, suite: str, key: str, allowed) -> list:
    """`bench.<suite>.<key>`: a list (or comma-separated string) of names from `allowed`, at least one;
    ConfigError naming the key otherwise."""
    from nemo_rl_specdec.config.run import ConfigError

    names = o[key]
    if isinstance(names, str):
        names = [n for n in names.split(",") if n]
    if not isinstance(names, list) or not names or any(n not in allowed for n in names):
        raise ConfigError(f"bench.{suite}.{key}: got {o[key]!r}; allowed: a non-empty subset of {list(allowed)}")
    return names


DEFAULT_HARDWARE = "h100_qwen3_8b"


def hardware_option(b: dict, suite: str):
    """`bench.<suite>.hardware`: the hardware profile the suite prices its traces on (`cost/profile.py`;
    default h100_qwen3_8b), loaded before any engine starts."""
    from nemo_rl_specdec.demo.run import named_profile

    return named_profile(b.get("hardware", DEFAULT_HARDWARE), f"bench.{suite}.hardware")


def print_table(results: list[dict], columns: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(show_lines=False)
    for c in columns:
        t.add_column(c)
    for r in results:
        row = []
        for c in columns:
            v = r.get(c)
            row.append(f"{v:.3f}" if isinstance(v, float) else ("-" if v is None else str(v)))
        t.add_row(*row)
    Console(width=max(160, Console().width)).print(t)


def run(args) -> int:
    from nemo_rl_specdec.config.run import ConfigError, load_run_config
    from nemo_rl_specdec.demo.task import run_prompt_format, run_task_families

    suite = args.suite or "drafters"
    if suite not in SUITES:
        raise ConfigError(f"--suite: got {suite!r}; allowed: {sorted(SUITES)}")
    cfg = load_run_config(args.run_yaml, args.overrides)
    sections = cfg.get("bench", {}) or {}
    if not isinstance(sections, dict):
        raise ConfigError(f"bench: got {sections!r}; allowed: a mapping of suite names to their options")
    for name in sections:
        if name not in SUITES:
            raise ConfigError(f"bench.{name}: unknown suite; {nearest(name, SUITES)}allowed: {sorted(SUITES)}")
    # the suites' workloads read these once engines are up: a bad value fails here
    run_prompt_format(cfg)
    run_task_families(cfg)
    mod = importlib.import_module(SUITES[suite])
    results = mod.run(cfg, args)
    required = getattr(mod, "REQUIRED", REQUIRED)
    for r in results:
        missing = [k for k in required if k not in r]
        if missing:
            raise RuntimeError(f"bench suite {suite!r} produced a result without {missing}: {r.get('name')}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        # compact: rows carry traces, a number per request per engine step
        Path(args.json).write_text(json.dumps({"suite": suite, "source": cfg.source, "results": results},
                                              separators=(",", ":")))
    return 0
