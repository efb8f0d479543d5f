"""Online drafter distillation (no engine): targets, isolation, loss, export names."""
from __future__ import annotations

import pytest
import torch

from nemo_rl_specdec.drafters.draft_model import DraftModelDistiller
from nemo_rl_specdec.rollouts import TokenSequence
from nemo_rl_specdec.train.distill import (
    DistillInputError,
    micro_batches,
    pad_batch,
    refresh_due,
    rollout_sequences,
)

VOCAB = 32


def _save_model(path, seed: int, hidden: int = 32, layers: int = 1):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, intermediate_size=2 * hidden, max_position_embeddings=128,
                      tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    m = Qwen3ForCausalLM(cfg).float()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    m.save_pretrained(path)
    return m


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("distill")
    teacher = _save_model(d / "teacher", 1, hidden=48, layers=2)
    _save_model(d / "draft", 2)
    return teacher.eval(), d / "draft"


def _rollouts(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _i in range(n):
        p = torch.randint(3, VOCAB, (int(torch.randint(3, 8, (1,), generator=g)),), generator=g).tolist()
        r = torch.randint(3, VOCAB, (int(torch.randint(5, 20, (1,), generator=g)),), generator=g).tolist()
        out.append({"prompt_token_ids": p, "token_ids": r})
    return out


def test_refresh_due_follows_every_n_steps():
    assert [v for v in range(1, 9) if refresh_due(v, 1)] == list(range(1, 9))
    assert [v for v in range(1, 9) if refresh_due(v, 3)] == [3, 6]
    with pytest.raises(ValueError, match="every_n_steps"):
        refresh_due(1, 0)


def test_mask_marks_exactly_the_positions_that_predict_response_tokens():
    ids, mask = pad_batch([TokenSequence([5, 6, 7], [8, 9]), TokenSequence([5], [4, 4, 4, 4])], pad_id=0)
    assert ids.tolist() == [[5, 6, 7, 8, 9], [5, 4, 4, 4, 4]]
    # logits at t predict token t+1: row 0 predicts 8 at t=2 and 9 at t=3
    assert mask.tolist() == [[False, False, True, True], [True, True, True, True]]
    assert ids[:, 1:][mask].tolist() == [8, 9, 4, 4, 4, 4]


def test_micro_batches_respect_the_token_budget_and_cover_everything():
    lengths = [10, 3, 7, 7, 1, 12]
    bs = micro_batches(lengths, max_tokens=20)
    assert sorted(i for b in bs for i in b) == list(range(6))
    for b in bs:
        assert len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 20


def test_rollout_validation_names_the_problem():
    with pytest.raises(DistillInputError, match=r"rollouts\[1\].*outside the vocabulary"):
        rollout_sequences([{"prompt_token_ids": [3], "token_ids": [4]},
                           {"prompt_token_ids": [3], "token_ids": [VOCAB]}], VOCAB)
    with pytest.raises(DistillInputError, match="empty prompt"):
        rollout_sequences([{"prompt_token_ids": [], "token_ids": [4]}], VOCAB)
    assert len(rollout_sequences([{"prompt_token_ids": [3], "token_ids": []}], VOCAB)) == 0


def test_distillation_moves_the_drafter_towards_the_policy_and_leaves_the_policy_untouched(models):
    teacher, draft_dir = models
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    d = DraftModelDistiller(draft_dir, lr=3e-3, epochs=8, seed=0, micro_batch_tokens=64)
    ro = _rollouts()
    s1 = d.step(teacher, ro)
    s2 = d.step(teacher, ro)
    assert s1["kl_last"] < s1["kl_first"]
    assert s2["kl_last"] < s1["kl_first"] * 0.8
    assert s2["top1_agreement_after"] > s1["top1_agreement_before"] + 0.1
    assert s1["tokens"] == sum(len(r["token_ids"]) for r in ro)
    # gradient isolation: the policy's tensors and grads are untouched
    for k, v in teacher.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(p.grad is None for p in teacher.parameters())
    assert teacher.training is False  # the teacher's train/eval mode is restored


def test_state_dict_uses_the_drafter_checkpoint_names_and_is_a_copy(models):
    from safetensors.torch import load_file

    teacher, draft_dir = models
    d = DraftModelDistiller(draft_dir, lr=1e-3, epochs=1)
    on_disk = load_file(str(draft_dir / "model.safetensors"))
    sd = d.state_dict()
    assert set(on_disk) <= set(sd)
    assert all(not k.startswith("draft.") for k in sd)
    d.step(teacher, _rollouts(4))
    changed = [k for k in on_disk if not torch.equal(sd[k], d.state_dict()[k])]
    assert changed, "a training step changed no drafter tensor"
    assert all(torch.equal(sd[k], on_disk[k]) for k in on_disk), "state_dict() must be a snapshot"


def test_teacher_sharing_parameters_with_the_drafter_is_refused(models):
    _, draft_dir = models
    d = DraftModelDistiller(draft_dir, lr=1e-3)
    with pytest.raises(DistillInputError, match="itself"):
        d.step(d.model, _rollouts(2))

    class Sharing(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.emb = m.get_input_embeddings()
            self.config = m.config

    with pytest.raises(DistillInputError, match="shares 1 parameter"):
        d.step(Sharing(d.model), _rollouts(2))


def test_empty_batches_missing_checkpoints_and_bad_lr_are_errors(models, tmp_path):
    teacher, draft_dir = models
    d = DraftModelDistiller(draft_dir, lr=1e-3)
    with pytest.raises(DistillInputError, match="no rollout has response tokens"):
        d.step(teacher, [{"prompt_token_ids": [3], "token_ids": []}])
    with pytest.raises(FileNotFoundError):
        DraftModelDistiller(tmp_path / "nope")
    with pytest.raises(ValueError, match="lr"):
        DraftModelDistiller(draft_dir, lr=0)


def test_demo_accepts_online_for_every_drafter_with_a_trainer_and_names_the_key_otherwise():
    from nemo_rl_specdec.config.run import ConfigError, load_run_config
    from nemo_rl_specdec.demo.run import DemoSettings

    b = "policy.generation.speculative_decoding"
    for run_file, over in (("configs/tiny_cpu.yaml", [f"{b}.drafter=draft_model", f"{b}.refresh.mode=online"]),
                           ("configs/tiny_cpu.yaml", [f"{b}.drafter=eagle3", f"{b}.refresh.mode=online"]),
                           ("configs/tiny_mtp_cpu.yaml", [f"{b}.refresh.mode=online"])):
        assert DemoSettings(load_run_config(run_file, over)).steps >= 1
    for run_file, bad in (("configs/tiny_cpu.yaml", [f"{b}.drafter=draft_model", f"{b}.refresh.mode=refit"]),
                          ("configs/tiny_mtp_cpu.yaml", [f"{b}.refresh.mode=refit"])):
        with pytest.raises(ConfigError, match=f"{b}.refresh.mode"):
            DemoSettings(load_run_config(run_file, bad))


def test_each_drafter_builds_its_own_online_trainer():
    from nemo_rl_specdec.config.run import load_run_config
    from nemo_rl_specdec.drafters.eagle3 import Eagle3Distiller
    from nemo_rl_specdec.drafters.mtp import MTPDistiller
    from nemo_rl_specdec.drafters.registry import drafter as drafter_of
    from nemo_rl_specdec.drafters.roles import ModelWeights

    def make_distiller(spec, **kw):
        return drafter_of(spec, ModelWeights).distiller(spec, **kw)

    b = "policy.generation.speculative_decoding"
    spec = load_run_config("configs/tiny_cpu.yaml", [f"{b}.drafter=eagle3"]).spec
    assert isinstance(make_distiller(spec, temperature=1.0), Eagle3Distiller)
    mcfg = load_run_config("configs/tiny_mtp_cpu.yaml", [f"{b}.refresh.mode=online"])
    assert isinstance(make_distiller(mcfg.spec, temperature=1.0, model_path=mcfg.model_path), MTPDistiller)
    with pytest.raises(DistillInputError, match="model_path"):
        make_distiller(mcfg.spec, temperature=1.0)
    spec = load_run_config("configs/tiny_cpu.yaml", [f"{b}.drafter=ngram"]).spec
    with pytest.raises(TypeError, match="drafter 'ngram' takes no part in ModelWeights"):  # a list drafter: no weights
        make_distiller(spec, temperature=1.0)
