"""Every online distiller where NeMo-RL runs it: a policy that computes in fp32, bf16 or fp16, every
tensor on the data's device, and the loss of today's full-vocabulary definition.

There is no GPU here, so the device check runs each distiller's teacher side, loss and backward
with the default device set to `meta` (`with torch.device("meta")`) while the policy, the drafter
and the data are on the CPU: a tensor made without `device=` lands on meta and fails the first op
that meets a real tensor, as a CPU tensor fails on a CUDA rank. tools/device_check.py runs the
same distillers on a real GPU."""
from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch

from nemo_rl_specdec.drafters import eagle3 as eagle3_mod
from nemo_rl_specdec.drafters.dflash import DFlashDistiller
from nemo_rl_specdec.drafters.draft_model import DraftModelDistiller
from nemo_rl_specdec.drafters.eagle3 import Eagle3Distiller
from nemo_rl_specdec.drafters.mtp import MTPDistiller
from nemo_rl_specdec.resources import asset_path
from nemo_rl_specdec.train import kl as kl_mod
from nemo_rl_specdec.train.distill import DistillInputError, micro_batches, rollout_sequences

POLICY, MTP = asset_path("tiny", "policy"), asset_path("tiny_mtp")
MAKERS = {
    "draft_model": (lambda **kw: DraftModelDistiller(asset_path("tiny", "draft"), **kw), POLICY),
    "eagle3": (lambda **kw: Eagle3Distiller(asset_path("tiny", "eagle3"), **kw), POLICY),
    "dflash": (lambda **kw: DFlashDistiller(asset_path("tiny", "dflash"), max_anchors=None, **kw), POLICY),
    "mtp": (lambda **kw: MTPDistiller(MTP, **kw), MTP),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "mixed": torch.bfloat16}


def computing_in(model, dtype):
    """`model` with fp32 parameters that computes in `dtype`, as NeMo-RL's FSDP policies do
    (MixedPrecisionPolicy(param_dtype=bf16)): each forward runs on a cast copy of the parameters."""
    kept = {}

    def cast(module, args):
        for p in module.parameters():
            kept[p] = p.data
            p.data = p.data.to(dtype)

    def restore(module, args, out):
        for p, data in kept.items():
            p.data = data
        kept.clear()

    model.register_forward_pre_hook(cast)
    model.register_forward_hook(restore)
    return model


def _rollouts(vocab: int, n: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [{"prompt_token_ids": torch.randint(3, vocab, (6,), generator=g).tolist(),
             "token_ids": torch.randint(3, vocab, (int(torch.randint(10, 30, (1,), generator=g)),),
                                        generator=g).tolist()} for _ in range(n)]


@pytest.fixture(scope="module")
def policies(perturbed_policy):
    torch.set_num_threads(1)
    return {str(p): perturbed_policy(p, scale=0.3, seed=0) for p in (POLICY, MTP)}


def _targets(d, teacher, rollouts=None):
    seqs = rollout_sequences(rollouts or _rollouts(teacher.config.vocab_size), d.vocab_size)
    return d.teacher_targets(teacher, seqs, micro_batches([len(s.prompt) + len(s.response) for s in seqs], 10**9))


def _loss_and_grads(d, item):
    d.module.zero_grad(set_to_none=True)
    kl = d._loss(item)
    kl.loss.backward()
    return float(kl.loss.detach()), {n: p.grad.clone() for n, p in d.module.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", list(MAKERS))
def test_each_distiller_trains_on_a_policy_in_each_dtype(policies, name, dtype):
    make, pol = MAKERS[name]
    teacher = copy.deepcopy(policies[str(pol)])
    teacher = computing_in(teacher, DTYPES[dtype]) if dtype == "mixed" else teacher.to(DTYPES[dtype])
    d = make(lr=2e-3, epochs=3, seed=0, temperature=0.8)
    names = {k: v.dtype for k, v in d.state_dict().items()}
    s1 = d.step(teacher, _rollouts(teacher.config.vocab_size))
    s2 = d.step(teacher, _rollouts(teacher.config.vocab_size, seed=1))
    assert all(torch.isfinite(torch.tensor([s["kl_first"], s["kl_last"]])).all() for s in (s1, s2))
    assert s1["kl_last"] < s1["kl_first"]
    assert {k: v.dtype for k, v in d.state_dict().items()} == names  # the names and dtype vLLM loads
    assert d.t_out.dtype == DTYPES[dtype]  # the policy's projection as the policy computes it
    assert all(p.grad is None for p in teacher.parameters())


@pytest.mark.parametrize("name", list(MAKERS))
def test_teacher_side_loss_and_backward_make_every_tensor_on_the_datas_device(policies, name):
    make, pol = MAKERS[name]
    teacher = policies[str(pol)]
    d = make(temperature=0.8)
    rollouts = _rollouts(teacher.config.vocab_size)
    with torch.device("meta"):
        targets = _targets(d, teacher, rollouts)
        loss, grads = _loss_and_grads(d, targets[0])
    assert grads and all(g.device.type == "cpu" and torch.isfinite(g).all() for g in grads.values())
    assert loss > 0


def test_the_device_check_catches_a_tensor_made_on_the_default_device(policies, monkeypatch):
    def rope_without_device(x, pos, theta):  # the rotary tables as they were once built: on the CPU
        hd = x.shape[-1]
        inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        ang = pos.float().unsqueeze(-1) * inv
        cos, sin = (
            torch.cat([ang.cos(), ang.cos()], -1).unsqueeze(1),
            torch.cat([ang.sin(), ang.sin()], -1).unsqueeze(1),
        )
        return x * cos + torch.cat([-x[..., hd // 2:], x[..., : hd // 2]], -1) * sin

    monkeypatch.setattr(eagle3_mod, "rope", rope_without_device)
    d = MAKERS["eagle3"][0]()
    targets = _targets(d, policies[str(POLICY)])
    _loss_and_grads(d, targets[0])  # fine where everything is on the CPU
    with pytest.raises((RuntimeError, NotImplementedError)), torch.device("meta"):
        _loss_and_grads(d, targets[0])


@pytest.mark.parametrize("name", list(MAKERS))
def test_the_loss_does_not_depend_on_the_chunking(policies, name, monkeypatch):
    make, pol = MAKERS[name]
    d = make(temperature=0.8)
    item = _targets(d, policies[str(pol)])[0]
    whole_loss, whole_grads = _loss_and_grads(d, item)
    monkeypatch.setattr(kl_mod, "CHUNK_ELEMENTS", 3 * d.vocab_size)  # three positions per chunk
    loss, grads = _loss_and_grads(d, item)
    assert loss == pytest.approx(whole_loss, rel=1e-5)
    for k, g in whole_grads.items():
        assert float((grads[k] - g).norm()) <= 1e-5 * float(g.norm()) + 1e-9, k


def _full_kl(t_logits, s_logits, temperature):
    t_logp = torch.log_softmax(t_logits.float() / temperature, -1)
    s_logp = torch.log_softmax(s_logits.float() / temperature, -1)
    return (t_logp.exp() * (t_logp - s_logp)).sum(-1).mean()


def test_draft_model_and_eagle3_losses_are_the_whole_vocabulary_definition(policies):
    teacher, T = policies[str(POLICY)], 0.8
    d = MAKERS["draft_model"][0](temperature=T)
    item = _targets(d, teacher)[0]
    loss, grads = _loss_and_grads(d, item)
    ids, mask = item["ids"], item["mask"]
    d.module.zero_grad(set_to_none=True)
    with torch.no_grad():
        t_logits = teacher(input_ids=ids).logits[:, :-1][mask]
    ref = _full_kl(t_logits, d.model(input_ids=ids).logits[:, :-1][mask], T)
    ref.backward()
    assert loss == pytest.approx(float(ref.detach()), rel=1e-5)
    assert all(float((grads[n] - p.grad).norm()) <= 1e-4 * float(p.grad.norm()) + 1e-9
               for n, p in d.module.named_parameters() if p.grad is not None)

    e = MAKERS["eagle3"][0](temperature=T)
    item = _targets(e, teacher)[0]
    loss, grads = _loss_and_grads(e, item)
    head, mask, aux, emb = e.module, item["mask"], item["aux"], item["emb"]
    B, L = mask.shape[0], mask.shape[1] + 1
    with torch.no_grad():
        t_logits = teacher.lm_head(item["t_hidden"])
    pos = torch.arange(L - 2).unsqueeze(0).expand(B, -1)
    m, m1 = mask[:, 1:L - 1], mask[:, 2:L - 1]
    head.zero_grad(set_to_none=True)
    logits0, pre0 = head(emb[:, 1:L - 1], head.fc(aux[:, : L - 2]), pos)
    logits1, _ = head(emb[:, 2:L - 1], pre0[:, :-1], pos[:, 1:])
    ref = _full_kl(t_logits[:, 1:L - 1][m], logits0[m], T) + 0.5 * _full_kl(t_logits[:, 2:L - 1][m1], logits1[m1], T)
    ref.backward()
    assert loss == pytest.approx(float(ref.detach()), rel=1e-5)
    assert all(float((grads[n] - p.grad).norm()) <= 1e-4 * float(p.grad.norm()) + 1e-9
               for n, p in head.named_parameters() if p.grad is not None)


def test_what_the_loss_cannot_use_is_refused_before_training(policies, tmp_path):
    teacher = policies[str(POLICY)]
    bad = tmp_path / "eagle3"
    shutil.copytree(asset_path("tiny", "eagle3"), bad)
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(bad / "model.safetensors"))
    tensors["fc.weight"] = tensors["fc.weight"].to(torch.int8)
    save_file(tensors, str(bad / "model.safetensors"))
    with pytest.raises(DistillInputError, match=r"'fc.weight' is int8.*float32"):
        Eagle3Distiller(bad)

    d = MAKERS["eagle3"][0]()
    hook = teacher.lm_head.register_forward_hook(lambda m, i, o: 30 * torch.tanh(o / 30))  # a soft cap
    try:
        with pytest.raises(DistillInputError, match="soft cap"):
            d.step(teacher, _rollouts(teacher.config.vocab_size))
    finally:
        hook.remove()
    before = {k: v.clone() for k, v in d.state_dict().items()}
    elsewhere = MAKERS["eagle3"][0](device="meta")
    with pytest.raises(DistillInputError, match="computes on cpu, the drafter is on meta"):
        elsewhere.step(teacher, _rollouts(teacher.config.vocab_size))
    assert all(torch.equal(v, before[k]) for k, v in d.state_dict().items())  # nothing half-trained
    assert json.loads((bad / "config.json").read_text())["eagle_config"]
