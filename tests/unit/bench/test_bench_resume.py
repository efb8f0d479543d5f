"""bench --suite resume at a tiny scale: the state's size counted from the shapes is what a trained
distiller's `checkpoint_state` holds, the measured share stays under its cap, the DAS window is
restored whole (or cut by the cap, and then labelled so), the settings are refused by key path,
and the suite runs through the dispatcher with every row labelled measured or projected."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from nemo_rl_specdec.bench import resume as R
from nemo_rl_specdec.bench.distill import make_distiller, random_rollouts
from nemo_rl_specdec.bench.random_models import build_teacher, small_shapes, write_checkpoints
from nemo_rl_specdec.config.run import ConfigError, load_run_config

TINY = ["bench.resume.shape=small", "bench.resume.vocab_size=384", "bench.resume.draft_vocab_size=64",
        "bench.resume.measure_mb=8", "bench.resume.repeats=1", "bench.resume.rollouts_per_step=8",
        "bench.resume.problems=4", "bench.resume.response_tokens=200", "bench.resume.prompt_tokens=20",
        "bench.resume.das_measure_tokens=2000", "bench.resume.engines=2"]


def tiny_options(extra=()):
    return R.options(load_run_config("configs/tiny_cpu.yaml", TINY + list(extra)))


def _saved_bytes(state: dict) -> int:
    """Tensor bytes of a checkpoint state as torch.save writes them (a storage shared by two
    tensors once)."""
    seen, total = set(), 0

    def walk(x):
        nonlocal total
        if isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        elif isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() not in seen:
            seen.add(x.untyped_storage().data_ptr())
            total += x.untyped_storage().nbytes()

    walk(state)
    return total


@pytest.mark.parametrize("drafter", ["eagle3", "draft_model"])
def test_the_size_from_the_shapes_is_what_a_trained_distillers_checkpoint_state_holds(drafter, tmp_path):
    torch.set_num_threads(1)
    shapes = small_shapes(384, 64, 2, 32)
    shapes["eagle3"]["draft_vocab_size"] = 64  # d2t and t2d buffers
    _, lay = R.distiller_shaped(drafter, shapes, tmp_path / "fake")
    ckpts = write_checkpoints(shapes, tmp_path / "real", drafters=[drafter], device="cpu")
    teacher = build_teacher(ckpts[drafter][0], torch.float32, "cpu")
    d = make_distiller(drafter, ckpts[drafter][1], device="cpu", epochs=1, micro_batch_tokens=64)
    d.step(teacher, random_rollouts([(6, 10)] * 3, 384))
    state = d.checkpoint_state()
    assert state["optimizer"]["state"], "AdamW has state after a step"
    assert lay["state_bytes"] == _saved_bytes(state)
    assert lay["module_bytes"] == _saved_bytes(state["module"])
    assert lay["adamw_bytes"] == _saved_bytes(state["optimizer"])
    assert lay["params"] == sum(p.numel() for p in d.module.parameters() if p.requires_grad)
    assert (lay["tied_bytes"] > 0) == (drafter == "draft_model")  # tied embedding and lm_head, saved once
    assert lay["draft_vocab_size"] == (64 if drafter == "eagle3" else None)


def test_the_measured_share_is_the_largest_tensors_that_fit_the_cap():
    ts = [{"name": "a", "bytes": 100, "param": 0}, {"name": "b", "bytes": 60, "param": 1},
          {"name": "c", "bytes": 30, "param": None}, {"name": "d", "bytes": 10, "param": 2}]
    assert [t["name"] for t in R.pick(ts, 10_000, 4)] == ["a", "b", "c", "d"]
    # a: 304 with its moments and step; b no longer fits, c (a buffer: 30) and d (34) do
    assert [t["name"] for t in R.pick(ts, 370, 4)] == ["a", "c", "d"]
    assert R.pick(ts, 20, 4) == []


def test_das_rows_restore_the_whole_window_and_label_the_projection(tmp_path):
    o = tiny_options()
    one, total = R.das_rows(o, tmp_path)
    assert one["status"] == "ok" and not one["cut_by_cap"]
    w = R.das_workload(o)
    assert one["measured_tokens"] == o["suffix"]["window_steps"] * w["measured_rollouts"] * 220  # 200 + 20 each
    assert one["full_tokens"] == w["offered_tokens"] == 4 * 8 * 220
    assert one["full_basis"] == R.PROJECTED and one["state_basis"] == R.PROJECTED
    scale = one["full_tokens"] / one["measured_tokens"]
    assert one["save_s_full"] == pytest.approx(one["save_s"] * scale)
    assert one["state_bytes"] == pytest.approx(one["measured_bytes"] * scale)
    assert total["state_bytes"] == pytest.approx(2 * one["state_bytes"]) and total["full_basis"] == R.PROJECTED


def test_a_store_cut_by_its_cap_is_the_full_size_measured(tmp_path):
    o = tiny_options(["policy.generation.speculative_decoding.suffix.max_memory_mb=0.3"])
    one, _ = R.das_rows(o, tmp_path)
    assert one["cut_by_cap"] and one["full_basis"] == R.CAP_BOUND and one["measured_tokens"] > 0
    assert one["full_tokens"] == one["measured_tokens"] < 4 * R.das_workload(o)["measured_rollouts"] * 220
    assert one["save_s_full"] == one["save_s"] and one["state_bytes"] == one["measured_bytes"]


@pytest.mark.parametrize("override, match", [
    ("bench.resume.bogus=1", r"bench\.resume\.bogus: unknown option"),
    ("bench.resume.drafters=[eagle3,dflash]", r"bench\.resume\.drafters"),
    ("bench.resume.problems=3", r"bench\.resume\.rollouts_per_step: got 8 for 3 problems"),
    ("bench.resume.draft_vocab_size=385", r"bench\.resume\.draft_vocab_size"),
    ("bench.resume.measure_mb=0", r"bench\.resume\.measure_mb"),
    ("bench.resume.shape=huge", r"bench\.resume\.shape"),
    ("bench.resume.cold=maybe", r"bench\.resume\.cold"),
    ("bench.resume.dir=/no/such/dir", r"bench\.resume\.dir"),
])
def test_bad_settings_are_refused_by_key_path(override, match):
    with pytest.raises(ConfigError, match=match):
        tiny_options([override])


def test_the_suite_through_the_dispatcher(tmp_path, capsys):
    from nemo_rl_specdec import bench

    out = tmp_path / "resume.json"
    args = SimpleNamespace(run_yaml="configs/tiny_cpu.yaml", overrides=TINY + [f"bench.resume.dir={tmp_path}"],
                           suite="resume", json=str(out))
    assert bench.run(args) == 0
    rows = {r["name"]: r for r in json.loads(out.read_text())["results"]}
    assert list(rows) == ["eagle3", "draft_model", "das 1 engine", "das 2 engines"]
    assert all(r["status"] == "ok" for r in rows.values())
    e3, dm = rows["eagle3"], rows["draft_model"]
    # the head's state (about 13 MB) is over the 8 MiB cap: measured in part, projected; the draft model's fits
    assert e3["measured_bytes"] <= 8 << 20 < e3["state_bytes"] and e3["full_basis"] == R.PROJECTED
    assert dm["measured_bytes"] == dm["state_bytes"] and dm["full_basis"] == R.MEASURED
    assert dm["save_s_full"] == pytest.approx(dm["save_s"])
    for r in (e3, dm):
        assert r["file_bytes"] >= r["measured_bytes"]  # the files hold every measured tensor
        assert r["save_s_per_unit"] == pytest.approx(r["save_s"] / (r["measured_bytes"] / R.GiB))
    assert list(tmp_path.iterdir()) == [out]  # every state directory removed
    table = capsys.readouterr().out
    assert "projected" in table and "measured" in table
