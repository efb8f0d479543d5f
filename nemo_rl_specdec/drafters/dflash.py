"""The `dflash` drafter: a DFlash block-diffusion draft model that reads the policy's hidden states
and drafts a whole block in ONE forward; vLLM's `dflash` method runs it.

Owns its `dflash:` sub-block, its vLLM mapping, the plain-torch mirror of vLLM's ``qwen3_dflash``
draft (same parameter names, so a checkpoint needs no conversion), its training loss and its
online distiller. The bundled draft is built by `tools/train_dflash.py`.

How vLLM runs it (what the mirror reproduces). After the policy verified the tokens up to position
n-1 and sampled x_n, the draft sees

- context: for every position p < n, the policy's hidden states after the layers named by
  ``dflash_config.target_layer_ids`` (layer i's output; vLLM's aux id i + 1), concatenated and
  fused by ``fc``, normed by ``hidden_norm``; each draft layer projects them to keys (``k_proj``,
  ``k_norm``, rotary at p) and values (``v_proj``) in its KV cache;
- a query block at positions n .. n+k: the token x_n followed by k copies of
  ``dflash_config.mask_token_id``, embedded with the policy's embedding; each layer is a Qwen3
  decoder layer (q/k RMS norms) whose attention sees all context keys and the whole block (no
  causal mask inside the block);
- the final norm and the policy's lm_head at block offsets 1..k give the k draft tokens
  x_{n+1} .. x_{n+k} (offset j is trained towards the policy's distribution at position n+j-1).

Checkpoint layout (``config.json``): ``architectures: ["DFlashDraftModel"]``, Qwen3 dimensions,
``dflash_config: {mask_token_id, target_layer_ids}``, ``block_size`` (the query block it was
trained for: k <= block_size - 1); ``model.safetensors`` with ``fc``, ``hidden_norm``,
``layers.<i>.*`` and ``norm``. There is no ``embed_tokens`` or ``lm_head``: vLLM shares the
policy's.

Refresh: `online` (distilled on rollouts, here or in NeMo-RL's policy workers) or `frozen`; no
NeMo-RL trainer streams a DFlash draft, so there is no `refit`.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pydantic import Field

from nemo_rl_specdec.config.schema import PathError
from nemo_rl_specdec.drafters.base import PARALLEL, CheckpointDrafter
from nemo_rl_specdec.drafters.machinery.checkpoint import load_checkpoint, read_safetensors, state_tensors
from nemo_rl_specdec.drafters.machinery.lazy_torch import LazyTorchModules
from nemo_rl_specdec.drafters.roles import Block, DrafterSettings
from nemo_rl_specdec.train.distill import (
    DistillInputError,
    HiddenStateDistiller,
    estimating,
    last_layer_output,
    settle,
    whole,
)
from nemo_rl_specdec.train.kl import KL, linear_forward_kl

if TYPE_CHECKING:
    import numpy as np
    import torch

ARCHITECTURE = "DFlashDraftModel"


class DFlashConfig(DrafterSettings):
    model: str | None = Field(None, description="path of a DFlash draft checkpoint for the policy (its config "
                                 "names the policy layers it reads, its mask token and its block size)")


class DFlash(CheckpointDrafter):
    name = "dflash"
    draft_cost = PARALLEL
    config = DFlashConfig
    refresh_modes = ("online", "frozen")
    refit_hint = ("no NeMo-RL trainer streams a DFlash draft; use 'online' (distilled in the policy workers) "
                  "or 'frozen'")
    variants = (("dflash", ("num_speculative_tokens=4", "refresh.mode=frozen")),)

    def check(self, spec: Block) -> None:
        super().check(spec)
        path = Path(spec.dflash.model)
        if not (path / "config.json").is_file():  # a hub id or a path on the cluster: checked at engine start
            return
        cfg = read_config(path)
        block = cfg.get("block_size")
        if block and spec.num_speculative_tokens > int(block) - 1:
            raise PathError("num_speculative_tokens", spec.num_speculative_tokens,
                            f"<= {int(block) - 1} with this DFlash draft (block_size {block} in "
                            f"{path / 'config.json'}: one token plus block_size - 1 drafts)")

    def after_inplace_load(self, model: Any) -> None:
        rebuild_context_kv(model)

    def distiller_class(self) -> type[DFlashDistiller]:
        return DFlashDistiller

    def teacher_forced(self, spec: Block, policy: Any) -> Callable[[Sequence[int], int, int], np.ndarray]:
        """`roles.TeacherForced`: (ids, first, k) -> the draft's greedy k-token blocks at every
        position of a recorded sequence, on `policy`'s (an HF causal LM) hidden states of it (`greedy_drafts`)."""
        import torch

        draft, cfg = load_draft(cast(str, self.checkpoint(spec)))  # set: `check` refuses a block without it
        draft.eval()
        layers, mask_id = cfg["dflash_config"]["target_layer_ids"], int(cfg["dflash_config"]["mask_token_id"])
        embed, head = policy.get_input_embeddings().weight, policy.get_output_embeddings().weight

        def drafts(ids: Sequence[int], first: int, k: int) -> np.ndarray:
            t = torch.tensor([list(ids)])
            aux, _ = target_hidden(policy, t, layers)
            return greedy_drafts(draft, aux[0], embed, head, t[0], k, first, mask_id).numpy()

        return drafts


def read_config(path: str | Path) -> dict:
    """The draft's config.json, checked for the architecture and the fields the mirror and vLLM need
    (PathError on `dflash.model`, naming the file and the field)."""
    f = Path(path) / "config.json"
    if not f.is_file():
        raise PathError("dflash.model", str(path), "a DFlash draft checkpoint directory (it has no config.json)")
    cfg = json.loads(f.read_text())
    if ARCHITECTURE not in (cfg.get("architectures") or []):
        raise PathError("dflash.model", str(path), f"a DFlash draft checkpoint (config.json architectures "
                        f"{[ARCHITECTURE]}); {f} says {cfg.get('architectures')}")
    d = cfg.get("dflash_config") or {}
    for key in ("mask_token_id", "target_layer_ids"):
        if d.get(key) is None:
            raise PathError("dflash.model", str(path), f"a config.json with dflash_config.{key} ({f} has none)")
    return cfg


def rebuild_context_kv(model: Any) -> None:
    """Rebuild the copies vLLM's DFlash draft makes of its weights for the context keys/values (the
    fused k/v projection of all layers, the stacked k norms) after an in-place load.

    vLLM builds them at the end of the draft's ``load_weights``. In a layerwise reload (how the
    worker extension loads a live engine) each Linear is processed as soon as its tensors arrived,
    and on CPU that packs the weight for the GEMM kernel and leaves the Parameter empty: the build
    would read empty weights (the next draft fails with a size mismatch) or, without it, the copies
    stay the old version's. So each packed qkv projection is read back through its own kernel (the
    identity as input gives W^T exactly) and handed to vLLM's builder for the duration of the call."""
    import torch

    inner: Any = getattr(model, "model", None)
    build = getattr(inner, "_build_fused_kv_buffers", None)
    if build is None:
        raise RuntimeError(f"{type(model).__name__}: not vLLM's DFlash draft (no model._build_fused_kv_buffers); "
                           "its context key/value weights cannot be rebuilt after a refresh")
    kept = []
    try:
        for layer in inner.layers:
            proj = layer.self_attn.qkv_proj
            w = proj.weight
            if w.numel() == 0:
                eye = torch.eye(int(proj.input_size_per_partition), dtype=w.dtype, device=w.device)
                with torch.no_grad():
                    full = proj.quant_method.apply(proj, eye, None).t().contiguous()
                kept.append((proj, w))
                proj._parameters["weight"] = torch.nn.Parameter(full, requires_grad=False)
        build()
    finally:
        for proj, w in kept:
            proj._parameters["weight"] = w


# --------------------------------------------------------------------------- the draft in plain torch

def _build_torch_modules() -> dict:
    """The draft's torch module classes (DFlashLayer, DFlashDraft), built on first use
    (`machinery/lazy_torch.py`)."""
    import torch
    import torch.nn.functional as F

    from nemo_rl_specdec.drafters.machinery.layers import RMSNorm, SwiGLU, rope

    class DFlashLayer(torch.nn.Module):
        """A Qwen3 decoder layer (q/k RMS norms, no biases) whose attention also reads context keys."""

        def __init__(self, H: int, nh: int, nkv: int, hd: int, inter: int, eps: float):
            super().__init__()
            self.nh, self.nkv, self.hd = nh, nkv, hd
            self.self_attn: Any = torch.nn.Module()   # projections attached by their checkpoint names
            a = self.self_attn
            a.q_proj = torch.nn.Linear(H, nh * hd, bias=False)
            a.k_proj = torch.nn.Linear(H, nkv * hd, bias=False)
            a.v_proj = torch.nn.Linear(H, nkv * hd, bias=False)
            a.o_proj = torch.nn.Linear(nh * hd, H, bias=False)
            a.q_norm = RMSNorm(hd, eps)
            a.k_norm = RMSNorm(hd, eps)
            self.mlp = SwiGLU(H, inter)
            self.input_layernorm = RMSNorm(H, eps)
            self.post_attention_layernorm = RMSNorm(H, eps)

        def keys_values(self, x: torch.Tensor, pos: torch.Tensor, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
            """Rotated, normed keys and values [B, nkv, T, hd] of inputs x [B, T, H] at positions [B, T]."""
            a = self.self_attn
            B, T, _ = x.shape
            k = a.k_norm(a.k_proj(x).view(B, T, self.nkv, self.hd)).transpose(1, 2)
            v = a.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
            return rope(k, pos, theta), v

        def forward(self, x: torch.Tensor, pos: torch.Tensor, ctx_k: torch.Tensor, ctx_v: torch.Tensor,
                    ctx_mask: torch.Tensor, block: int, theta: float) -> torch.Tensor:
            """x [B, Q, H]: query blocks of `block` tokens (Q = A * block) at positions pos [B, Q];
            ctx_k/ctx_v [B, nkv, T, hd]; ctx_mask [B, Q, T] True where a query sees a context key."""
            a = self.self_attn
            B, Q, _ = x.shape
            h = self.input_layernorm(x)
            q = rope(a.q_norm(a.q_proj(h).view(B, Q, self.nh, self.hd)).transpose(1, 2), pos, theta)
            k, v = self.keys_values(h, pos, theta)
            rep = self.nh // self.nkv
            # one attention over [context keys, block keys]: a query sees the context its mask allows
            # and every key of its own block (scaled_dot_product_attention: no [Q, T] score tensor is
            # kept for backward where the backend is a fused one)
            keys = torch.cat([ctx_k, k], 2).repeat_interleave(rep, 1)
            values = torch.cat([ctx_v, v], 2).repeat_interleave(rep, 1)
            blocks = torch.arange(Q, device=x.device) // block
            same = (blocks[:, None] == blocks[None, :]).expand(B, Q, Q)
            allowed = torch.cat([ctx_mask, same], -1).unsqueeze(1)  # [B, 1, Q, T + Q]
            o = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed)
            x = x + a.o_proj(o.transpose(1, 2).reshape(B, Q, -1))
            return x + self.mlp(self.post_attention_layernorm(x))

    class DFlashDraft(torch.nn.Module):
        """vLLM's qwen3_dflash draft (non-causal block, full attention, no biases) in plain torch."""

        def __init__(self, H: int, n_aux: int, nh: int, nkv: int, hd: int, inter: int, layers: int,
                     eps: float = 1e-6, theta: float = 10000.0, target_hidden: int | None = None):
            super().__init__()
            self.theta = theta
            self.fc = torch.nn.Linear(n_aux * (target_hidden or H), H, bias=False)
            self.hidden_norm = RMSNorm(H, eps)
            self.layers: Any = torch.nn.ModuleList(DFlashLayer(H, nh, nkv, hd, inter, eps) for _ in range(layers))
            self.norm = RMSNorm(H, eps)

        def forward(self, aux: torch.Tensor, query: torch.Tensor, anchors: torch.Tensor,
                    valid: torch.Tensor) -> torch.Tensor:
            """aux [B, T, n*H]: the policy's hidden states at the target layers (context); query
            [B, A, blk, H]: embedded blocks (x_n then masks) at anchors n [B, A] (valid [B, A]);
            returns the normed outputs [B, A, blk, H] (the policy's lm_head makes them logits)."""
            B, T, _ = aux.shape
            _, A, blk, H = query.shape
            ctx = self.hidden_norm(self.fc(aux))
            ctx_pos = torch.arange(T, device=aux.device).unsqueeze(0).expand(B, -1)
            pos = (anchors.unsqueeze(-1) + torch.arange(blk, device=aux.device)).reshape(B, A * blk)
            # a query of anchor n sees the context positions p < n (a padded anchor sees position 0)
            seen = torch.where(valid, anchors, torch.ones_like(anchors))
            ctx_mask = (ctx_pos[:, None, :] < seen.repeat_interleave(blk, 1)[:, :, None])
            x = query.reshape(B, A * blk, H)
            for layer in self.layers:
                k, v = layer.keys_values(ctx, ctx_pos, self.theta)
                x = layer(x, pos, k, v, ctx_mask, blk, self.theta)
            return self.norm(x).view(B, A, blk, H)

        def checkpoint_tensors(self) -> dict:
            return state_tensors(self)

    return {"DFlashLayer": DFlashLayer, "DFlashDraft": DFlashDraft}


torch_modules = LazyTorchModules(__name__, ("DFlashLayer", "DFlashDraft"), _build_torch_modules)
__getattr__ = torch_modules.module_getattr


def load_draft(draft_dir: str | Path) -> tuple:
    """(DFlashDraft with the checkpoint's tensors, its config dict) from a DFlash checkpoint directory."""
    import torch

    draft_dir = Path(draft_dir)
    cfg = read_config(draft_dir)
    H = int(cfg["hidden_size"])
    hd = int(cfg.get("head_dim") or H // int(cfg["num_attention_heads"]))
    theta = float((cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0)))
    draft = torch_modules().DFlashDraft(
        H, len(cfg["dflash_config"]["target_layer_ids"]), int(cfg["num_attention_heads"]),
        int(cfg["num_key_value_heads"]), hd, int(cfg["intermediate_size"]), int(cfg["num_hidden_layers"]),
        float(cfg.get("rms_norm_eps", 1e-6)), theta, int(cfg.get("target_hidden_size") or H))
    settle(draft, dtype=torch.float32)
    if estimating():  # shapes only (train/estimate.py): there are no values to load
        return draft, cfg
    load_checkpoint(draft, read_safetensors(draft_dir), draft_dir, "not a qwen3_dflash draft without biases")
    return draft, cfg


def greedy_drafts(draft: Any, aux: torch.Tensor, embed: torch.Tensor, lm_head: torch.Tensor, ids: torch.Tensor,
                  k: int, first: int, mask_token_id: int) -> torch.Tensor:
    """The draft's greedy k-token blocks at every decode position of one recorded sequence `ids` [T], as
    vLLM's dflash proposer makes them: row r of the returned [T - first, k] tensor is the block for text
    indices m, ..., m + k - 1 made when tokens 0 .. m - 1 are verified (m = first + r, 2 <= first < T):
    anchor n = m - 1 (the token just sampled) embedded, then k mask tokens, attending to the context
    positions p < n of `aux` [T, n*H] (the policy's target-layer states of the sequence, `target_hidden`);
    offset j's argmax under the policy's `lm_head` [V, H] drafts x_{m+j-1}. `embed`: the policy's input
    embedding [V, H]. All anchors in one forward (each sees only its own block, `DFlashDraft.forward`)."""
    import torch

    T = int(ids.shape[0])
    if not 2 <= first < T or k < 1:
        raise ValueError(f"greedy_drafts: first={first}, k={k} for a sequence of {T} tokens; allowed: 2 <= first < T "
                         "and k >= 1")
    anchors = torch.arange(first - 1, T - 1).unsqueeze(0)
    with torch.no_grad():
        query = query_blocks(embed, ids.unsqueeze(0), anchors, k + 1, mask_token_id)
        out = draft(aux.unsqueeze(0), query.to(aux.dtype), anchors, torch.ones_like(anchors, dtype=torch.bool))
        return (out[0, :, 1:] @ lm_head.t().to(out.dtype)).argmax(-1)


def check_target_layers(target_layer_ids: Iterable[int], num_layers: int) -> None:
    bad = [i for i in target_layer_ids if not 0 <= int(i) < num_layers]
    if bad:
        raise DistillInputError(f"dflash_config.target_layer_ids: {bad} outside [0, {num_layers}) for a "
                                f"{num_layers}-layer policy")


def target_states(hidden_states: Sequence[torch.Tensor], last: torch.Tensor, target_layer_ids: Sequence[int],
                  num_layers: int) -> torch.Tensor:
    """The outputs of the policy's layers `target_layer_ids` concatenated [B, T, n*H], from a forward's
    ``hidden_states`` and its last layer's pre-norm output `last` (`last_layer_output`): layer i's
    output is ``hidden_states[i + 1]``, except for the last layer's (transformers' last entry is after
    the final norm)."""
    import torch

    check_target_layers(target_layer_ids, num_layers)
    return torch.cat([whole(last if int(i) == num_layers - 1 else hidden_states[int(i) + 1])
                      for i in target_layer_ids], -1)


def target_hidden(policy: Any, ids: torch.Tensor, target_layer_ids: Sequence[int]) -> tuple[torch.Tensor, Any]:
    """(the target layers' outputs [B, T, n*H] (`target_states`), the forward's output with every
    hidden state) from one no-grad forward."""
    import torch

    L = policy.config.num_hidden_layers
    check_target_layers(target_layer_ids, L)
    with last_layer_output(policy) as box, torch.no_grad():
        out = policy(input_ids=ids, output_hidden_states=True)
    return target_states(out.hidden_states, box["last"], target_layer_ids, L), out


def pick_anchors(mask: torch.Tensor, max_anchors: int | None,
                 generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Block starts to train on: positions n whose token x_n is a response token with a response token
    after it (mask [B, T-1] as pad_batch: logits at t predict response token t+1). At most
    `max_anchors` per sequence (a random subset, in order). Returns (anchors [B, A], valid [B, A])."""
    import torch

    B = mask.shape[0]
    ok = torch.zeros_like(mask)
    ok[:, 1:] = mask[:, :-1] & mask[:, 1:]  # ok[b, n]: x_n and x_{n+1} are response tokens
    rows = []
    for b in range(B):
        idx = ok[b].nonzero().flatten()
        if max_anchors is not None and idx.numel() > max_anchors:
            keep = torch.randperm(idx.numel(), generator=generator, device="cpu")[:max_anchors].sort().values
            idx = idx[keep.to(idx.device)]
        rows.append(idx)
    A = max(1, max(r.numel() for r in rows))
    anchors = torch.ones((B, A), dtype=torch.long, device=mask.device)
    valid = torch.zeros((B, A), dtype=torch.bool, device=mask.device)
    for b, r in enumerate(rows):
        anchors[b, : r.numel()], valid[b, : r.numel()] = r, True
    return anchors, valid


def query_blocks(embed: torch.Tensor, ids: torch.Tensor, anchors: torch.Tensor, block: int,
                 mask_token_id: int) -> torch.Tensor:
    """The embedded query blocks [B, A, block, H]: the policy's embedding of x_n, then of the mask token."""
    import torch

    first = embed[ids.gather(1, anchors)]  # [B, A, H]
    rest = embed[mask_token_id].expand(*anchors.shape, block - 1, -1)
    return torch.cat([first.unsqueeze(2), rest], 2)


def teacher_rows(mask: torch.Tensor, anchors: torch.Tensor, valid: torch.Tensor,
                 block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where block offset j = 1..block-1 of anchor n is trained: the teacher position n+j-1 (clamped to
    the batch, [B, A, block-1]) and whether it predicts a response token of that rollout."""
    import torch

    t = anchors.unsqueeze(-1) + torch.arange(block - 1, device=anchors.device)
    last = mask.shape[1] - 1
    tc = t.clamp(max=last)
    rows = valid.unsqueeze(-1) & (t <= last) & mask.gather(1, tc.reshape(mask.shape[0], -1)).view_as(tc)
    return tc, rows


def dflash_loss(draft: Any, item: dict, s_out: torch.Tensor, t_out: torch.Tensor, *, temperature: float = 1.0,
                decay: float = 4.0) -> KL:
    """DFlash training loss on one padded batch, as vLLM runs the draft (a `KL`, train/kl.py).

    item: aux [B, T, n*H] (target_hidden, in the draft's dtype), t_hidden [B, T, H] (the policy's
    final hidden states: position t predicts x_{t+1}), mask [B, T-1], anchors/valid [B, A]
    (pick_anchors), query [B, A, block, H] (query_blocks, in the draft's dtype). s_out: the policy's
    lm_head [V, H] as the draft's logits use it (vLLM shares it with the draft; in the policy's dtype,
    the draft's outputs are cast to it chunk by chunk, train/kl.py), t_out: the same as the teacher's.
    Block offset j (1..block-1) at anchor n predicts x_{n+j}: forward KL towards the policy at
    position n+j-1, where that position predicts a response token; offset j weighs exp(-(j-1)/decay)
    (the first drafts decide acceptance), normalised over the batch. Agreement counts offset 1."""
    import torch

    anchors, valid, th = item["anchors"], item["valid"], item["t_hidden"]
    blk, B = item["query"].shape[2], th.shape[0]
    out = draft(item["aux"], item["query"], anchors, valid)[:, :, 1:]  # [B, A, blk-1, H]
    tc, rows = teacher_rows(item["mask"], anchors, valid, blk)
    tgt = th.gather(1, tc.reshape(B, -1, 1).expand(-1, -1, th.shape[-1])).view(*tc.shape, -1)
    w = torch.exp(-torch.arange(blk - 1, device=out.device, dtype=torch.float32) / decay).expand(tc.shape)[rows]
    first = torch.zeros(tc.shape, dtype=torch.bool, device=out.device)
    first[..., 0] = True
    return linear_forward_kl(out[rows], s_out, tgt[rows], t_out, temperature=temperature,
                             weights=w / w.sum().clamp_min(1e-9), agree=first[rows])


class DFlashDistiller(HiddenStateDistiller):
    """Online trainer of a DFlash draft (``DFlashDraftModel``, vLLM's ``qwen3_dflash``) on rollouts.

    Teacher side (no grad): one forward of the policy gives the hidden states of the draft's target
    layers and the logits (targets at the sampling temperature); the policy's embedding (x_n and the
    mask token) and lm_head, which vLLM shares with the draft, are constants here. Trained: ``fc``,
    ``hidden_norm``, ``layers.*``, ``norm`` (the draft's own). Each step trains the blocks starting at
    up to `max_anchors` response positions per rollout."""

    kind = "dflash"
    what, layers_key, source_arg = "a DFlash", "dflash_config.target_layer_ids", "draft_dir"

    def __init__(self, draft_dir: str | Path, *, max_anchors: int | None = 64, decay: float = 4.0, **kw: Any):
        """`max_anchors`: blocks trained per rollout (None: every response position); `decay`: the loss
        weight of block offset j is exp(-(j-1)/decay); `kw`: the loop's settings (Distiller)."""
        if max_anchors is not None and max_anchors < 1:
            raise ValueError(f"max_anchors: got {max_anchors!r}; allowed: an integer >= 1 or None (all)")
        if not decay > 0:
            raise ValueError(f"decay: got {decay!r}; allowed: a number > 0")
        self.max_anchors, self.decay = max_anchors, float(decay)
        super().__init__(draft_dir, **kw)

    def _read(self, draft_dir: str | Path) -> tuple:
        draft, config = load_draft(draft_dir)
        d = config["dflash_config"]
        self.mask_token_id = int(d["mask_token_id"])
        self.block = int(config.get("block_size") or 16)
        return draft, config, [int(i) for i in d["target_layer_ids"]], int(config["vocab_size"])

    def _teacher_side(self, teacher: Any) -> None:
        """Per step: the policy's output projection and its input embeddings, whole and detached. The
        draft's logits go through the policy's projection as it is (vLLM shares it, in the policy's
        dtype); no copy of it in the draft's dtype is made (2.5 GB in fp32 at Qwen3-8B shapes)."""
        super()._teacher_side(teacher)
        self.embed = whole(teacher.get_input_embeddings().weight).detach()

    def _hidden_wanted(self, teacher: Any) -> set:
        check_target_layers(self.layer_ids, teacher.config.num_hidden_layers)
        return {int(i) + 1 for i in self.layer_ids}  # layer i's output (the last one's before the final norm)

    def _prepare(self, teacher: Any, ids: torch.Tensor, mask: torch.Tensor) -> dict:
        kept, h = self._teacher_forward(teacher, ids)
        aux = self.torch.cat([whole(kept[int(i) + 1]) for i in self.layer_ids], -1)
        anchors, valid = pick_anchors(mask, self.max_anchors)
        item = {"aux": self._cast(aux), "t_hidden": h, "mask": mask, "anchors": anchors, "valid": valid,
                "query": self._cast(query_blocks(self.embed, ids, anchors, self.block, self.mask_token_id))}
        item["n"] = int(teacher_rows(mask, anchors, valid, self.block)[1].sum())
        return item

    def _loss(self, item: dict) -> KL:
        return dflash_loss(self.module, item, self.t_out, self.t_out, temperature=self.temperature, decay=self.decay)
