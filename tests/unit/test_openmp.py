"""The Intel OpenMP preload: found in the venv, detected in LD_PRELOAD, re-exec only when due."""
import os
import subprocess
import sys

import pytest

from nemo_rl_specdec import openmp


def test_preloaded_detects_the_library_among_others():
    assert openmp.preloaded({"LD_PRELOAD": "/x/libfoo.so /venv/lib/libiomp5.so"})
    assert openmp.preloaded({"LD_PRELOAD": "/venv/lib/libiomp5.so:/x/libfoo.so"})
    assert not openmp.preloaded({"LD_PRELOAD": "/x/libiomp5.so.bak"})
    assert not openmp.preloaded({})


def test_reexec_returns_when_opted_out_or_already_done(monkeypatch):
    calls = []
    monkeypatch.setattr(os, "execve", lambda *a: calls.append(a))
    monkeypatch.setenv(openmp.OPT_OUT, "1")
    openmp.reexec_with_iomp(["demo"])
    monkeypatch.delenv(openmp.OPT_OUT)
    monkeypatch.setenv(openmp._DONE, "1")
    openmp.reexec_with_iomp(["demo"])
    assert calls == []


def test_reexec_sets_ld_preload_and_runs_the_cli(monkeypatch, tmp_path):
    lib = tmp_path / "lib" / openmp.LIB
    lib.parent.mkdir()
    lib.write_bytes(b"")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.delenv(openmp._DONE, raising=False)
    monkeypatch.delenv(openmp.OPT_OUT, raising=False)
    monkeypatch.setenv("LD_PRELOAD", "/x/libother.so")
    calls = []
    monkeypatch.setattr(os, "execve", lambda exe, argv, env: calls.append((exe, argv, env)))
    openmp.reexec_with_iomp(["bench", "x.yaml", "a=b"])
    (exe, argv, env), = calls
    assert argv[1:] == ["-m", "nemo_rl_specdec.cli", "bench", "x.yaml", "a=b"]
    assert env["LD_PRELOAD"] == f"{lib} /x/libother.so" and env[openmp._DONE] == "1"
    monkeypatch.delenv(openmp._DONE, raising=False)
    openmp.reexec_with_iomp(["--requests", "2"], entry=("examples/generate_cpu.py",))  # a script re-runs itself
    assert calls[1][1][1:] == ["examples/generate_cpu.py", "--requests", "2"]


@pytest.mark.skipif(not sys.platform.startswith("linux") or openmp.iomp_path() is None,
                    reason="intel-openmp is not installed in this environment")
def test_preloaded_iomp_loads_beside_this_torch():
    """The environment the re-exec builds: libiomp5 is mapped and torch's parallel ops still run."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", openmp._DONE)}
    env["LD_PRELOAD"] = openmp.iomp_path()
    code = ("import torch; torch.set_num_threads(2); a = torch.ones(256, 256); "
            "assert float((a @ a).sum()) == 256.0 ** 3; "
            f"print(open('/proc/self/maps').read().count('{openmp.LIB}') > 0)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("True"), out.stderr[-2000:]


def test_thread_requests_apply_or_say_why_not(monkeypatch, caplog):
    """After a vLLM CPU engine bound its threads, torch.set_num_threads is vLLM's no-op (whose
    warning the engine filters): the request is reported as not applied instead of vanishing."""
    import torch

    calls = []

    def setter(n):
        calls.append(n)

    monkeypatch.setattr(torch._C, "set_num_threads", setter)
    monkeypatch.setattr(torch, "set_num_threads", setter)
    assert openmp.request_torch_threads(3) and calls == [3]
    assert not openmp.request_torch_threads(None) and calls == [3]
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # what vLLM installs
    with caplog.at_level("WARNING", logger="nemo_rl_specdec"):
        assert not openmp.request_torch_threads(2)
    assert calls == [3] and "num_threads=2 not applied" in caplog.text
