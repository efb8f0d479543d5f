"""The `eagle3` drafter: an Eagle3 head (EAGLE/HF layout, one ``llama_eagle3`` layer) that reads
the policy's aux hidden states; vLLM's `eagle3` method runs it.

Owns its `eagle3:` sub-block, its vLLM mapping, the plain-torch mirror of vLLM's ``llama_eagle3``
forward (same parameter names, so a checkpoint needs no conversion), its training loss and its
online distiller. The bundled head is built by `nemo_rl_specdec/tools/train_eagle3.py`.

Checkpoint layout (what vLLM's ``eagle3`` loads; reference/drafters_cpu.md §1.1): ``config.json``
with ``architectures: ["LlamaForCausalLMEagle3"]`` and ``eagle_config.eagle_aux_hidden_state_layer_ids``;
``model.safetensors`` with ``midlayer.*`` (one decoder layer whose q/k/v see
``cat[input_layernorm(emb), hidden_norm(g)]``), ``fc.weight`` (fuses the aux hidden states into
``g``), ``norm.weight`` and ``lm_head.weight``. There is no ``embed_tokens``: vLLM shares the
policy's embedding.

In NeMo-RL the head is distilled online in the policy workers, or streamed by a Megatron
trainer that trains it (`policy.draft.enabled`, `refresh.mode: refit`).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pydantic import Field

from nemo_rl_specdec.config.schema import ConfigError, PathError
from nemo_rl_specdec.drafters.base import SOURCE_REFIT_STREAM, CheckpointDrafter
from nemo_rl_specdec.drafters.machinery.checkpoint import load_checkpoint, read_safetensors, state_tensors
from nemo_rl_specdec.drafters.machinery.layers import rope
from nemo_rl_specdec.drafters.machinery.lazy_torch import LazyTorchModules
from nemo_rl_specdec.drafters.roles import Block, DrafterSettings, TrainerStreams
from nemo_rl_specdec.train.distill import (
    Distiller,
    DistillInputError,
    HiddenStateDistiller,
    estimating,
    settle,
    whole,
)
from nemo_rl_specdec.train.kl import KL, linear_forward_kl

if TYPE_CHECKING:
    import numpy as np
    import torch

    from nemo_rl_specdec.rollouts import TokenSequence

DEFAULT_DRAFT_VOCAB = 32000  # the draft vocabulary of Eagle3 heads as published, for larger vocabularies


class Eagle3Config(DrafterSettings):
    model: str | None = Field(None, description="path of an Eagle3 head checkpoint for the policy (its config "
                                 "names the aux layers it reads)")
    draft_vocab_size: int | None = Field(
        None, ge=1, description="tokens the head drafts from (its lm_head rows; the d2t map sends them to the "
                                "policy's ids); unset: the checkpoint's own. It must be the checkpoint's: vLLM "
                                "sizes the live head from the checkpoint")


class Eagle3(CheckpointDrafter):
    name = "eagle3"
    config = Eagle3Config
    refresh_modes = ("online", "refit", "frozen")
    refit_hint = "refit needs the trainer to stream the Eagle head: policy.draft.enabled=true (Megatron policy)"
    trainer_stream = "policy.draft.enabled=true"

    def distiller_class(self) -> type[Eagle3Distiller]:
        return Eagle3Distiller

    def weight_source(self, spec: Block, streams: TrainerStreams) -> str:
        return SOURCE_REFIT_STREAM if streams.draft else super().weight_source(spec, streams)

    def check(self, spec: Block) -> None:
        super().check(spec)
        want = spec.eagle3.draft_vocab_size
        path = Path(spec.eagle3.model)
        if want is None or not (path / "config.json").is_file():  # a hub id: checked when the head loads
            return
        cfg = json.loads((path / "config.json").read_text())
        vocab, have = int(cfg["vocab_size"]), int(cfg.get("draft_vocab_size") or cfg["vocab_size"])
        if want > vocab:
            raise PathError("eagle3.draft_vocab_size", want, f"<= {vocab}, the policy's vocabulary "
                            f"({path / 'config.json'} vocab_size)")
        if want != have:
            raise PathError("eagle3.draft_vocab_size", want,
                            f"{have}, the draft vocabulary of the head at eagle3.model ({path / 'config.json'} "
                            "draft_vocab_size: vLLM sizes the live head from it); a head with another draft "
                            "vocabulary is made by python -m nemo_rl_specdec.tools.train_eagle3 --draft-vocab-size N")

    def build_distiller(self, spec: Block, *, temperature: float, seed: int,
                        model_path: str | None, **kw: Any) -> Distiller:
        kw.setdefault("draft_vocab_size", spec.eagle3.draft_vocab_size)
        return super().build_distiller(spec, temperature=temperature, seed=seed, model_path=model_path, **kw)

    def teacher_forced(self, spec: Block, policy: Any) -> Callable[[Sequence[int], int, int], np.ndarray]:
        """`roles.TeacherForced`: (ids, first, k) -> the head's greedy k-token drafts at every position
        of a recorded sequence, on `policy`'s (an HF causal LM) hidden states of it (`greedy_drafts`)."""
        import torch

        head, cfg = load_head(cast(str, self.checkpoint(spec)))  # set: `check` refuses a block without it
        head.eval()
        layer_ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        embed, L = policy.get_input_embeddings(), policy.config.num_hidden_layers

        def drafts(ids: Sequence[int], first: int, k: int) -> np.ndarray:
            with torch.no_grad():
                out = policy(input_ids=torch.tensor([list(ids)]), output_hidden_states=True, logits_to_keep=1)
                aux = torch.cat(aux_hidden(out.hidden_states, layer_ids, L), -1)[0]
                return greedy_drafts(head, aux, out.hidden_states[0][0], embed, k, first).numpy()

        return drafts

    def check_nemo_rl(self, spec: Block, policy: dict) -> None:
        draft = policy.get("draft") or {}
        trained = draft.get("model_name") if draft.get("enabled") else None
        if trained and trained != spec.eagle3.model:
            raise ConfigError(
                f"policy.generation.speculative_decoding.eagle3.model: got {spec.eagle3.model!r}, but the trainer's "
                f"Eagle head is policy.draft.model_name={trained!r}; they must be the same checkpoint")


# --------------------------------------------------------------------------- the head in plain torch

def _build_torch_modules() -> dict:
    """The head's torch module classes (MidLayer, Eagle3Head; their norms and MLP are the shared
    `machinery.layers`), built on first use so that declaring the drafter (config validation, the CLI)
    imports no torch."""
    import torch
    import torch.nn.functional as F

    from nemo_rl_specdec.drafters.machinery.layers import RMSNorm, SwiGLU

    class MidLayer(torch.nn.Module):
        def __init__(self, H: int, nh: int, nkv: int, hd: int, inter: int, eps: float):
            super().__init__()
            self.nh, self.nkv, self.hd = nh, nkv, hd
            self.self_attn: Any = torch.nn.Module()   # projections attached by their checkpoint names
            self.self_attn.q_proj = torch.nn.Linear(2 * H, nh * hd, bias=False)
            self.self_attn.k_proj = torch.nn.Linear(2 * H, nkv * hd, bias=False)
            self.self_attn.v_proj = torch.nn.Linear(2 * H, nkv * hd, bias=False)
            self.self_attn.o_proj = torch.nn.Linear(nh * hd, H, bias=False)
            self.mlp = SwiGLU(H, inter)
            self.input_layernorm = RMSNorm(H, eps)
            self.post_attention_layernorm = RMSNorm(H, eps)
            self.hidden_norm = RMSNorm(H, eps)


    class Eagle3Head(torch.nn.Module):
        """vLLM llama_eagle3 (one layer, norm_before_residual=False) in plain torch."""

        def __init__(self, H: int, n_aux: int, vocab: int, nh: int, nkv: int, hd: int, inter: int,
                     eps: float = 1e-6, theta: float = 10000.0, draft_vocab: int | None = None):
            super().__init__()
            self.theta = theta
            self.vocab = int(vocab)
            self.fc = torch.nn.Linear(n_aux * H, H, bias=False)
            self.midlayer = MidLayer(H, nh, nkv, hd, inter, eps)
            self.norm = RMSNorm(H, eps)
            self.set_draft_vocab(None if draft_vocab is None or draft_vocab >= vocab
                                 else torch.arange(int(draft_vocab)), H)

        def set_draft_vocab(self, draft_ids: torch.Tensor | None, H: int | None = None,
                            rows: torch.Tensor | None = None) -> None:
            """The head drafts from the policy ids `draft_ids` (ascending; None: the whole vocabulary):
            lm_head gets one row per draft token (`rows` [n, H], default: left as made) and the maps
            vLLM's Eagle3 reads, d2t (draft id -> policy id minus draft id) and t2d (policy id -> in
            the draft vocabulary)."""
            H = int(H or self.fc.out_features)
            n = self.vocab if draft_ids is None else int(draft_ids.numel())
            lm = torch.nn.Linear(H, n, bias=False)
            if rows is not None:
                with torch.no_grad():
                    lm.weight.copy_(rows)
            self.lm_head = lm
            for name in ("d2t", "t2d"):
                self._buffers.pop(name, None)
            if draft_ids is not None:
                self.register_buffer("d2t", draft_ids - torch.arange(n))
                t2d = torch.zeros(self.vocab, dtype=torch.bool)
                t2d[draft_ids] = True
                self.register_buffer("t2d", t2d)

        def draft_ids(self) -> torch.Tensor | None:
            """The policy ids of the draft vocabulary (None: the whole vocabulary)."""
            d2t = self._buffers.get("d2t")
            return None if d2t is None else torch.arange(d2t.numel(), device=d2t.device) + d2t

        def to_policy_ids(self, tok: torch.Tensor) -> torch.Tensor:
            """Draft-vocabulary ids (argmaxes of lm_head) as the policy's token ids."""
            d2t = self._buffers.get("d2t")
            return tok if d2t is None else tok + d2t[tok]

        def forward(self, embeds: torch.Tensor, hidden: torch.Tensor,
                    pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            """embeds = emb(x_{t+1}), hidden = g_t (or the head's own pre-norm output) [B, T, H].
            Returns (logits, pre-norm output)."""
            normed, h = self.hidden(embeds, hidden, pos)
            return self.lm_head(normed), h

        def hidden(self, embeds: torch.Tensor, hidden: torch.Tensor,
                   pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            """As `forward`, with the normed output (what lm_head reads) in place of the logits."""
            L = self.midlayer
            B, T, _ = embeds.shape
            residual = hidden
            x = torch.cat([L.input_layernorm(embeds), L.hidden_norm(hidden)], -1)
            a = L.self_attn
            q = a.q_proj(x).view(B, T, L.nh, L.hd).transpose(1, 2)
            k = a.k_proj(x).view(B, T, L.nkv, L.hd).transpose(1, 2)
            v = a.v_proj(x).view(B, T, L.nkv, L.hd).transpose(1, 2)
            q, k = rope(q, pos, self.theta), rope(k, pos, self.theta)
            rep = L.nh // L.nkv
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1)
            h = a.o_proj(o) + residual
            m = L.post_attention_layernorm(h)
            h = L.mlp(m) + h
            return self.norm(h), h

        def checkpoint_tensors(self) -> dict:
            return state_tensors(self)

    return {"MidLayer": MidLayer, "Eagle3Head": Eagle3Head}


torch_modules = LazyTorchModules(__name__, ("MidLayer", "Eagle3Head"), _build_torch_modules)
__getattr__ = torch_modules.module_getattr


def aux_hidden(hidden_states: Sequence[Any], layer_ids: Iterable[int], num_layers: int) -> list:
    """The aux hidden states (id i = residual stream after i decoder layers, 0 = embeddings) among a
    forward's ``hidden_states`` (entry i < num_layers is the input of layer i; the last entry is after
    the final norm, so ids must stay below the layer count)."""
    bad = [i for i in layer_ids if not 0 <= int(i) < num_layers]
    if bad:
        raise ValueError(f"eagle_aux_hidden_state_layer_ids: {bad} outside [0, {num_layers}) for a "
                         f"{num_layers}-layer policy")
    return [hidden_states[int(i)] for i in layer_ids]


def load_head(head_dir: str | Path) -> tuple:
    """(Eagle3Head with the checkpoint's tensors, its config dict) from an EAGLE/HF-layout directory
    (with a draft vocabulary: its d2t map checked against the config, `check_vocab_map`)."""
    import torch

    head_dir = Path(head_dir)
    cfg = json.loads((head_dir / "config.json").read_text())
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if not ids:
        raise ValueError(f"{head_dir}/config.json: eagle_config.eagle_aux_hidden_state_layer_ids is missing")
    H = int(cfg["hidden_size"])
    hd = int(cfg.get("head_dim") or H // int(cfg["num_attention_heads"]))
    vocab, draft_vocab = int(cfg["vocab_size"]), int(cfg.get("draft_vocab_size") or cfg["vocab_size"])
    if draft_vocab > vocab:
        raise ValueError(f"{head_dir}/config.json: draft_vocab_size {draft_vocab} is larger than vocab_size "
                         f"{vocab}; allowed: <= {vocab}")
    head = torch_modules().Eagle3Head(
        H, len(ids), vocab, int(cfg["num_attention_heads"]),
        int(cfg["num_key_value_heads"]), hd, int(cfg["intermediate_size"]), float(cfg.get("rms_norm_eps", 1e-6)),
        float(cfg.get("rope_theta", 10000.0)), draft_vocab)
    settle(head, dtype=torch.float32)
    if estimating():  # shapes only (train/estimate.py): there are no values to load
        return head, cfg
    tensors = read_safetensors(head_dir)
    if draft_vocab < vocab:
        check_vocab_map(tensors, vocab, draft_vocab, head_dir)
    load_checkpoint(head, tensors, head_dir, "not a one-layer llama_eagle3 head", untrained=("d2t", "t2d"))
    return head, cfg


def check_vocab_map(tensors: dict, vocab: int, draft_vocab: int, where: str | Path) -> None:
    """A head with a draft vocabulary carries ``d2t`` ([draft_vocab] offsets: draft id i drafts policy
    id i + d2t[i], distinct ids below `vocab`) and may carry ``t2d`` ([vocab] booleans, True at those
    ids); anything else is refused, naming the checkpoint and what was found."""
    import torch

    d2t = tensors.get("d2t")
    if d2t is None:
        raise ValueError(f"eagle3.model: {where} has draft_vocab_size {draft_vocab} < vocab_size {vocab} but no "
                         "d2t tensor; allowed: a d2t map of the draft vocabulary (as vLLM's Eagle3 reads it)")
    if d2t.dtype.is_floating_point or tuple(d2t.shape) != (draft_vocab,):
        raise ValueError(f"eagle3.model: {where} d2t is {str(d2t.dtype).removeprefix('torch.')} "
                         f"{list(d2t.shape)}; allowed: integers of shape [{draft_vocab}] (config.json "
                         "draft_vocab_size)")
    ids = torch.arange(draft_vocab) + d2t.long()
    if int(ids.min()) < 0 or int(ids.max()) >= vocab or ids.unique().numel() != draft_vocab:
        raise ValueError(f"eagle3.model: {where} d2t does not map the draft vocabulary to {draft_vocab} distinct "
                         f"policy ids in [0, {vocab}); allowed: d2t[i] = (policy id of draft token i) - i")
    t2d = tensors.get("t2d")
    if t2d is not None:
        want = torch.zeros(vocab, dtype=torch.bool)
        want[ids] = True
        if tuple(t2d.shape) != (vocab,) or not torch.equal(t2d.bool(), want):
            raise ValueError(f"eagle3.model: {where} t2d does not match d2t; allowed: t2d[j] = True exactly for "
                             "the policy ids d2t maps to")


def token_counts(seqs: Iterable[TokenSequence], vocab: int) -> torch.Tensor:
    """How often each policy id appears in the responses of `seqs` (TokenSequence) [vocab]."""
    import torch

    counts = torch.zeros(vocab, dtype=torch.long)
    for s in seqs:
        if s.response:
            counts += torch.bincount(torch.tensor(s.response, dtype=torch.long), minlength=vocab)
    return counts


def choose_draft_vocab(counts: torch.Tensor, size: int) -> torch.Tensor:
    """The `size` most frequent policy ids of `counts` [vocab] (ties: the smaller id), ascending."""
    import torch

    vocab = counts.numel()
    if not 1 <= size <= vocab:
        raise ValueError(f"eagle3.draft_vocab_size: got {size}; allowed: 1 .. {vocab} (the policy's vocabulary)")
    # stable descending sort by count keeps the smaller id first among equal counts
    order = torch.sort(counts.cpu(), descending=True, stable=True).indices[:size]
    return order.sort().values


def greedy_drafts(head: Any, aux: torch.Tensor, emb: torch.Tensor, embed: Callable[[torch.Tensor], torch.Tensor],
                  k: int, first: int) -> torch.Tensor:
    """The head's greedy k-token drafts at every decode position of one recorded sequence, as vLLM's
    eagle3 proposer makes them (teacher-forced: the policy's hidden states of the recorded tokens).

    aux: the policy's aux hidden states over the sequence, concatenated [T, n*H]; emb: its
    embeddings of the sequence [T, H]; embed: the token embedding (a draft token's input);
    first: the first text index to draft for. Row r of the returned [T - first, k] tensor is
    the draft for text indices first + r, ..., first + r + k - 1, made when tokens 0 .. first + r - 1
    are verified (2 <= first < T): head position t = first + r - 2 reads x_{t+1} and the policy's g_t and attends to
    the head's teacher-forced positions 0..t; its draft step j (>= 1) reads its previous draft token
    and its own pre-norm output at rope position t + j and attends to positions 0..t plus its own
    chain so far (the head's KV cache in vLLM: the verified positions, then the draft's)."""
    import torch
    import torch.nn.functional as F

    T = emb.shape[0]
    if not 2 <= first < T or k < 1:  # text index 1 would need head position -1: the prefill drafts nothing
        raise ValueError(f"greedy_drafts: first={first}, k={k} for a sequence of {T} tokens; allowed: "
                         "2 <= first < T and k >= 1")
    L, a = head.midlayer, head.midlayer.self_attn
    nh, nkv, hd = L.nh, L.nkv, L.hd
    rep = nh // nkv

    def project(embeds: torch.Tensor, hidden: torch.Tensor,
                pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = torch.cat([L.input_layernorm(embeds), L.hidden_norm(hidden)], -1)
        q = rope(a.q_proj(x).view(-1, nh, hd).transpose(0, 1).unsqueeze(0), pos.unsqueeze(0), head.theta)[0]
        kk = rope(a.k_proj(x).view(-1, nkv, hd).transpose(0, 1).unsqueeze(0), pos.unsqueeze(0), head.theta)[0]
        v = a.v_proj(x).view(-1, nkv, hd).transpose(0, 1)
        return q, kk.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)  # [heads, rows, hd]

    def finish(o: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = a.o_proj(o.transpose(0, 1).reshape(o.shape[1], -1)) + residual
        h = L.mlp(L.post_attention_layernorm(h)) + h
        return head.to_policy_ids(head.lm_head(head.norm(h)).argmax(-1)), h

    with torch.no_grad():
        # step 0 over every position: the teacher-forced keys, and each position's first draft token
        pos = torch.arange(T - 1)
        hidden = head.fc(aux[:T - 1])
        q, keys, vals = project(emb[1:T], hidden, pos)
        o = F.scaled_dot_product_attention(q.unsqueeze(0), keys.unsqueeze(0), vals.unsqueeze(0), is_causal=True)[0]
        tok, pre = finish(o, hidden)
        base = torch.arange(first - 2, T - 2)  # the head positions that draft, one per text index first..T-1
        out = [tok[base]]
        pre, tok = pre[base], tok[base]
        scale = hd ** -0.5
        prefix = (torch.arange(T - 1).unsqueeze(0) <= base.unsqueeze(1))  # [rows, T-1]: keys 0..t
        chain_k, chain_v = [], []
        for j in range(1, k):
            q, kk, vv = project(embed(tok), pre, base + j)
            chain_k.append(kk)
            chain_v.append(vv)
            s_prefix = torch.einsum("hrd,hcd->hrc", q, keys) * scale
            s_prefix = s_prefix.masked_fill(~prefix.unsqueeze(0), float("-inf"))
            s_chain = torch.stack([(q * c).sum(-1) for c in chain_k], -1) * scale  # [heads, rows, j]
            w = torch.softmax(torch.cat([s_prefix, s_chain], -1), -1)
            o = torch.einsum("hrc,hcd->hrd", w[..., :T - 1], vals) + \
                torch.einsum("hrj,jhrd->hrd", w[..., T - 1:], torch.stack(chain_v))
            tok, pre = finish(o, pre)
            out.append(tok)
        return torch.stack(out, -1)


def eagle3_loss(head: Any, item: dict, t_out: torch.Tensor, *, ttt: bool = True, temperature: float = 1.0) -> KL:
    """Eagle3 training loss on one padded batch, as vLLM runs the head (a `KL`, train/kl.py).

    item: mask [B, T-1] (pad_batch: logits at t predict a response token), aux = cat of the aux hidden
    states [B, T, n*H] and emb = the policy's embeddings of ids [B, T] (both in the head's dtype),
    t_hidden = the policy's final hidden states [B, T, H]; t_out: the policy's output projection, its
    rows of the head's draft vocabulary where the head has one (the target is then the policy's
    distribution over the draft vocabulary, the tokens the head can draft).
    Step 0 at positions t = 0..T-3 reads x_{t+1} and g_t and is trained towards the policy at t+1
    (the distribution of x_{t+2}); with `ttt`, a second step feeds the head its own pre-norm output
    (draft position 2), weight 0.5. Agreement counts step 0."""
    import torch
    from torch.utils.checkpoint import checkpoint

    def layer(*args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # with gradients, the layer's activations are recomputed in backward instead of kept (at
        # Qwen3-8B shapes its MLP alone keeps 0.8 GB per step of a 4,096-token micro-batch)
        if torch.is_grad_enabled():
            return checkpoint(head.hidden, *args, use_reentrant=False)
        return head.hidden(*args)

    mask, aux, emb, th = item["mask"], item["aux"], item["emb"], item["t_hidden"]
    B, T = mask.shape[0], mask.shape[1] + 1
    pos = torch.arange(T - 2, device=mask.device).unsqueeze(0).expand(B, -1)
    m = mask[:, 1:T - 1]  # position t+1 predicts a response token
    normed0, pre0 = layer(emb[:, 1:T - 1], head.fc(aux[:, : T - 2]), pos)
    parts = [(normed0[m], th[:, 1:T - 1][m], 1.0, True)]
    if ttt and T > 3:
        m1 = mask[:, 2:T - 1]
        if bool(m1.any()):
            normed1, _ = layer(emb[:, 2:T - 1], pre0[:, :-1], pos[:, 1:])
            parts.append((normed1[m1], th[:, 2:T - 1][m1], 0.5, False))
    weights = torch.cat([torch.full((h.shape[0],), w / max(1, h.shape[0]), device=h.device) for h, _, w, _ in parts])
    agree = torch.cat([torch.full((h.shape[0],), a, dtype=torch.bool, device=h.device) for h, _, _, a in parts])
    return linear_forward_kl(torch.cat([p[0] for p in parts]), head.lm_head.weight, torch.cat([p[1] for p in parts]),
                             t_out, temperature=temperature, weights=weights, agree=agree)


class Eagle3Distiller(HiddenStateDistiller):
    """Online trainer of an Eagle3 head (EAGLE/HF layout, one ``llama_eagle3`` layer) on rollouts.

    Teacher side (no grad): one forward of the policy gives the aux hidden states at the head's
    ``eagle_aux_hidden_state_layer_ids`` and the logits (targets at the sampling temperature); the
    head reads the policy's embeddings (vLLM shares them), computed here as constants. Trained:
    ``fc``, ``midlayer.*``, ``norm``, ``lm_head`` (the head's own; with a draft vocabulary, its rows
    of the draft tokens, and the target is the policy's distribution over them)."""

    kind = "eagle3"
    what, layers_key, source_arg = "an Eagle3", "eagle_aux_hidden_state_layer_ids", "head_dir"

    def __init__(self, head_dir: str | Path, *, ttt: bool = True, draft_vocab_size: int | None = None, **kw: Any):
        """`ttt`: also train the second (test-time-training) step; `draft_vocab_size`: the tokens the
        head drafts from (None: the checkpoint's; smaller than a full-vocabulary checkpoint's: chosen
        at the first step from the response tokens of its rollouts, then kept); `kw`: the loop's
        settings (Distiller)."""
        self.ttt = bool(ttt)
        self.want_draft_vocab = draft_vocab_size
        super().__init__(head_dir, **kw)

    def _read(self, head_dir: str | Path) -> tuple:
        head, config = load_head(head_dir)
        layer_ids = [int(i) for i in config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
        vocab, have = head.vocab, head.lm_head.out_features
        want = self.want_draft_vocab
        self.pending_vocab = None
        if want is not None and want != have:
            if want > vocab:
                raise DistillInputError(f"eagle3.draft_vocab_size: got {want}; allowed: <= {vocab}, the policy's "
                                        "vocabulary")
            if have != vocab:
                raise DistillInputError(f"eagle3.draft_vocab_size: got {want}, but the head at {head_dir} has a "
                                        f"draft vocabulary of {have} (its d2t map); allowed: {have}, or a "
                                        "full-vocabulary head to choose a draft vocabulary for")
            self.pending_vocab = int(want)  # chosen from the first step's rollouts
        return head, config, layer_ids, vocab

    @property
    def draft_vocab_size(self) -> int:
        return int(self.pending_vocab or self.module.lm_head.out_features)

    def _before_step(self, seqs: list, dp: Any = None) -> None:
        """Choose the draft vocabulary from this step's response tokens (summed over the data-parallel
        ranks) if it is still to be chosen: lm_head keeps its rows of the chosen ids, and the optimizer
        starts over on the new parameters."""
        if self.pending_vocab is None:
            return
        counts = token_counts(seqs, self.vocab_size)
        if dp is not None:
            counts = dp.sum_tensor(counts)
        ids = choose_draft_vocab(counts, self.pending_vocab).to(self.device)
        head = self.module
        head.set_draft_vocab(ids, rows=head.lm_head.weight.detach()[ids])
        self._adopt_draft_vocab(ids)

    def _adopt_draft_vocab(self, ids: Any) -> None:
        """After the head took the draft vocabulary `ids`: its tensors settle on the device, it trains, and
        the optimizer starts over on the new lm_head with the same hyper-parameters."""
        head = self.module
        settle(head, self.device, self.dtype)
        head.train()
        self.opt = self.torch.optim.AdamW(head.parameters(), **{k: v for k, v in self.opt.defaults.items()
                                                               if k in ("lr", "weight_decay", "betas", "eps")})
        self.pending_vocab = None
        self.config = {**self.config, "draft_vocab_size": int(ids.numel())}

    def _draft_vocab(self) -> int | None:
        return None if self.module.draft_ids() is None else int(self.module.lm_head.out_features)

    def _before_load(self, state: dict) -> None:
        """A saved head with a draft vocabulary: this one drafts from the same ids (its d2t map) before
        the tensors load, and the optimizer starts on the new lm_head (its saved state then loads)."""
        saved = state.get("draft_vocab_size")
        want = self.pending_vocab or self.want_draft_vocab
        if saved is not None and want is not None and int(want) != int(saved):
            raise DistillInputError(f"eagle3.draft_vocab_size: the saved head drafts from {saved} tokens; this run "
                                    f"asks for {want}")
        d2t = state["module"].get("d2t")
        if d2t is None or (self.module.draft_ids() is not None and self.pending_vocab is None):
            return
        ids = (self.torch.arange(d2t.numel()) + d2t.long()).to(self.device)
        self.module.set_draft_vocab(ids)
        self._adopt_draft_vocab(ids)

    def _teacher_side(self, teacher: Any) -> None:
        """Per step: the policy's output projection, and its rows of the draft vocabulary (the loss's
        target is the policy's distribution over the draft vocabulary, as the head drafts from it)."""
        super()._teacher_side(teacher)
        ids = self.module.draft_ids()
        self.t_draft = self.t_out if ids is None else self.t_out[ids.to(self.t_out.device)]

    def _teacher_forward(self, teacher: Any, ids: torch.Tensor) -> tuple[dict, torch.Tensor]:
        out, h = super()._teacher_forward(teacher, ids)
        if self.t_draft.dtype != self.t_out.dtype:  # cast with the projection (mixed precision)
            self.t_draft = self.t_draft.to(self.t_out.dtype)
        return out, h

    def _hidden_wanted(self, teacher: Any) -> set:
        # the embeddings are the forward's input of layer 0: a separate call of a sharded (FSDP)
        # policy's embedding module would see its weight still sharded
        aux_hidden(range(teacher.config.num_hidden_layers), self.layer_ids, teacher.config.num_hidden_layers)
        return {0, *self.layer_ids}

    def _prepare(self, teacher: Any, ids: torch.Tensor, mask: torch.Tensor) -> dict:
        kept, h = self._teacher_forward(teacher, ids)
        aux = self.torch.cat([whole(kept[int(i)]) for i in self.layer_ids], -1)
        return {"mask": mask, "aux": self._cast(aux), "emb": self._cast(kept[0]), "t_hidden": h,
                "n": int(mask[:, 1:].sum())}

    def _loss(self, item: dict) -> KL:
        return eagle3_loss(self.module, item, self.t_draft, ttt=self.ttt, temperature=self.temperature)

    def save(self, path: Any) -> None:
        """A checkpoint directory: the original config.json with this head's draft vocabulary size,
        the current tensors (with the d2t/t2d maps of a draft vocabulary)."""
        super().save(path)
        cfg = {**self.config, "draft_vocab_size": int(self.module.lm_head.out_features)}
        (Path(path) / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
