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


@pytest.fixture
def hub_refusing(monkeypatch, tmp_path):
    """A Hub on loopback that refuses every request with the given status and X-Error-Code (what the real
    Hub sends for a gated repo or a missing token); the client code that reads it is huggingface_hub's."""
    import http.server
    import threading

    from huggingface_hub import constants

    reply: dict = {}

    class Refuse(http.server.BaseHTTPRequestHandler):
        def _refuse(self):
            self.send_response(reply["status"])
            if reply.get("code"):
                self.send_header("X-Error-Code", reply["code"])
            self.send_header("X-Error-Message", "Access to this model is restricted.")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_HEAD = do_GET = _refuse

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        f"http://127.0.0.1:{server.server_port}/{{repo_id}}/resolve/{{revision}}/{{filename}}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    try:
        yield reply
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("status, code, expected", [
    (401, "GatedRepo", "it is a gated repo: accept its terms on the Hub with your account, then set HF_TOKEN"),
    (403, "GatedRepo", "it is a gated repo"),
    (401, None, "it is private, gated or misnamed: check the name; for a private or gated repo set HF_TOKEN"),
])
def test_a_hub_refusal_names_hf_token(hub_refusing, status, code, expected):
    hub_refusing.update(status=status, code=code)
    with pytest.raises(launch_errors.LaunchError) as e:
        launch_errors.check_model("meta-llama/Gated-8B", "policy.model_name")
    msg = str(e.value)
    assert msg.startswith("policy.model_name=meta-llama/Gated-8B: the Hugging Face Hub refused access (")
    assert expected in msg and "HF_TOKEN to a token with access to meta-llama/Gated-8B" in msg
    assert "huggingface-cli download" not in msg and "\n" not in msg


def test_a_hub_error_other_than_access_keeps_the_download_advice(hub_refusing):
    hub_refusing.update(status=500, code=None)
    with pytest.raises(launch_errors.LaunchError, match="its weights are not reachable") as e:
        launch_errors.check_model("Org/Model", "policy.model_name")
    assert "HF_TOKEN" not in str(e.value)


def test_a_cuda_initialisation_failure_is_named_not_counted_as_zero_gpus(monkeypatch):
    """A CUDA build of torch whose driver does not come up reports 0 devices; the launch says CUDA failed.
    The failure is torch's own error, raised by the stand-in for the driver call."""
    import torch

    monkeypatch.setattr(launch_errors, "running_ray_cluster", lambda: None)
    from ray._private import utils as ray_utils

    monkeypatch.setattr(ray_utils, "get_dashboard_dependency_error", lambda: None)
    monkeypatch.setattr(launch_errors, "gpu_count", lambda: 0)
    monkeypatch.setattr(torch.version, "cuda", "13.0")

    def driver_fails():
        raise RuntimeError("CUDA driver initialization failed, you might not have a CUDA gpu.")

    monkeypatch.setattr(torch.cuda, "init", driver_fails)
    with pytest.raises(launch_errors.LaunchError) as e:
        launch_errors.check_local_cluster({"gpus_per_node": 8})
    assert str(e.value).startswith(
        "cluster.gpus_per_node=8 but CUDA failed to initialise in this Python (RuntimeError: CUDA driver "
        "initialization failed, you might not have a CUDA gpu.) and no Ray cluster is running")
    assert "0 CUDA GPU" not in str(e.value)
    monkeypatch.setattr(torch.version, "cuda", None)  # a CPU build: no GPUs is the plain truth
    with pytest.raises(launch_errors.LaunchError, match="this machine has 0 CUDA GPU"):
        launch_errors.check_local_cluster({"gpus_per_node": 8})


def test_debug_re_raises_a_launch_error_with_its_traceback(fake_nemo_rl, tmp_path, monkeypatch, capsys):
    script = fake_nemo_rl.root / "examples" / "run_grpo.py"
    script.write_text("import some_optional_package_nemo_rl_needs\n" + script.read_text())
    monkeypatch.setenv(launch_errors.DEBUG_ENV, "1")
    with pytest.raises(launch_errors.LaunchError, match="some_optional_package_nemo_rl_needs") as e:
        _launch(fake_nemo_rl, tmp_path, monkeypatch, capsys)
    assert isinstance(e.value.__cause__, ModuleNotFoundError)  # the original error and its traceback
    monkeypatch.setenv(launch_errors.DEBUG_ENV, "0")
    code, err, _ = _launch(fake_nemo_rl, tmp_path / "b", monkeypatch, capsys)
    assert code == 1 and len(err) == 1


def test_debug_re_raises_a_config_error(fake_nemo_rl, tmp_path, monkeypatch, capsys):
    from nemo_rl_specdec.config.run import ConfigError

    monkeypatch.setenv(launch_errors.DEBUG_ENV, "1")
    with pytest.raises(ConfigError):
        _launch(fake_nemo_rl, tmp_path, monkeypatch, capsys, GOOD_RUN, "policy.generation.speculative_decoding.k=3")
