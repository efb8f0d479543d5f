"""The memory estimate of bench --suite distill (fake tensors + torch's MemTracker, nothing
allocated) against the same step run for real at small shapes, each drafter; and the estimate's
own rules: integer and boolean tensors stay real, floating-point ones have no storage."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nemo_rl_specdec.bench import distill as D
from nemo_rl_specdec.bench.random_models import small_shapes, write_checkpoints
from nemo_rl_specdec.train.estimate import fake_tensors

SMALL = {**D.DEFAULTS, "vocab_size": 2048, "tokens": 256, "rollouts": 4, "micro_batch_tokens": 128,
         "max_tokens": 256, "epochs": 1, "hidden_size": 64, "layers": 4, "head_dim": 32, "steps": 1, "warmup": 0,
         "teacher_dtype": "float32", "temperature": 1.0}


def test_masks_stay_real_and_select_known_rows():
    from torch._subclasses.fake_tensor import FakeTensor

    with fake_tensors():
        mask = torch.zeros(2, 3, dtype=torch.bool)
        mask[0, 1] = True
        mask[1] = True
        x = torch.randn(2, 3, 8)
        assert not isinstance(mask, FakeTensor) and int(mask.sum()) == 4
        assert isinstance(x, FakeTensor) and x[mask].shape == (4, 8)
        assert float(x.sum()) == 1.0  # a value of a fake tensor reads as 1


def _job(tmp_path, drafter: str, shapes: dict) -> dict:
    ckpts = write_checkpoints(shapes, tmp_path / "real", drafters=[drafter])
    (job,) = D.jobs({**SMALL, "drafters": [drafter]}, ckpts, "cpu")
    return job


@pytest.mark.parametrize("drafter", ["draft_model", "eagle3", "dflash", "mtp"])
def test_the_estimate_agrees_with_the_real_step_within_ten_percent(drafter, tmp_path):
    shapes = small_shapes(SMALL["vocab_size"], SMALL["hidden_size"], SMALL["layers"], SMALL["head_dim"])
    if drafter == "eagle3":
        shapes["eagle3"]["draft_vocab_size"] = 512  # a draft vocabulary, as at Qwen3-8B shapes
    job = _job(tmp_path, drafter, shapes)
    real = D.tracked_step(job)  # allocates: the tracker counts every tensor the step makes
    meta = write_checkpoints(shapes, tmp_path / "meta", drafters=[drafter], device="meta")
    (fake_job,) = D.jobs({**SMALL, "drafters": [drafter], "shape": "small", "memory": "estimated"}, meta, "cpu")
    est = D.run_job(fake_job)
    assert est["status"] == "ok", est["error"]
    assert est["memory"] == "estimated" and est["step_s"] is None
    for key in ("peak_bytes", "transient_bytes"):
        assert real[key] > 0
        assert abs(est[key] - real[key]) <= 0.10 * real[key], (key, est[key], real[key])
    assert est["state_bytes"] == real["state_bytes"] and est["teacher_bytes"] == real["teacher_bytes"]
    if drafter == "eagle3":
        assert est["draft_vocab_size"] == real["draft_vocab_size"] == 512


def test_config_only_checkpoints_hold_no_tensors(tmp_path):
    shapes = small_shapes(SMALL["vocab_size"], SMALL["hidden_size"], SMALL["layers"], SMALL["head_dim"])
    ckpts = write_checkpoints(shapes, tmp_path, device="meta")
    for drafter, (_, path) in ckpts.items():
        files = {p.name for p in Path(path).iterdir()}
        assert "config.json" in files and not any(f.endswith(".safetensors") for f in files), (drafter, files)


def test_memory_setting_is_named_when_bad():
    from nemo_rl_specdec.config.run import ConfigError, load_run_config

    with pytest.raises(ConfigError, match="bench.distill.memory"):
        D.options(load_run_config("configs/tiny_cpu.yaml", ["bench.distill.memory=guess"]))
    with pytest.raises(ConfigError, match="bench.distill.shape"):
        D.options(load_run_config("configs/tiny_cpu.yaml", ["bench.distill.shape=qwen3-70b"]))
    assert D.resolve_memory("auto", "qwen3-8b", "cpu") == "estimated"
    assert D.resolve_memory("auto", "qwen3-8b", "cuda") == "measured"
    assert D.resolve_memory("auto", "small", "cpu") == "measured"
