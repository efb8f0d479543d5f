"""cost/refit.py: a profile's history-proposer constants refitted on a bench result's replay traces and
written into the profile's file, every other line kept."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from nemo_rl_specdec.cost import refit
from nemo_rl_specdec.cost.profile import load_profile
from nemo_rl_specdec.cost.trace import Trace, TraceStep

REPO = Path(__file__).resolve().parents[3]


def _trace(overhead: float, per_request: float) -> Trace:
    steps = [TraceStep([], [], [], [], 40, None, 4)]
    for n in (1, 2, 3, 4, 4, 3, 2, 1):
        rids = list(range(n))
        steps.append(TraceStep(rids, [10] * n, [2] * n, [1] * n, 0, overhead + per_request * n))
    return Trace("list", 4, steps, "das", "replay")


def _result(tmp_path: Path) -> Path:
    rows = [{"name": "das_w4_both", "replay_per_step": [{"trace": _trace(2e-5, 3e-5).to_dict()}]},
            {"name": "vllm_suffix_default", "replay_per_step": [{"trace": _trace(1e-5, 1.5e-5).to_dict()}]},
            {"name": "no_replay"}]
    p = tmp_path / "das.json"
    p.write_text(json.dumps({"results": rows}))
    return p


def test_the_refit_writes_the_fitted_constants_into_the_profiles_entries(tmp_path, capsys):
    profile = tmp_path / "h100.yaml"
    shutil.copy(REPO / "configs/hardware/h100_qwen3_8b.yaml", profile)
    before = profile.read_text().splitlines()
    rc = refit.main([str(_result(tmp_path)), "--hardware", str(profile),
                     "--rows", "das_w4_both=das,vllm_suffix_default=vllm_suffix_default"])
    assert rc == 0, capsys.readouterr().err
    p = load_profile(str(profile))
    assert (p.drafter("das").step_overhead_s, p.drafter("das").per_request_s) == pytest.approx((2e-5, 3e-5), rel=1e-2)
    d = p.drafter("vllm_suffix_default")
    assert (d.step_overhead_s, d.per_request_s) == pytest.approx((1e-5, 1.5e-5), rel=1e-2)
    old = load_profile("h100_qwen3_8b")
    assert p.drafter("vllm_suffix").per_request_s == old.drafter("vllm_suffix").per_request_s   # not named: kept
    after = profile.read_text().splitlines()
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    assert len(changed) == 4 and all("_s:" in after[i] for i in changed)   # comments and every other line kept
    assert "wrote" in capsys.readouterr().out


def test_a_dry_run_writes_nothing_and_bad_rows_or_entries_are_named(tmp_path, capsys):
    profile = tmp_path / "h100.yaml"
    shutil.copy(REPO / "configs/hardware/h100_qwen3_8b.yaml", profile)
    text = profile.read_text()
    result = str(_result(tmp_path))
    assert refit.main([result, "--hardware", str(profile), "--rows", "das_w4_both=das", "--dry-run"]) == 0
    assert profile.read_text() == text
    for rows, named in (("nope=das", "'nope' is not a result"), ("no_replay=das", "has no replay traces"),
                        ("das_w4_both=eagle3", "'eagle3' is a model drafter's entry"),
                        ("das_w4_both=missing", "drafters.missing"), ("das_w4_both", "ROW=ENTRY")):
        assert refit.main([result, "--hardware", str(profile), "--rows", rows]) == 2
        assert named in capsys.readouterr().err
        assert profile.read_text() == text   # nothing written when a fit fails
