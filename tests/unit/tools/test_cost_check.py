"""tools/cost_check.py: the cost paths agree on the same step, and the profile's error on the device check's
timed forwards is printed per file."""
from __future__ import annotations

from pathlib import Path

import pytest

from nemo_rl_specdec.cost.profile import load_profile
from tools import cost_check

REPO = Path(__file__).resolve().parents[3]


def test_the_paths_that_price_a_step_agree():
    rows = cost_check.agreement(load_profile("h100_qwen3_8b"))
    assert [r["requests"] for r in rows] == list(cost_check.SIZES)
    for r in rows:
        assert r["price"] == pytest.approx(r["step_cost"], rel=1e-12)
        # the rules see the step's sums: the same function at the step's mean context
        assert r["priced_split"] == r["simulator_split"] == pytest.approx(r["step_cost"], rel=1e-3)


def test_the_profile_error_is_printed_per_timed_forward(capsys):
    err = cost_check.profile_error(load_profile("h200_qwen3_8b"), REPO / "benchmarks/device_check/h200")
    assert {e["entry"] for e in err} == {"target", "eagle3", "mtp", "dflash", "draft_model"}
    assert all(e["samples"] > 0 and e["median_abs_rel_error"] < 0.2 for e in err)
    samples = str(REPO / "benchmarks/device_check/h200")
    assert cost_check.main(["--hardware", "h200_qwen3_8b", "--samples", samples]) == 0
    out = capsys.readouterr().out
    assert "forward_qwen3-0.6b.json" in out and "max/min" in out
