"""examples/generate_cpu.py runs: one engine on the bundled tiny policy with speculation on, two rounds of
rollouts, and the second round drafts from the first round's rollouts (DAS)."""
from __future__ import annotations

import runpy
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "generate_cpu.py"


def test_the_cpu_example_drafts_and_accepts_more_after_the_update(capsys):
    main = runpy.run_path(str(EXAMPLE), run_name="example")["main"]
    rounds = main(["--requests", "4", "--max-new-tokens", "64"])
    first, second = rounds["first round"], rounds["second round"]
    assert first["draft_tokens"] > 0 and second["draft_tokens"] > 0
    assert second["accepted_tokens"] > first["accepted_tokens"]  # the drafter now holds the first round's rollouts
    out = capsys.readouterr().out
    assert "drafter: suffix, k=24, 4 requests per round" in out and "second round:" in out
