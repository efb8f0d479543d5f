"""The demo's GRPO update: advantages, that a step moves the policy toward rewarded samples,
clipping, the exported state dict, and input errors. Uses a random tiny Qwen3 written to tmp."""
import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from nemo_rl_specdec.demo.grpo import GRPOInputError, GRPOTrainer, group_advantages  # noqa: E402

VOCAB = 32


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_qwen3")
    cfg = transformers.Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                   max_position_embeddings=128, tie_word_embeddings=True, pad_token_id=0)
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(cfg).save_pretrained(str(d))
    return str(d)


def seq_logprob(trainer, prompt, resp):
    with torch.no_grad():
        lp, mask = trainer._response_logprobs(trainer.model, [(prompt, resp, None)])
    return float((lp * mask).sum())


def test_group_advantages():
    a = group_advantages([1.0, 0.0, 1.0, 1.0, 0.5, 0.5], ["x", "x", "y", "y", "z", "z"])
    assert a[0] == pytest.approx(1.0, abs=1e-4) and a[1] == pytest.approx(-1.0, abs=1e-4)
    assert a[2:] == [0.0, 0.0, 0.0, 0.0]  # no variance in a group: no signal
    b = group_advantages([3.0, 1.0, 2.0], [0, 0, 0])
    assert sum(b) == pytest.approx(0.0, abs=1e-6) and b[0] > b[2] > b[1]
    with pytest.raises(GRPOInputError, match="differ in length"):
        group_advantages([1.0], [0, 1])
    with pytest.raises(GRPOInputError, match="finite"):
        group_advantages([float("nan"), 1.0], [0, 0])


def test_steps_move_probability_toward_rewarded_samples(policy_dir):
    t = GRPOTrainer(policy_dir, lr=3e-3, seed=0)
    prompt = [3, 4, 5]
    good, bad = [7, 8, 9, 10], [11, 12, 13, 14]
    g0, b0 = seq_logprob(t, prompt, good), seq_logprob(t, prompt, bad)
    before = t.state_dict()
    for _ in range(5):
        rollouts = [{"prompt_token_ids": prompt, "token_ids": good}, {"prompt_token_ids": prompt, "token_ids": bad}]
        stats = t.step(rollouts, [1.0, 0.0], ["q", "q"])
    g1, b1 = seq_logprob(t, prompt, good), seq_logprob(t, prompt, bad)
    assert g1 > g0 and b1 < b0
    assert stats["step"] == 5 and stats["groups_with_signal"] == 1 and stats["num_tokens"] == 8
    after = t.state_dict()
    assert set(after) == set(before) and "model.embed_tokens.weight" in after
    assert any(not torch.equal(before[k], after[k]) for k in after)
    # exported tensors are copies: changing them does not touch the trainer
    after["model.embed_tokens.weight"].zero_()
    assert t.model.model.embed_tokens.weight.abs().sum() > 0


def test_no_signal_means_no_change_and_behaviour_logprobs_are_used(policy_dir):
    t = GRPOTrainer(policy_dir, lr=1e-2, seed=0)
    prompt, resp = [3, 4], [5, 6, 7]
    before = t.state_dict()
    stats = t.step([{"prompt_token_ids": prompt, "token_ids": resp}] * 2, [1.0, 1.0], [0, 0])
    assert stats["groups_with_signal"] == 0 and stats["grad_norm"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in t.state_dict().items())
    # behaviour log-probs from the rollouts set the ratio: far-off ones are clipped
    with torch.no_grad():
        lp, mask = t._response_logprobs(t.model, [(prompt, resp, None)])
    exact = [float(x) for x, m in zip(lp[0], mask[0], strict=True) if m > 0]
    r_exact = {"prompt_token_ids": prompt, "token_ids": resp, "logprobs": exact}
    r_far = {"prompt_token_ids": prompt, "token_ids": [8, 9, 10], "logprobs": [-50.0, -50.0, -50.0]}
    s = t.step([r_exact, r_far], [1.0, 0.0], [0, 0])
    assert s["behaviour_logprob_gap"] is not None and s["clip_fraction"] == pytest.approx(0.5)


def test_micro_batches_give_the_update_of_one_batch(policy_dir):
    """micro_batch_tokens bounds memory, not the result: the update is the same however the batch is split."""
    rollouts = [{"prompt_token_ids": [1, 2, 3], "token_ids": [4 + i, 5, 6 + i, 7][: 2 + i % 3]} for i in range(6)]
    rewards, groups = [1.0, 0.0, 0.5, 1.0, 0.0, 0.0], [0, 0, 0, 1, 1, 1]
    out = []
    for budget in (10_000, 8, 1):  # one batch; two sequences per micro-batch; one per micro-batch
        t = GRPOTrainer(policy_dir, lr=1e-2, seed=0, micro_batch_tokens=budget)
        stats = t.step(rollouts, rewards, groups)
        out.append((t.state_dict(), stats))
    (ref, ref_stats), rest = out[0], out[1:]
    for sd, stats in rest:
        assert stats["loss"] == pytest.approx(ref_stats["loss"], rel=1e-5, abs=1e-7)
        assert stats["grad_norm"] == pytest.approx(ref_stats["grad_norm"], rel=1e-4)
        assert all(torch.allclose(sd[k], ref[k], atol=1e-6) for k in ref)
    assert any(not torch.equal(ref[k], GRPOTrainer(policy_dir, seed=0).state_dict()[k]) for k in ref)


def test_gradient_clipping_bounds_the_update(policy_dir):
    lr = 1e-3
    t = GRPOTrainer(policy_dir, lr=lr, seed=0, max_grad_norm=1e-4)
    before = t.state_dict()
    rollouts = [
        {"prompt_token_ids": [1, 2], "token_ids": [3] * 20},
        {"prompt_token_ids": [1, 2], "token_ids": [4] * 20},
    ]
    s = t.step(rollouts, [1.0, 0.0], [0, 0])
    assert s["grad_norm"] > 1e-4  # reported before clipping
    # AdamW's first step moves each parameter by ~lr regardless of scale; clipping must still leave finite weights
    after = t.state_dict()
    assert all(torch.isfinite(v).all() for v in after.values())
    assert max(float((after[k] - before[k]).abs().max()) for k in after) <= lr * 1.01


def test_input_errors(policy_dir):
    t = GRPOTrainer(policy_dir, lr=1e-3)
    ok = {"prompt_token_ids": [1], "token_ids": [2]}
    with pytest.raises(GRPOInputError, match="same length"):
        t.step([ok], [1.0, 0.0], [0, 0])
    with pytest.raises(GRPOInputError, match="empty batch"):
        t.step([], [], [])
    with pytest.raises(GRPOInputError, match="outside the vocabulary"):
        t.step([{"prompt_token_ids": [1], "token_ids": [VOCAB + 5]}], [1.0], [0])
    with pytest.raises(GRPOInputError, match="empty prompt"):
        t.step([{"prompt_token_ids": [], "token_ids": [2]}], [1.0], [0])
    with pytest.raises(GRPOInputError, match="needs prompt_token_ids"):
        t.step([{"token_ids": [2]}], [1.0], [0])
    with pytest.raises(ValueError, match="lr"):
        GRPOTrainer(policy_dir, lr=0.0)
    with pytest.raises(FileNotFoundError):
        GRPOTrainer(policy_dir + "/nope")
    assert math.isfinite(t.step([ok, {"prompt_token_ids": [1], "token_ids": [3]}], [1.0, 0.0], [0, 0])["loss"])
