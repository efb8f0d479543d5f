"""The distillation loss, bounded in memory: forward KL(p_teacher || q_student) at the sampling
temperature, from the two models' last hidden states and output projections.

Over a 151,936-token vocabulary one position's logits are 0.6 MB in fp32, so the full logits of a
step (8,192 positions) and their softmaxes and autograd saves are tens of GB. Here the logits
exist one chunk of positions at a time (`CHUNK_ELEMENTS` floats per vocabulary-wide tensor):
per chunk, the teacher's and the student's logits are projected, the KL and its gradient with
respect to the student's logits, ``(softmax(z_s / T) - p_t) / T``, are computed, and the gradient
is pushed through the student's projection at once (to its hidden states and, when it is trained,
its weight), as liger-kernel's fused linear JSD does on a GPU. Nothing vocabulary-wide outlives a
chunk, and backward only hands the stored gradients on.

The value is today's definition: the teacher's logits ``h_t @ W_t^T`` in the teacher's dtype, then
``log_softmax(logits.float() / T)``; the student's ``log_softmax((h_s @ W_s^T).float() / T)``; the
loss is ``sum_i weight_i * KL_i`` (weights 1/N: the mean over positions).
"""
from __future__ import annotations

from typing import Any, NamedTuple

CHUNK_ELEMENTS = 1 << 25  # floats in one [positions, vocabulary] chunk tensor (128 MB in fp32)


class KL(NamedTuple):
    loss: Any     # 0-dim tensor, differentiable with respect to h_s and w_s
    hits: int     # positions counted for agreement where the student's argmax is the teacher's
    counted: int  # positions counted for agreement


def chunk_rows(vocab: int, chunk_elements: int | None = None) -> int:
    """Positions per chunk: `chunk_elements` (default CHUNK_ELEMENTS) floats per vocabulary-wide tensor."""
    return max(1, int(chunk_elements or CHUNK_ELEMENTS) // max(1, int(vocab)))


def _kl_chunks(h_s, w_s, h_t, w_t, weights, agree, temperature: float, rows: int, grads: bool):
    """(loss, hits, grad_h, grad_w) over chunks of `rows` positions; the gradients only with `grads`."""
    import torch

    loss = torch.zeros((), dtype=torch.float32, device=h_s.device)
    hits = torch.zeros((), dtype=torch.long, device=h_s.device)
    grad_h = torch.zeros_like(h_s) if grads and h_s.requires_grad else None
    grad_w = torch.zeros(w_s.shape, dtype=torch.float32, device=w_s.device) if grads and w_s.requires_grad else None
    hs, ws = h_s.detach(), w_s.detach()
    for a in range(0, h_s.shape[0], rows):
        b = min(a + rows, h_s.shape[0])
        z_s = (hs[a:b].to(ws.dtype) @ ws.t()).float()
        s_logp = torch.log_softmax(z_s / temperature, -1)
        t_logp = torch.log_softmax((h_t[a:b] @ w_t.t()).float() / temperature, -1)
        p_t = t_logp.exp()
        wt = weights[a:b].float()
        loss += ((p_t * (t_logp - s_logp)).sum(-1) * wt).sum()
        hits += ((z_s.argmax(-1) == t_logp.argmax(-1)) & agree[a:b]).sum()
        del t_logp
        if grad_h is None and grad_w is None:
            continue
        g = s_logp.exp_().sub_(p_t).mul_((wt / temperature).unsqueeze(-1))  # d loss / d z_s
        del p_t
        if grad_h is not None:  # in the projection's dtype: no vocabulary-wide copy of it in another
            grad_h[a:b] = (g.to(ws.dtype) @ ws).to(h_s.dtype)
        if grad_w is not None:
            grad_w.addmm_(g.t(), hs[a:b].float())
    return loss, int(hits), grad_h, grad_w


class _LinearForwardKL:
    """The autograd function (made on first use, so importing this module imports no torch)."""

    fn = None

    @classmethod
    def get(cls):
        if cls.fn is None:
            import torch

            class Fn(torch.autograd.Function):
                @staticmethod
                def forward(ctx, h_s, w_s, h_t, w_t, weights, agree, temperature, rows):
                    loss, hits, grad_h, grad_w = _kl_chunks(h_s, w_s, h_t, w_t, weights, agree, temperature, rows,
                                                            grads=True)
                    ctx.grads = [grad_h, None if grad_w is None else grad_w.to(w_s.dtype)]
                    ctx.hits = hits
                    return loss

                @staticmethod
                def backward(ctx, grad_out):
                    grad_h, grad_w = ctx.grads
                    ctx.grads = [None, None]  # handed on, not kept: the caller's .grad takes the buffer
                    scale = None if bool(grad_out == 1) else grad_out
                    if scale is not None:
                        grad_h = None if grad_h is None else grad_h.mul_(scale.to(grad_h.dtype))
                        grad_w = None if grad_w is None else grad_w.mul_(scale.to(grad_w.dtype))
                    return grad_h, grad_w, None, None, None, None, None, None

            cls.fn = Fn
        return cls.fn


def linear_forward_kl(h_s, w_s, h_t, w_t, *, temperature: float = 1.0, weights=None, agree=None,
                      chunk_elements: int | None = None) -> KL:
    """KL(p_teacher || q_student) at `temperature` for N positions, as ``sum_i weights_i * KL_i``.

    h_s [N, Hs], w_s [V, Hs]: the student's hidden states and output projection (either may require
    grad); h_t [N, Ht], w_t [V, Ht]: the teacher's (constants); weights [N] (default 1/N, the mean);
    agree [N] bool: the positions counted in `hits` (default all). Every tensor must be on one device;
    the student's may be fp32 while the teacher's are bf16 or fp16. A student projection in another
    dtype than its hidden states (a shared bf16 lm_head read by an fp32 draft) is applied in its own
    dtype, the hidden states and the logits' gradient cast to it a chunk at a time, as a bf16 engine
    applies it."""
    import torch

    n = h_s.shape[0]
    for name, t in (("w_s", w_s), ("h_t", h_t), ("w_t", w_t)):
        if t.device != h_s.device:
            raise ValueError(f"linear_forward_kl: {name} is on {t.device}, the student's hidden states on {h_s.device}")
    if (
        h_t.shape[0] != n
        or w_t.shape[0] != w_s.shape[0]
        or w_s.shape[1] != h_s.shape[1]
        or w_t.shape[1] != h_t.shape[1]
    ):
        raise ValueError(f"linear_forward_kl: shapes do not fit: h_s {tuple(h_s.shape)}, w_s {tuple(w_s.shape)}, "
                         f"h_t {tuple(h_t.shape)}, w_t {tuple(w_t.shape)}")
    if weights is None:
        weights = torch.full((n,), 1.0 / max(1, n), device=h_s.device)
    if agree is None:
        agree = torch.ones(n, dtype=torch.bool, device=h_s.device)
    rows = chunk_rows(w_s.shape[0], chunk_elements)
    if torch.is_grad_enabled() and (h_s.requires_grad or w_s.requires_grad):
        fn = _LinearForwardKL.get()
        loss = fn.apply(h_s, w_s, h_t, w_t, weights, agree, float(temperature), rows)
        return KL(loss, loss.grad_fn.hits, int(agree.sum()))
    with torch.no_grad():
        loss, hits, _, _ = _kl_chunks(h_s, w_s, h_t, w_t, weights, agree, float(temperature), rows, grads=False)
    return KL(loss, hits, int(agree.sum()))
