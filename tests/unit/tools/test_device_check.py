"""The device check runs on a CPU too (`--device cpu`): its tiny part on the bundled assets and its
measurement part at small shapes, in processes that cannot import vLLM or Ray (the GPU machines
it is for have neither), with one table and the JSON it writes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tools.device_check import COLUMNS, format_table

REPO = Path(__file__).resolve().parents[3]

# run in a fresh interpreter where importing vllm or ray fails, then check neither is in sys.modules
RUN = """
import importlib.abc, sys

class NoServingStack(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("vllm", "ray"):
            raise ImportError(f"the device check imported {name}")
        return None

sys.meta_path.insert(0, NoServingStack())
from tools import device_check
rc = device_check.main(sys.argv[1:])
left = sorted(m for m in sys.modules if m.split(".")[0] in ("vllm", "ray"))
assert not left, left
sys.exit(rc)
"""


def _run(args, timeout=120):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "")
                                                                     .split(os.pathsep) if p])}
    res = subprocess.run([sys.executable, "-c", RUN, *args], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def test_tiny_part_on_cpu_imports_no_serving_stack_and_reports_every_cell(tmp_path):
    out = tmp_path / "check.json"
    stdout = _run(["--device", "cpu", "--skip-8b", "--skip-forwards", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["environment"]["imported_vllm_or_ray"] == []
    assert report["environment"]["device"] == "cpu" and report["8b"] == []
    cells = {(c["drafter"], c["teacher_dtype"]): c for c in report["tiny"]}
    assert set(cells) == {(d, t) for d in ("draft_model", "eagle3", "dflash", "mtp") for t in ("float32", "bfloat16")}
    for (drafter, dtype), c in cells.items():
        assert c["status"] in ("ok", "failed") and c["part"] == "tiny"
        if c["status"] == "ok":
            assert c["error"] is None and len(c["steps"]) == 2 and c["steps"][0]["trained_positions"] > 0
        else:
            assert c["error"]
            assert f"tiny {drafter} {dtype}: {c['error']}" in stdout  # the error is printed under the table
        if dtype == "float32":  # a float32 policy is what every distiller was written against
            assert c["status"] == "ok", c["error"]
    lines = stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("part"))
    assert all(h in lines[header] for h, _, _ in COLUMNS)
    table = [line.split() for line in lines[header + 2:] if not line.startswith("tiny ") or ": " not in line]
    assert sorted((r[1], r[2]) for r in table) == sorted(cells) and all(r[0] == "tiny" for r in table)
    assert all(r[3] == cells[(r[1], r[2])]["status"] for r in table)


def test_measurement_part_at_small_shapes_writes_the_bench_rows(tmp_path):
    out = tmp_path / "check.json"
    stdout = _run(["--device", "cpu", "--skip-tiny", "--shape", "small", "--vocab-size", "256", "--tokens", "64",
                   "--teacher-dtype", "float32", "--drafters-8b", "draft_model", "--steps", "1", "--warmup", "0",
                   "--skip-forwards", "--out", str(out)], timeout=600)
    report = json.loads(out.read_text())
    assert report["tiny"] == [] and report["shapes"]["teacher"]["vocab_size"] == 256
    row, est = report["8b"]  # measured, then the same drafter's memory estimated under fake tensors
    assert row["part"] == "small" and row["drafter"] == "draft_model" and row["status"] == "ok", row["error"]
    assert row["transient_bytes"] == row["peak_bytes"] - row["teacher_bytes"] - row["state_bytes"]
    assert row["state_bytes"] == row["distiller_params"] * 4 * 4
    assert row["memory"] == "measured" and est["memory"] == "estimated" and est["status"] == "ok", est["error"]
    assert est["part"] == "small est" and est["drafter"] == "draft_model" and est["step_s"] is None
    assert (est["state_bytes"], est["teacher_bytes"]) == (row["state_bytes"], row["teacher_bytes"])
    lines = stdout.splitlines()
    assert any(line.startswith("small ") and "draft_model" in line and " measured " in line for line in lines)
    assert any(line.startswith("small est") and "draft_model" in line and " estimated " in line for line in lines)


def test_forward_part_writes_a_samples_file_per_shape_beside_the_report(tmp_path):
    out = tmp_path / "check.json"
    stdout = _run(["--device", "cpu", "--skip-tiny", "--skip-8b", "--forwards", "tiny", "--forward-reps", "1",
                   "--out", str(out)])
    (row,) = json.loads(out.read_text())["forwards"]
    assert row["status"] == "ok", row["error"]
    samples = json.loads((tmp_path / "forward_tiny.json").read_text())
    assert row["samples"] == len(samples["samples"]) > 0 and samples["model"]["kv_bytes_per_token"] > 0
    assert {s["ctx"] for s in samples["samples"]} == {64, 256}
    assert any(line.startswith("forwards") and " tiny " in line and " ok " in line for line in stdout.splitlines())


def test_table_prints_dashes_for_missing_values_and_errors_below():
    rows = [{"part": "tiny", "drafter": "eagle3", "teacher_dtype": "bfloat16", "status": "failed",
             "error": "step: RuntimeError: dtype"},
            {"part": "qwen3-8b", "drafter": "draft_model", "teacher_dtype": "bfloat16", "status": "ok", "error": None,
             "step_s": 1.5, "step_s_min": 1.25, "step_s_max": 2.0, "teacher_bytes": 16_400_000_000,
             "state_bytes": 9_500_000_000, "transient_bytes": 3_000_000_000, "peak_bytes": 28_900_000_000}]
    lines = format_table(rows).splitlines()
    assert lines[0].split() == [w for h, _, _ in COLUMNS for w in h.split()]
    assert set(lines[1]) <= {"-", " "}
    assert lines[2].split()[:4] == ["tiny", "eagle3", "bfloat16", "failed"] and lines[2].split()[4:] == ["-"] * 8
    assert lines[3].split()[4:] == ["-", "1.500", "1.250", "2.000", "16.400", "9.500", "3.000", "28.900"]
    assert lines[4] == "tiny eagle3 bfloat16: step: RuntimeError: dtype"
