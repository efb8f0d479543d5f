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


def test_our_errors_reach_the_terminal_while_the_engines_output_stays_in_the_log(tmp_path, capfd):
    """Our own errors are not hidden: the descriptors are given back before the error is reported, and a
    demo that fails on bad input says so on the terminal, not in the log."""
    import pytest

    from nemo_rl_specdec.cli import main
    from nemo_rl_specdec.config.run import ConfigError

    log = tmp_path / "engines.log"
    with pytest.raises(ConfigError, match="grpo.mode"):
        with console.engine_output(log):
            os.write(2, b"vllm warning\n")
            raise ConfigError("grpo.mode: got 'fast'")
    os.write(2, b"the error line\n")
    assert "the error line" in capfd.readouterr().err and "the error line" not in log.read_text()
    assert main(["demo", "configs/tiny_cpu.yaml", "grpo.mode=fast", "--out", str(tmp_path / "d")]) == 2
    assert "error: grpo.mode: got 'fast'" in capfd.readouterr().err
