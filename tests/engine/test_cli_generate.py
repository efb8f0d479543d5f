"""`nemo-rl-specdec generate` on the bundled tiny policy: one JSON line per sample (over a former run's
output file), and the last stdout line is the run's spec metrics."""
from __future__ import annotations

import json

from nemo_rl_specdec import cli


def test_generate_writes_one_line_per_sample_and_the_metrics(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "add mod 100: a 12 b 7 c 40\n", "problem_id": "p0"}) + "\n"
                       + json.dumps({"prompt_token_ids": [5, 6, 7, 8, 9]}) + "\n")
    out = tmp_path / "r" / "rollouts.jsonl"
    out.parent.mkdir()
    out.write_text('{"a former run": true}\n' * 9)  # a rerun: the existing output file is overwritten
    assert cli.main(["generate", "configs/tiny_cpu.yaml", "policy.generation.max_new_tokens=32",
                     "--prompts", str(prompts), "--out", str(out), "--n", "2"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["prompt_index"], r["sample_index"]) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [r["problem_id"] for r in rows] == ["p0", "p0", None, None]
    assert all(0 < len(r["token_ids"]) == len(r["logprobs"]) <= 32 for r in rows)
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["spec_enabled"] and summary["drafter"] == "suffix" and summary["samples"] == 4
    assert summary["generated_tokens"] == sum(len(r["token_ids"]) for r in rows)
