"""bench --suite distill at a tiny scale: the memory split's arithmetic, the rollouts, the settings,
the suite through the dispatcher (one worker process per drafter) and a drafter that fails
becoming a failed row instead of ending the suite."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from nemo_rl_specdec.bench import distill as D
from nemo_rl_specdec.bench.memory import PeakMemory, split_memory, state_bytes, tensor_bytes
from nemo_rl_specdec.bench.random_models import small_shapes, write_checkpoints
from nemo_rl_specdec.config.run import ConfigError, load_run_config

TINY = ["bench.distill.vocab_size=384", "bench.distill.tokens=96", "bench.distill.hidden_size=64",
        "bench.distill.layers=2", "bench.distill.head_dim=32", "bench.distill.micro_batch_tokens=48",
        "bench.distill.max_tokens=96", "bench.distill.epochs=1", "bench.distill.steps=2", "bench.distill.warmup=1",
        "bench.distill.teacher_dtype=float32", "bench.distill.device=cpu"]


def tiny_options(extra=()):
    return D.options(load_run_config("configs/tiny_cpu.yaml", TINY + list(extra)))


def test_state_is_four_copies_of_the_parameters_and_the_transient_is_the_rest():
    lin = torch.nn.Linear(10, 20)  # 220 fp32 parameters
    assert tensor_bytes(lin) == 220 * 4
    assert state_bytes(220, 4) == 220 * 4 * (1 + 1 + 2)
    assert state_bytes(220, 2) == 220 * 2 * 4
    s = split_memory(peak=10_000, teacher=3_000, state=state_bytes(220))
    assert s == {"peak_bytes": 10_000, "teacher_bytes": 3_000, "state_bytes": 3_520, "transient_bytes": 3_480}
    # a tied weight counts once
    emb = torch.nn.Embedding(50, 8)
    tied = torch.nn.Module()
    tied.a, tied.b = emb, torch.nn.Linear(8, 50, bias=False)
    tied.b.weight = emb.weight
    assert tensor_bytes(tied) == 50 * 8 * 4


def test_cpu_peak_counts_only_what_the_work_allocates_beyond_the_baseline():
    probe = PeakMemory("cpu")
    held = 64 << 20
    probe.start(held=held)
    if not probe.reset_ok:
        pytest.skip("this kernel does not let a process reset its peak resident set (/proc/self/clear_refs)")
    big = torch.ones(256 << 20, dtype=torch.uint8)  # 256 MiB, touched
    peak = probe.peak()
    del big
    # the baseline's resident set less the held tensors is the runtime's share, taken off the peak
    assert probe.runtime == probe.baseline - held
    assert peak >= held + (256 << 20) * 0.95
    assert peak < held + (256 << 20) + (200 << 20)  # the rest of the process stays out of it


def test_rollouts_split_the_tokens_into_prompt_and_response():
    assert D.rollout_lengths(8192, 4, 0.25) == [(512, 1536)] * 4
    lengths = D.rollout_lengths(101, 3, 0.5)
    assert sum(p + r for p, r in lengths) == 101 and all(p >= 1 and r >= 1 for p, r in lengths)
    assert D.rollout_lengths(2, 1, 0.9) == [(1, 1)]
    ro = D.random_rollouts([(3, 5), (2, 7)], 50, seed=1)
    assert [(len(r["prompt_token_ids"]), len(r["token_ids"])) for r in ro] == [(3, 5), (2, 7)]
    assert all(3 <= t < 50 for r in ro for t in r["prompt_token_ids"] + r["token_ids"])
    assert ro == D.random_rollouts([(3, 5), (2, 7)], 50, seed=1)


def test_defaults_are_nemo_rl_scale():
    o = D.options(load_run_config("configs/tiny_cpu.yaml"))
    assert (o["vocab_size"], o["tokens"], o["rollouts"]) == (151936, 8192, 4)
    assert (o["micro_batch_tokens"], o["max_tokens"], o["teacher_dtype"]) == (4096, 8192, "bfloat16")
    assert o["drafters"] == ["draft_model", "eagle3", "dflash", "mtp"]


@pytest.mark.parametrize("override, match", [
    ("bench.distill.teacher_dtype=float16", "bench.distill.teacher_dtype"),
    ("bench.distill.drafters=eagle3,suffix", "bench.distill.drafters"),
    ("bench.distill.tokens=3", "bench.distill.tokens"),
    ("bench.distill.prompt_share=1.0", "bench.distill.prompt_share"),
    ("bench.distill.steps=0", "bench.distill.steps"),
    ("bench.distill.device=tpu", "bench.distill.device"),
    ("bench.distill.vocab=512", "bench.distill.vocab: unknown option"),
])
def test_bad_settings_name_the_key(override, match):
    with pytest.raises(ConfigError, match=match):
        tiny_options([override])


def _check_row(row, o):
    assert all(k in row for k in D.REQUIRED), [k for k in D.REQUIRED if k not in row]
    assert row["status"] == "ok", row["error"]
    assert row["error"] is None and row["tokens"] == o["tokens"] and row["vocab_size"] == o["vocab_size"]
    assert row["state_bytes"] == state_bytes(row["distiller_params"], 4)
    assert row["transient_bytes"] == row["peak_bytes"] - row["teacher_bytes"] - row["state_bytes"]
    assert row["teacher_bytes"] >= row["teacher_params"] * 4  # fp32 teacher (plus its buffers)
    assert row["step_s_min"] <= row["step_s"] <= row["step_s_max"] and len(row["step_s_all"]) == o["steps"]
    assert row["kl_finite"] and row["trained_positions"] > 0


def test_suite_measures_each_drafter_in_its_own_process(tmp_path, capsys):
    from nemo_rl_specdec import bench

    out = tmp_path / "distill.json"
    over = TINY + ["bench.distill.drafters=draft_model,eagle3"]
    args = SimpleNamespace(suite="distill", run_yaml="configs/tiny_cpu.yaml", overrides=over, json=str(out))
    assert bench.run(args) == 0
    results = json.loads(out.read_text())["results"]
    o = tiny_options(["bench.distill.drafters=draft_model,eagle3"])
    assert [r["drafter"] for r in results] == ["draft_model", "eagle3"]
    for r in results:
        _check_row(r, o)
        assert r["memory_method"].startswith("peak RSS") and r["peak_reset"]
        assert r["peak_bytes"] == r["peak_rss_bytes"] - r["runtime_bytes"]
    # the draft model has its own embeddings and lm_head (tied); the Eagle3 head its own lm_head
    shapes = results[0]["shapes"]
    assert results[0]["distiller_params"] > shapes["draft_model"]["vocab_size"] * shapes["draft_model"]["hidden_size"]
    table = capsys.readouterr().out
    assert "transient GB" in table and "draft_model" in table and "eagle3" in table


@pytest.mark.parametrize("drafter", ["dflash", "mtp"])
def test_a_job_measures_the_other_drafters_in_process(drafter, tmp_path):
    """The worker's own function (the suite test above runs it in processes of its own)."""
    o = tiny_options()
    ckpts = write_checkpoints(small_shapes(o["vocab_size"], o["hidden_size"], o["layers"], o["head_dim"]),
                              tmp_path, drafters=[drafter])
    (job,) = D.jobs(o, ckpts, "cpu")
    _check_row(D.run_job(job), o)


def test_a_failing_drafter_is_a_failed_row_and_the_suite_goes_on(tmp_path):
    o = tiny_options()
    ckpts = write_checkpoints(small_shapes(o["vocab_size"], o["hidden_size"], o["layers"], o["head_dim"]),
                              tmp_path, drafters=["eagle3"])
    (job,) = D.jobs(o, {"eagle3": (ckpts["eagle3"][0], str(tmp_path / "missing"))}, "cpu")
    row = D.run_job(job)
    assert row["status"] == "failed" and row["error"].startswith("distiller: ")
    assert "missing" in row["error"]
    assert all(row[k] is None for k in ("step_s", "peak_bytes", "transient_bytes", "state_bytes"))
    assert all(k in row for k in D.REQUIRED)
    # a worker that gives no result in time
    row = D.run_in_subprocess(job, timeout_s=0.01)
    assert row["status"] == "failed" and "no result within" in row["error"]
    assert D.table_rows([row])[0]["status"] == "failed"
