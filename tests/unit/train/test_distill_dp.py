"""Data-parallel online distillation (train/distill.py `DataParallel`), as NeMo-RL's DTensor policy
workers run it: two gloo ranks on CPU, each with its shard of the step's rollouts."""
from __future__ import annotations

import hashlib

import pytest
import torch
from test_distill import _rollouts, _save_model

from nemo_rl_specdec.drafters.draft_model import DraftModelDistiller
from nemo_rl_specdec.rollouts import TokenSequence
from nemo_rl_specdec.train.distill import cap_tokens


def _digest(sd: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(sd):
        h.update(k.encode())
        h.update(sd[k].detach().float().numpy().tobytes())
    return h.hexdigest()


def _rank(rank: int, world: int, init: str, root: str, shards: list, out: dict) -> None:
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from nemo_rl_specdec.train.distill import DataParallel

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        teacher = AutoModelForCausalLM.from_pretrained(f"{root}/teacher", dtype=torch.float32).eval()
        d = DraftModelDistiller(f"{root}/draft", lr=3e-3, epochs=3, seed=0, micro_batch_tokens=64, num_threads=1)
        stats = d.step(teacher, shards[rank], dp=DataParallel())
        out[rank] = {"digest": _digest(d.state_dict()), "stats": stats, "sd": d.state_dict() if rank == 0 else None}
    finally:
        dist.destroy_process_group()


def _run(tmp_path, root, shards: list) -> dict:
    import torch.multiprocessing as mp

    manager = mp.get_context("spawn").Manager()
    out = manager.dict()
    mp.spawn(_rank, args=(len(shards), f"file://{tmp_path}/pg", str(root), shards, out), nprocs=len(shards))
    return dict(out)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    d = tmp_path_factory.mktemp("dp")
    _save_model(d / "teacher", 1, hidden=48, layers=2)
    _save_model(d / "draft", 2, hidden=32, layers=1)
    return d


def test_replicas_stay_identical_with_uneven_shards(root, tmp_path):
    """Rank 1 has far fewer micro-batches than rank 0 (it runs dummy teacher forwards); both take
    the same optimizer steps, so their drafters are bit-identical, and the group's KL falls."""
    out = _run(tmp_path, root, [_rollouts(12, 0), _rollouts(2, 1)])
    assert out[0]["digest"] == out[1]["digest"]
    s0, s1 = out[0]["stats"], out[1]["stats"]
    assert s0["kl_first"] == pytest.approx(s1["kl_first"]) and s0["kl_last"] == pytest.approx(s1["kl_last"])
    assert s0["kl_last"] < s0["kl_first"]
    assert s0["trained_positions"] > s1["trained_positions"] > 0


def test_a_rank_without_rollouts_still_takes_part(root, tmp_path):
    out = _run(tmp_path, root, [_rollouts(6, 3), []])
    assert out[0]["digest"] == out[1]["digest"]
    assert out[1]["stats"]["trained_positions"] == 0 and out[1]["stats"]["sequences"] == 0
    assert out[0]["stats"]["kl_last"] < out[0]["stats"]["kl_first"]


def test_gradient_sum_is_exact(root, tmp_path):
    """The same shard on both ranks: the group gradient is each rank's own, so the drafter equals a
    single-process distillation of that shard (up to float rounding)."""
    from transformers import AutoModelForCausalLM

    shard = _rollouts(8, 4)
    out = _run(tmp_path, root, [shard, shard])
    teacher = AutoModelForCausalLM.from_pretrained(f"{root}/teacher", dtype=torch.float32).eval()
    single = DraftModelDistiller(f"{root}/draft", lr=3e-3, epochs=3, seed=0, micro_batch_tokens=64, num_threads=1)
    single.step(teacher, shard)
    ref = single.state_dict()
    for k, v in out[0]["sd"].items():
        torch.testing.assert_close(v, ref[k], rtol=1e-4, atol=1e-5, msg=k)


def test_cap_tokens_keeps_the_first_tokens_in_order():
    seqs = [TokenSequence([1, 2], [3, 4, 5]), TokenSequence([1], [6, 7]), TokenSequence([1, 2, 3], [8, 9])]
    assert cap_tokens(seqs, None) is seqs
    assert cap_tokens(seqs, 8) == [seqs[0], seqs[1]]
    assert cap_tokens(seqs, 7) == [seqs[0], TokenSequence([1], [6])]
    assert cap_tokens(seqs, 6) == [seqs[0]]  # the second would keep no response token
    assert cap_tokens(seqs, 1) == []
