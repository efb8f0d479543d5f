"""Refit a hardware profile's history-proposer constants on a bench result's replay traces, and write them.

    python -m nemo_rl_specdec.cost.refit runs/bench/das.json --hardware h100_qwen3_8b \\
        --rows das_w4_both=das,vllm_suffix=vllm_suffix,vllm_suffix_default=vllm_suffix_default,ngram=ngram

Each ``ROW=ENTRY`` fits the profile's entry ENTRY (``step_overhead_s``, ``per_request_s``) on the
replay traces of the result ROW (`price.fit_proposer`: non-negative least squares of each decode
step's measured proposer time on its requests), and rewrites those two keys of the entry in the
profile's YAML file, its comments and every other line left as they are. The constants serve the
simulator and the per-step rules' replays; a verdict prices every row with the proposer time
measured in its own run (docs/pricing.md). ``--dry-run`` prints the fits without writing.

An entry the profile does not have, a row the result does not have, or a row whose traces are not a
history drafter's is one ``error:`` line naming it; the file is written only when every fit succeeded.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from nemo_rl_specdec.cost.price import fit_proposer
from nemo_rl_specdec.cost.profile import load_profile, profile_path
from nemo_rl_specdec.cost.schema import CostError
from nemo_rl_specdec.cost.trace import Trace, TraceError, read_json

KEYS = ("step_overhead_s", "per_request_s")


def result_traces(path: str, row: str) -> list[Trace]:
    """The replay traces of the result `row` of a bench result JSON (`--json` of `bench`)."""
    d = read_json(path)
    results = d.get("results") if isinstance(d, dict) else None
    if not isinstance(results, list):
        raise TraceError(f"{path}: results: missing; allowed: a bench result JSON (bench --json)")
    by = {r.get("name"): r for r in results if isinstance(r, dict)}
    if row not in by:
        raise TraceError(f"--rows: {row!r} is not a result of {path}; it has {sorted(n for n in by if n)}")
    steps = by[row].get("replay_per_step") or []
    if not steps:
        raise TraceError(f"--rows: {row!r} in {path} has no replay traces")
    return [Trace.from_dict(s["trace"]) for s in steps]


def write_constants(text: str, entry: str, values: dict) -> str:
    """`text` (a profile's YAML) with the keys of `values` rewritten inside ``drafters.<entry>``; every
    key must already be there (a profile entry of a history drafter has both)."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if re.match(rf"^  {re.escape(entry)}:\s*(#.*)?$", ln)), None)
    if start is None:
        raise CostError(f"drafters.{entry}: not in the profile's file; add the entry (name, kind: list and both "
                        f"{' and '.join(KEYS)}) before refitting it")
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"^ {0,2}\S", lines[i])), len(lines))
    for key, value in values.items():
        at = next((i for i in range(start + 1, end) if re.match(rf"^    {key}:", lines[i])), None)
        if at is None:
            raise CostError(f"drafters.{entry}.{key}: not in the profile's file; add it before refitting")
        m = re.match(r"^(    \S+:\s*)[^#\n]*?(\s*(#.*)?\n?)$", lines[at])
        assert m is not None   # the line starts with the key
        lines[at] = f"{m.group(1)}{value:.3g}{m.group(2)}"
    return "".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nemo_rl_specdec.cost.refit", description=__doc__.split("\n\n")[0])
    ap.add_argument("result", help="a bench result JSON with replay traces (bench --suite das --json OUT)")
    ap.add_argument("--hardware", required=True, help="the profile to write (a name in configs/hardware/ or a path)")
    ap.add_argument("--rows", required=True, help="ROW=ENTRY,...: fit the profile's ENTRY on the result ROW's traces")
    ap.add_argument("--dry-run", action="store_true", help="print the fits, write nothing")
    args = ap.parse_args(argv)
    try:
        profile = load_profile(args.hardware)
        pairs = [p.split("=", 1) for p in args.rows.split(",") if p]
        if not pairs or any(len(p) != 2 or not all(p) for p in pairs):
            raise CostError(f"--rows: {args.rows!r}; allowed: ROW=ENTRY pairs, comma-separated")
        path = profile_path(args.hardware)
        text = path.read_text(encoding="utf-8")
        for row, entry in pairs:
            d = profile.drafter(entry)
            if d.kind != "list":
                raise CostError(f"--rows: {entry!r} is a {d.kind} drafter's entry; allowed: a history drafter's")
            fit = fit_proposer(result_traces(args.result, row))
            values = {k: fit[k] for k in KEYS}
            text = write_constants(text, entry, values)
            print(f"{entry} <- {row}: step_overhead_s {fit['step_overhead_s']:.3g} (was {d.step_overhead_s:.3g}), "
                  f"per_request_s {fit['per_request_s']:.3g} (was {d.per_request_s:.3g}); {fit['kept']} of "
                  f"{fit['steps']} decode steps, R^2 {fit['r2']:.2f}")
        if not args.dry_run:
            Path(path).write_text(text, encoding="utf-8")
            load_profile(str(path))   # the written file still validates
            print(f"wrote {path}")
    except (CostError, TraceError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
