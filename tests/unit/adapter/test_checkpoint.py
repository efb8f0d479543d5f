"""checkpoint.py: the marker our hook writes into each checkpoint NeMo-RL starts, and the launcher's
refusal of a resume from a checkpoint written without the block or with another drafter."""
from __future__ import annotations

import json
import sys

import pytest
from fakes import STAND_INS, gen_cfg, write_file

from nemo_rl_specdec import run_grpo
from nemo_rl_specdec.adapter import api, checkpoint, translate
from nemo_rl_specdec.config.run import ConfigError
from nemo_rl_specdec.resources import asset_path

EAGLE = {"drafter": "eagle3", "eagle3": {"model": str(asset_path("tiny", "eagle3"))}}
DAS = {"drafter": "suffix", "suffix": {"backend": "das"}}


def _spec(block):
    return translate.enabled_spec(gen_cfg(**block))


def _run(ckpt_dir) -> dict:
    return {"checkpointing": {"enabled": True, "checkpoint_dir": str(ckpt_dir)}}


class _Generation:
    """The engines' side of a save (our VllmGeneration's `specdec_export_state`): one engine's versions."""

    def specdec_export_state(self):
        return {"engines": [{"version": 2, "pending": None,
                             "worker": {"state": {"policy_version": 2, "drafter_version": 2}, "proposer": None}}],
                "planner": {"predictor": {}, "acceptance": None}}


def _saved(tmp_path, block, step=2):
    """A checkpoint as NeMo-RL's CheckpointManager leaves it, written with our hook installed for `block`."""
    manager_cls = STAND_INS[api.CHECKPOINT_MANAGER]
    session = checkpoint.Session(_spec(block))
    generation = _Generation()
    session.attach_generation(generation)
    hooked = checkpoint.wrap_init_tmp_checkpoint(manager_cls.init_tmp_checkpoint, session)
    manager = manager_cls({"checkpoint_dir": str(tmp_path / "ckpt")})
    path = hooked(manager, step, {"current_step": step})
    manager.finalize_checkpoint(path)
    return tmp_path / "ckpt" / f"step_{step}"


def test_install_marks_every_checkpoint_and_uninstall_removes_the_hook(fake_nemo_rl, tmp_path):
    manager_cls = STAND_INS[api.CHECKPOINT_MANAGER]
    original = manager_cls.init_tmp_checkpoint
    undo = run_grpo.install({}, gen_cfg(**EAGLE, refresh={"mode": "frozen"}))  # online needs policy hooks
    generation = _Generation()
    checkpoint.session().attach_generation(generation)
    try:
        path = manager_cls({"checkpoint_dir": str(tmp_path)}).init_tmp_checkpoint(3, {"current_step": 3})
    finally:
        run_grpo.uninstall(undo)
    assert manager_cls.init_tmp_checkpoint is original and checkpoint.session() is None
    marker = json.loads((path / checkpoint.MARKER).read_text())
    assert marker == {"format": checkpoint.FORMAT, "version": checkpoint.VERSION, "drafter": "eagle3",
                      "model": EAGLE["eagle3"]["model"], "state": checkpoint.STATE_DIR}
    assert (path / checkpoint.STATE_DIR / checkpoint.ENGINES).is_file()
    assert (path / "training_info.json").exists()  # NeMo-RL's own files are untouched


def test_install_without_the_hook_refuses_and_patches_nothing(fake_nemo_rl, monkeypatch):
    monkeypatch.delattr(STAND_INS[api.CHECKPOINT_MANAGER], "init_tmp_checkpoint")
    with pytest.raises(api.UnsupportedNeMoRL, match=r"CheckpointManager\.init_tmp_checkpoint.*marks each checkpoint"):
        run_grpo.install({}, gen_cfg(**DAS))


def test_resume_from_a_checkpoint_of_the_same_drafter_goes_ahead(tmp_path):
    assert checkpoint.check_resume(_run(tmp_path / "ckpt"), _spec(DAS)) is None  # nothing to resume
    step = _saved(tmp_path, EAGLE)
    assert checkpoint.check_resume(_run(tmp_path / "ckpt"), _spec(EAGLE)) == step
    assert checkpoint.check_resume(_run(tmp_path / "ckpt"), None) is None  # no block: NeMo-RL unchanged


def test_resume_reads_the_checkpoint_nemo_rl_resumes_from(tmp_path):
    """The highest step_N, as NeMo-RL's get_latest_checkpoint_path picks (numeric, not by name)."""
    _saved(tmp_path, DAS, step=10)
    _saved(tmp_path, EAGLE, step=9)
    (tmp_path / "ckpt" / "tmp_step_11").mkdir()
    assert checkpoint.check_resume(_run(tmp_path / "ckpt"), _spec(DAS)).name == "step_10"


def test_resume_from_a_checkpoint_written_without_the_block_is_refused(tmp_path):
    step = tmp_path / "ckpt" / "step_2"
    write_file(step / "training_info.json", "{}")
    with pytest.raises(ConfigError) as e:
        checkpoint.check_resume(_run(tmp_path / "ckpt"), _spec(EAGLE))
    msg = str(e.value)
    assert msg.startswith("checkpointing.checkpoint_dir: NeMo-RL would resume from ")
    assert str(step) in msg and "written without policy.generation.speculative_decoding" in msg
    assert "asks for drafter='eagle3'" in msg and "set checkpointing.checkpoint_dir to a new directory" in msg


DRAFT = {"drafter": "draft_model", "draft_model": {"model": str(asset_path("tiny", "draft"))}}


@pytest.mark.parametrize("other", [EAGLE, {"drafter": "suffix", "suffix": {"backend": "vllm"}}, DRAFT])
def test_resume_from_a_checkpoint_of_another_drafter_is_refused(tmp_path, other):
    step = _saved(tmp_path, DAS)
    with pytest.raises(ConfigError) as e:
        checkpoint.check_resume(_run(tmp_path / "ckpt"), _spec(other))
    msg = str(e.value)
    assert str(step) in msg
    assert "written with policy.generation.speculative_decoding drafter='suffix' (backend das)" in msg
    assert f"asks for {checkpoint.describe(checkpoint.identity(_spec(other)))}" in msg
    assert "to start fresh" in msg


def test_a_marker_that_is_not_ours_is_refused(tmp_path):
    step = _saved(tmp_path, DAS)
    (step / checkpoint.MARKER).write_text("{not json")
    with pytest.raises(ConfigError, match=r"checkpoint_dir: .*speculative_decoding\.json is not readable"):
        checkpoint.check_resume(_run(tmp_path / "ckpt"), _spec(DAS))
    (step / checkpoint.MARKER).write_text(json.dumps({"format": "other"}))
    with pytest.raises(ConfigError, match="is not a nemo-rl-specdec/checkpoint marker of a version this package reads"):
        checkpoint.check_resume(_run(tmp_path / "ckpt"), _spec(DAS))


def test_the_launcher_refuses_the_resume_before_nemo_rl_starts(fake_nemo_rl, tmp_path, capsys):
    write_file(tmp_path / "ckpt" / "step_2" / "training_info.json", "{}")
    run = write_file(tmp_path / "run.yaml", f"""defaults: nemo_rl:examples/configs/grpo_math_1B.yaml
policy:
  model_name: {asset_path("tiny", "policy")}
  generation:
    speculative_decoding:
      enabled: true
      drafter: ngram
checkpointing:
  checkpoint_dir: {tmp_path / "ckpt"}
""")
    argv = list(sys.argv)
    try:
        assert run_grpo.main(["--config", str(run)]) == run_grpo.EXIT_CONFIG
    finally:
        sys.argv = argv
    err = capsys.readouterr().err
    assert err.startswith("error: checkpointing.checkpoint_dir: NeMo-RL would resume from") and err.count("\n") == 1
    assert "drafter='ngram'" in err
    assert not fake_nemo_rl.out.exists()  # NeMo-RL's main never ran
