"""demo/console.py: while engines run, what the process writes to its file descriptors 1 and 2 goes to the log,
and our lines still reach the terminal."""
import os
import subprocess
import sys

from nemo_rl_specdec.demo import console


def test_engine_output_goes_to_the_log_and_ours_to_the_terminal(tmp_path, capfd, monkeypatch):
    log = tmp_path / "sub" / "engines.log"
    with console.engine_output(log) as where:
        assert where == log
        os.write(1, b"vllm says INFO\n")
        os.write(2, b"torch says UserWarning\n")
        # a child process inherits the descriptors, as an engine's worker does
        subprocess.run([sys.executable, "-c", "import sys; print('worker'); print('werr', file=sys.stderr)"],
                       check=True)
        print("our table", file=console.out(), flush=True)
        print("our progress", file=console.err(), flush=True)
    os.write(1, b"after\n")
    got = capfd.readouterr()
    assert "our table" in got.out and "after" in got.out and "our progress" in got.err
    for noise in ("vllm says", "torch says", "worker", "werr"):
        assert noise not in got.out + got.err
        assert noise in log.read_text()
    assert console.out() is sys.stdout and console.err() is sys.stderr


def test_the_width_follows_columns_up_to_100(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert console.width() == 80
    monkeypatch.setenv("COLUMNS", "250")
    assert console.width() == console.MAX_WIDTH == 100
