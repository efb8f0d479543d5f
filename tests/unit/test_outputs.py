"""Outputs behave as in every CLI: an existing output file is overwritten and an existing output
folder reused, so a command runs twice in a row with the same paths; a path is refused only when it
cannot be written, and the refusal says why (a parent that is a file, a folder where a file is
wanted or the reverse, no permission). The engine commands' own reruns: tests/engine/test_cli_generate.py
(generate --out into an existing file), test_demo.py (demo into a folder with a former run's
artifacts) and test_priced_bench.py (bench --json over its former result)."""
from __future__ import annotations

import json
import os

import pytest

from nemo_rl_specdec import cli
from nemo_rl_specdec.config.schema import ConfigError

WRITERS = [(cmd, option, is_dir) for cmd, outs in cli.OUTPUTS.items() for option, is_dir in outs]


def test_every_writing_command_is_listed():
    assert {cmd for cmd, _, _ in WRITERS} == {"generate", "demo", "bench", "simulate", "price"}


@pytest.mark.parametrize("cmd, option, is_dir", WRITERS, ids=[f"{c} --{o}" for c, o, _ in WRITERS])
def test_an_existing_output_is_accepted_and_a_path_that_cannot_be_written_is_refused(tmp_path, cmd, option, is_dir):
    existing = tmp_path / "out"
    existing.mkdir() if is_dir else existing.write_text("a former run's output\n")
    cli.check_output(option, str(existing), is_dir)  # a rerun: overwritten or reused
    cli.check_output(option, str(tmp_path / "new" / "deeper" / "out"), is_dir)  # made on write
    wrong = tmp_path / "wrong"
    wrong.write_text("") if is_dir else wrong.mkdir()
    with pytest.raises(ConfigError, match=f"--{option}: .*wrong is an existing {'file' if is_dir else 'folder'}"):
        cli.check_output(option, str(wrong), is_dir)
    blocker = tmp_path / "afile"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=f"--{option}: .*its parent .*afile is a file"):
        cli.check_output(option, str(blocker / "sub" / "out"), is_dir)


def test_no_permission_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # root may write anywhere: the OS's answer, stood in
    with pytest.raises(ConfigError, match="no permission to write"):
        cli.check_output("json", str(tmp_path / "r.json"), False)


def test_simulate_and_price_run_twice_with_the_same_outputs(tmp_path, monkeypatch, capsys):
    from nemo_rl_specdec.cost.trace import Trace, TraceStep

    monkeypatch.chdir(tmp_path)
    trace = Trace("list", 3, [TraceStep(["a", "b"], [9, 9], [3, 2], [1, 0], 0, 1e-4)], "das").save(tmp_path / "t.json")
    for _ in range(2):
        assert cli.main(["simulate", "cpu_tiny_demo", "--json", "sim/r.json", "--plots", "sim/plots"]) == 0
        assert cli.main(["price", str(trace), "--json", "price.json"]) == 0
        capsys.readouterr()
    assert json.loads((tmp_path / "sim" / "r.json").read_text())["scenario"] == "cpu_tiny_demo"
    assert any((tmp_path / "sim" / "plots").glob("*.png"))
    assert json.loads((tmp_path / "price.json").read_text())["rows"]
