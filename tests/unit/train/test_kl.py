"""The chunked distillation loss (train/kl.py) is the full-vocabulary definition: the same loss and
gradients as log-softmaxes of whole logits with autograd, chunk by chunk, in any dtype mix."""
from __future__ import annotations

import pytest
import torch

from nemo_rl_specdec.train import kl as kl_mod
from nemo_rl_specdec.train.kl import chunk_rows, linear_forward_kl

V, HS, HT, N = 96, 12, 20, 37


def _reference(h_s, w_s, h_t, w_t, temperature, weights):
    """Today's definition on whole logits: teacher log-probs of its logits in its dtype, then fp32."""
    t_logp = torch.log_softmax((h_t @ w_t.t()).float() / temperature, -1)
    s_logp = torch.log_softmax((h_s @ w_s.t()).float() / temperature, -1)
    return ((t_logp.exp() * (t_logp - s_logp)).sum(-1) * weights).sum()


def _inputs(seed=0, teacher_dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    h_s = torch.randn(N, HS, generator=g, requires_grad=True)
    w_s = torch.randn(V, HS, generator=g).mul_(0.3).requires_grad_()
    h_t = torch.randn(N, HT, generator=g).to(teacher_dtype)
    w_t = torch.randn(V, HT, generator=g).mul_(0.3).to(teacher_dtype)
    weights = torch.rand(N, generator=g)
    return h_s, w_s, h_t, w_t, weights / weights.sum()


def _rel(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("teacher_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("chunk", [3, 10, 10**9])
def test_loss_and_gradients_equal_the_whole_vocabulary_definition(teacher_dtype, chunk):
    h_s, w_s, h_t, w_t, w = _inputs(teacher_dtype=teacher_dtype)
    ref = _reference(h_s, w_s, h_t, w_t, 0.7, w)
    ref.backward()
    g_h, g_w = h_s.grad.clone(), w_s.grad.clone()
    h_s.grad = w_s.grad = None
    out = linear_forward_kl(h_s, w_s, h_t, w_t, temperature=0.7, weights=w, chunk_elements=chunk * V)
    out.loss.backward()
    assert abs(float(out.loss.detach()) - float(ref.detach())) <= 1e-5 * abs(float(ref.detach()))
    assert _rel(h_s.grad, g_h) < 1e-5 and _rel(w_s.grad, g_w) < 1e-5


def test_the_default_weights_are_the_mean_and_a_frozen_projection_gets_no_gradient():
    h_s, w_s, h_t, w_t, _ = _inputs(1)
    w_s = w_s.detach()
    out = linear_forward_kl(h_s, w_s, h_t, w_t, temperature=1.0, chunk_elements=7 * V)
    ref = _reference(h_s, w_s, h_t, w_t, 1.0, torch.full((N,), 1.0 / N))
    assert float(out.loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-5)
    (3 * out.loss).backward()  # a scaled loss scales the gradient
    g = h_s.grad.clone()
    h_s.grad = None
    (3 * ref).backward()
    assert _rel(g, h_s.grad) < 1e-5


def test_identical_distributions_give_zero_and_agreement_counts_the_chosen_rows():
    h_s, w_s, _, _, _ = _inputs(2)
    agree = torch.arange(N) % 2 == 0
    out = linear_forward_kl(h_s, w_s, h_s.detach(), w_s.detach(), temperature=0.7, agree=agree,
                            chunk_elements=5 * V)
    assert float(out.loss.detach()) == pytest.approx(0.0, abs=1e-6)
    assert (out.hits, out.counted) == (int(agree.sum()), int(agree.sum()))
    with torch.no_grad():  # the same figures without building gradients
        again = linear_forward_kl(h_s, w_s, h_s, w_s, temperature=0.7, agree=agree)
    assert again.loss.grad_fn is None and (again.hits, again.counted) == (out.hits, out.counted)


def test_no_vocabulary_wide_tensor_is_larger_than_a_chunk(monkeypatch):
    """Every [rows, V] tensor the loss makes has at most chunk_rows rows: count them by hooking the
    matmuls that make logits."""
    h_s, w_s, h_t, w_t, w = _inputs(3)
    seen = []
    real = torch.Tensor.__matmul__

    def spy(a, b):
        out = real(a, b)
        if out.dim() == 2 and out.shape[-1] == V:
            seen.append(out.shape[0])
        return out

    monkeypatch.setattr(torch.Tensor, "__matmul__", spy)
    out = linear_forward_kl(h_s, w_s, h_t, w_t, weights=w, chunk_elements=4 * V)
    out.loss.backward()
    assert chunk_rows(V, 4 * V) == 4 and seen and max(seen) == 4
    assert kl_mod.chunk_rows(151936) == kl_mod.CHUNK_ELEMENTS // 151936


def test_mismatched_inputs_are_clear_errors():
    h_s, w_s, h_t, w_t, _ = _inputs(4)
    with pytest.raises(ValueError, match="shapes do not fit"):
        linear_forward_kl(h_s, w_s, h_t[:-1], w_t)
    with pytest.raises(ValueError, match="w_t is on meta"):
        linear_forward_kl(h_s, w_s, h_t, w_t.to("meta"))
