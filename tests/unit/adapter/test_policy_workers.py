"""policy_workers.py and translate.py's policy side: online distillation in NeMo-RL's DTensor
policy workers (what a policy must be, the mixin on a stand-in worker)."""
from __future__ import annotations

import pytest
from fakes import (  # noqa: E402
    gen_cfg,
    run_dict,
    spec,
    worker_cfg,
)

from nemo_rl_specdec.adapter import metrics, translate
from nemo_rl_specdec.config.run import ConfigError


@pytest.mark.parametrize("policy, match", [
    ({"megatron_cfg": {"enabled": True}}, r"refresh\.mode: got 'online' with policy\.megatron_cfg\.enabled=true"),
    ({"dtensor_cfg": {"enabled": False}}, r"policy\.dtensor_cfg\.enabled: got false"),
    ({"dtensor_cfg": {"enabled": True, "tensor_parallel_size": 2}},
     r"policy\.dtensor_cfg\.tensor_parallel_size: got 2"),
    ({"dtensor_cfg": {"enabled": True, "context_parallel_size": 4}},
     r"policy\.dtensor_cfg\.context_parallel_size: got 4"),
])
def test_online_distillation_needs_a_data_parallel_dtensor_policy(policy, match):
    g = gen_cfg(drafter="eagle3", eagle3={"model": "/ckpt/head"})
    with pytest.raises(ConfigError, match=match):
        translate.check_run(run_dict(g, **policy))
    ok = translate.check_run(run_dict(g, dtensor_cfg={"enabled": True, "tensor_parallel_size": 1}))
    assert translate.distills_in_policy(g, ok)
    # frozen drafters and a trainer-streamed Eagle head distil nothing, whatever the backend
    frozen = gen_cfg(drafter="eagle3", eagle3={"model": "/ckpt/head"}, refresh={"mode": "frozen"})
    assert not translate.distills_in_policy(frozen,
                                            translate.check_run(run_dict(frozen, megatron_cfg={"enabled": True})))
    assert not translate.distills_in_policy(g, spec(drafter="eagle3", eagle3={"model": "/h"}),
                                            trainer_exports_draft=True)


def test_rollouts_from_nemo_rl_s_training_batch():
    import torch

    from nemo_rl_specdec.adapter.policy_workers import rollouts_from_train_data

    data = {"input_ids": torch.tensor([[5, 6, 7, 8, 9, 0], [1, 2, 3, 0, 0, 0], [4, 4, 4, 4, 0, 0]]),
            "input_lengths": torch.tensor([5, 3, 4]),
            "token_mask": torch.tensor([[0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0], [0, 1, 1, 1, 0, 0]])}
    assert rollouts_from_train_data(data) == [
        {"prompt_token_ids": [5, 6], "token_ids": [7, 8, 9]},   # padding never enters
        {"prompt_token_ids": [4], "token_ids": [4, 4, 4]},      # a row with no generated token is skipped
    ]


def test_replicas_are_combined_only_when_every_rank_holds_the_same_drafter():
    import copy

    import torch

    from nemo_rl_specdec.adapter.policy_workers import combine_takes
    from nemo_rl_specdec.engine.weights import fingerprint
    from nemo_rl_specdec.lockstep import DrafterRefreshError

    replica = torch.nn.Linear(4, 4)
    other = copy.deepcopy(replica)
    fp = fingerprint(replica)
    assert fingerprint(other) == fp
    with torch.no_grad():
        other.weight[0, 0] += 1e-6  # one rank's replica drifted
    r0 = {"seq": 3, "rank": 0, "fingerprint": fp, "stats": {"wall_s": 2.0, "kl_last": 0.1}, "refs": ["ref"]}
    r1 = {"seq": 3, "rank": 1, "fingerprint": fingerprint(copy.deepcopy(replica)), "stats": {"wall_s": 5.0}}
    pub = combine_takes([r1, r0])
    assert pub["seq"] == 3 and pub["refs"] == ["ref"] and pub["stats"]["drafter_train_s"] == 5.0
    assert combine_takes([None, None]) is None
    with pytest.raises(DrafterRefreshError, match="rank 1 differs from rank 0"):
        combine_takes([r0, {**r1, "fingerprint": fingerprint(other)}])
    with pytest.raises(DrafterRefreshError, match="different drafter versions"):
        combine_takes([r0, {**r1, "seq": 2}])
    with pytest.raises(DrafterRefreshError, match="rank 0 must"):
        combine_takes([r1])


def test_worker_stages_the_newest_published_drafter_into_the_refit(fake_nemo_rl, ray_local):
    """A policy-distilled drafter is refreshed exactly when the trainer published a new one (staged by
    reference, resolved in the vLLM worker); without a board the refit fails by name."""
    import torch

    from nemo_rl_specdec.adapter import workers
    from nemo_rl_specdec.adapter.exchange import drafter_board
    from nemo_rl_specdec.lockstep import DrafterRefreshError

    cfg = worker_cfg(drafter="draft_model", draft_model={"model": "/ckpt/draft"})
    w = workers.SpecDecVllmGenerationWorkerImpl(cfg, bundle_indices=[0])
    w.post_init()
    assert w._specdec_distilled and w._specdec_stash is None  # no rollouts travel to these engines
    with pytest.raises(DrafterRefreshError, match="no drafter board"):
        w.update_weights_from_collective()
    board = drafter_board(create=True)
    try:
        ray_local.get(board.publish.remote(0, [], {}))  # drafter 0: the checkpoint, a claim the engine verifies
        assert w.update_weights_from_collective() is True
        ray_local.get(board.publish.remote(1, [ray_local.put({"w": torch.ones(2)})], {"drafter_train_s": 1.5}))
        assert w.update_weights_from_collective() is True
        assert w.update_weights_from_collective() is True      # nothing new: the drafter ages
        rank = w.llm.ranks[0]
        assert rank.refreshes == [True, True, False] and rank.checkpoint_claims == [True, False, False]
        applied = [c[3] for c in rank.calls if c[0] == "after"]
        assert applied[0] is None and torch.equal(applied[1]["w"], torch.ones(2)) and applied[2] is None
        assert w._specdec_drafter_seq == 1
        assert w._specdec_combine([{"state": {}}], {})["distill"]["drafter_train_s"] == 1.5
        with pytest.raises(ValueError, match="in order"):
            ray_local.get(board.publish.remote(1, [], {}))
    finally:
        ray_local.kill(board)


def test_step_metrics_report_the_drafter_training_cost():
    out = metrics.version_metrics([{"state": {}, "distill": {"drafter_train_s": 3.0, "drafter_train_share": 0.04}},
                                   {"state": {}, "distill": {"drafter_train_s": 4.0, "drafter_train_share": 0.05}}])
    assert out["specdec/drafter_train_s"] == 4.0 and out["specdec/drafter_train_share"] == 0.05
    assert "specdec/drafter_train_s" not in metrics.version_metrics([{"state": {}}])


def test_bench_lockstep_builds_nemo_rl_s_training_layout_the_distiller_reads_back():
    from types import SimpleNamespace

    from nemo_rl_specdec.adapter.policy_workers import rollouts_from_train_data
    from nemo_rl_specdec.bench.lockstep import _train_data

    ro = [SimpleNamespace(prompt_token_ids=[1, 2, 3], token_ids=[4, 5]),
          SimpleNamespace(prompt_token_ids=[7], token_ids=[8, 9, 10, 11])]
    data = _train_data(ro, [1.0, 0.0], [0, 0])
    assert data["input_ids"].shape == (2, 5) and data["input_lengths"].tolist() == [5, 5]
    assert rollouts_from_train_data(data) == [{"prompt_token_ids": [1, 2, 3], "token_ids": [4, 5]},
                                              {"prompt_token_ids": [7], "token_ids": [8, 9, 10, 11]}]
