"""launch_errors.py: what stops NeMo-RL before its first step is one line naming it and what to do,
exit 1, and nothing is written in the working directory."""
from __future__ import annotations

import sys

import pytest
from fakes import write_file  # noqa: E402
from test_run_grpo import GOOD_RUN, POLICY  # noqa: E402

from nemo_rl_specdec import run_grpo
from nemo_rl_specdec.adapter import launch_errors


def _launch(fake_nemo_rl, tmp_path, monkeypatch, capsys, run_text=GOOD_RUN, *overrides):
    run = write_file(tmp_path / "conf" / "run.yaml", run_text)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    argv_before = list(sys.argv)
    try:
        code = run_grpo.main(["--config", str(run), *overrides])
    finally:
        sys.argv = argv_before
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return code, err, sorted(p.name for p in cwd.iterdir())


@pytest.mark.parametrize("raise_line, expected", [
    ("assert False, 'transformers 5.19.0 detected. The patch was written for <5.12.'",
     "NeMo-RL's import-time check at"),
    ("import some_optional_package_nemo_rl_needs",
     "the package `some_optional_package_nemo_rl_needs` is not installed"),
])
def test_an_import_failure_inside_nemo_rl_is_one_line_exit_1_nothing_written(
        fake_nemo_rl, tmp_path, monkeypatch, capsys, raise_line, expected):
    script = fake_nemo_rl.root / "examples" / "run_grpo.py"
    script.write_text(raise_line + "\n" + script.read_text())
    code, err, written = _launch(fake_nemo_rl, tmp_path, monkeypatch, capsys)
    assert code == 1 and written == [] and not fake_nemo_rl.out.exists()
    assert len(err) == 1 and err[0].startswith("error: importing NeMo-RL's examples/run_grpo.py failed")
    assert expected in err[0] and f"{script}:1" in err[0] and "NeMo-RL's own environment" in err[0]


def test_unreachable_weights_are_one_line_exit_1_nothing_written(fake_nemo_rl, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # what a machine without the Hub sees, without a network call
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    code, err, written = _launch(fake_nemo_rl, tmp_path, monkeypatch, capsys,
                                 GOOD_RUN.replace(POLICY, "Org/NoSuchModel"))
    assert code == 1 and written == [] and not fake_nemo_rl.out.exists()
    assert len(err) == 1
    assert err[0].startswith("error: policy.model_name=Org/NoSuchModel: its weights are not reachable")
    assert "huggingface-cli download Org/NoSuchModel" in err[0]
    code, err, _ = _launch(fake_nemo_rl, tmp_path / "b", monkeypatch, capsys, GOOD_RUN.replace(POLICY, "/no/such/dir"))
    assert code == 1 and err == ["error: policy.model_name=/no/such/dir: no such directory: point it at a model "
                                 "checkpoint directory"]


def test_a_local_cluster_without_the_gpus_the_run_asks_for_is_one_line(fake_nemo_rl, tmp_path, monkeypatch, capsys):
    """No Ray cluster to join: NeMo-RL would start one here, with its dashboard, on this machine's GPUs.
    This machine's GPU count is the one stand-in (the test must not depend on the hardware it runs on)."""
    monkeypatch.setattr(launch_errors, "running_ray_cluster", lambda: None)
    from ray._private import utils as ray_utils

    dashboard_missing = ray_utils.get_dashboard_dependency_error()
    monkeypatch.setattr(launch_errors, "gpu_count", lambda: 0)
    run = GOOD_RUN + "cluster: {gpus_per_node: 8, num_nodes: 1}\n"
    code, err, written = _launch(fake_nemo_rl, tmp_path, monkeypatch, capsys, run)
    assert code == 1 and written == [] and len(err) == 1 and not fake_nemo_rl.out.exists()
    if dashboard_missing is not None:  # this Python has minimal Ray: that is named first
        assert err[0].startswith("error: Ray's dashboard packages are missing") and "ray[default]" in err[0]
        monkeypatch.setattr(ray_utils, "get_dashboard_dependency_error", lambda: None)
        code, err, written = _launch(fake_nemo_rl, tmp_path / "b", monkeypatch, capsys, run)
        assert code == 1 and written == [] and len(err) == 1
    assert err[0] == ("error: cluster.gpus_per_node=8 but this machine has 0 CUDA GPU(s) and no Ray cluster is "
                      "running: run on a GPU node (or join a GPU cluster with RAY_ADDRESS / `ray start`), or set "
                      "cluster.gpus_per_node=0")


def test_a_running_cluster_decides_its_own_resources(monkeypatch):
    monkeypatch.setattr(launch_errors, "running_ray_cluster", lambda: "10.0.0.1:6379")
    monkeypatch.setattr(launch_errors, "gpu_count", lambda: 0)
    launch_errors.check_local_cluster({"gpus_per_node": 8})  # no error: the cluster has the GPUs, not this node
