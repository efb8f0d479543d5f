"""The `eagle3` drafter: an Eagle3 head (EAGLE/HF layout, one ``llama_eagle3`` layer) that reads
the policy's aux hidden states; vLLM's `eagle3` method runs it.

Owns its `eagle3:` sub-block, its vLLM mapping, the plain-torch mirror of vLLM's ``llama_eagle3``
forward (same parameter names, so a checkpoint needs no conversion), its training loss and its
online distiller. The bundled head is built by `tools/train_eagle3.py`.

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

import functools
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pydantic import Field

from nemo_rl_specdec.drafters.base import SOURCE_REFIT_STREAM, CheckpointDrafter
from nemo_rl_specdec.drafters.machinery.layers import rope
from nemo_rl_specdec.schema import ConfigError, Strict
from nemo_rl_specdec.train.distill import HiddenStateDistiller, check_trainable, whole
from nemo_rl_specdec.train.kl import linear_forward_kl


class Eagle3Config(Strict):
    model: str | None = Field(None, description="path of an Eagle3 head checkpoint for the policy (its config "
                                 "names the aux layers it reads)")


class Eagle3(CheckpointDrafter):
    name = "eagle3"
    config = Eagle3Config
    refresh_modes = ("online", "refit", "frozen")
    refit_hint = "refit needs the trainer to stream the Eagle head: policy.draft.enabled=true (Megatron policy)"
    trainer_stream = "policy.draft.enabled=true"

    def distiller_class(self):
        return Eagle3Distiller

    def weight_source(self, spec, streams):
        return SOURCE_REFIT_STREAM if streams.draft else super().weight_source(spec, streams)

    def check_nemo_rl(self, spec, policy):
        draft = policy.get("draft") or {}
        trained = draft.get("model_name") if draft.get("enabled") else None
        if trained and trained != spec.eagle3.model:
            raise ConfigError(
                f"policy.generation.speculative_decoding.eagle3.model: got {spec.eagle3.model!r}, but the trainer's "
                f"Eagle head is policy.draft.model_name={trained!r}; they must be the same checkpoint")


# --------------------------------------------------------------------------- the head in plain torch

@functools.cache
def torch_modules() -> SimpleNamespace:
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
            self.self_attn = torch.nn.Module()
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
                     eps: float = 1e-6, theta: float = 10000.0):
            super().__init__()
            self.theta = theta
            self.fc = torch.nn.Linear(n_aux * H, H, bias=False)
            self.midlayer = MidLayer(H, nh, nkv, hd, inter, eps)
            self.norm = RMSNorm(H, eps)
            self.lm_head = torch.nn.Linear(H, vocab, bias=False)

        def forward(self, embeds, hidden, pos):
            """embeds = emb(x_{t+1}), hidden = g_t (or the head's own pre-norm output) [B, T, H].
            Returns (logits, pre-norm output)."""
            normed, h = self.hidden(embeds, hidden, pos)
            return self.lm_head(normed), h

        def hidden(self, embeds, hidden, pos):
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
            return {k: v.detach().clone().contiguous() for k, v in self.state_dict().items()}

    for cls in (MidLayer, Eagle3Head):
        cls.__qualname__ = cls.__name__  # pickles by module attribute (the module __getattr__ below)
    return SimpleNamespace(MidLayer=MidLayer, Eagle3Head=Eagle3Head)


def __getattr__(name: str):
    if name in ("MidLayer", "Eagle3Head"):
        return getattr(torch_modules(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def aux_hidden(hidden_states, layer_ids, num_layers: int) -> list:
    """The aux hidden states (id i = residual stream after i decoder layers, 0 = embeddings) among a
    forward's ``hidden_states`` (entry i < num_layers is the input of layer i; the last entry is after
    the final norm, so ids must stay below the layer count)."""
    bad = [i for i in layer_ids if not 0 <= int(i) < num_layers]
    if bad:
        raise ValueError(f"eagle_aux_hidden_state_layer_ids: {bad} outside [0, {num_layers}) for a "
                         f"{num_layers}-layer policy")
    return [hidden_states[int(i)] for i in layer_ids]


def load_head(head_dir) -> tuple:
    """(Eagle3Head with the checkpoint's tensors, its config dict) from an EAGLE/HF-layout directory."""
    from safetensors.torch import load_file

    head_dir = Path(head_dir)
    cfg = json.loads((head_dir / "config.json").read_text())
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if not ids:
        raise ValueError(f"{head_dir}/config.json: eagle_config.eagle_aux_hidden_state_layer_ids is missing")
    H = int(cfg["hidden_size"])
    hd = int(cfg.get("head_dim") or H // int(cfg["num_attention_heads"]))
    head = torch_modules().Eagle3Head(
        H, len(ids), int(cfg.get("draft_vocab_size") or cfg["vocab_size"]), int(cfg["num_attention_heads"]),
        int(cfg["num_key_value_heads"]), hd, int(cfg["intermediate_size"]), float(cfg.get("rms_norm_eps", 1e-6)),
        float(cfg.get("rope_theta", 10000.0))).float()
    tensors = {}
    for f in sorted(head_dir.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    check_trainable(tensors, head_dir)
    missing, unexpected = head.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        raise ValueError(f"{head_dir}: not a one-layer llama_eagle3 head (missing {missing[:4]}, "
                         f"unexpected {unexpected[:4]})")
    return head, cfg


def eagle3_loss(head, item, t_out, *, ttt: bool = True, temperature: float = 1.0):
    """Eagle3 training loss on one padded batch, as vLLM runs the head (a `KL`, train/kl.py).

    item: mask [B, T-1] (pad_batch: logits at t predict a response token), aux = cat of the aux hidden
    states [B, T, n*H] and emb = the policy's embeddings of ids [B, T] (both in the head's dtype),
    t_hidden = the policy's final hidden states [B, T, H]; t_out: the policy's output projection.
    Step 0 at positions t = 0..T-3 reads x_{t+1} and g_t and is trained towards the policy at t+1
    (the distribution of x_{t+2}); with `ttt`, a second step feeds the head its own pre-norm output
    (draft position 2), weight 0.5. Agreement counts step 0."""
    import torch

    mask, aux, emb, th = item["mask"], item["aux"], item["emb"], item["t_hidden"]
    B, T = mask.shape[0], mask.shape[1] + 1
    pos = torch.arange(T - 2, device=mask.device).unsqueeze(0).expand(B, -1)
    m = mask[:, 1:T - 1]  # position t+1 predicts a response token
    normed0, pre0 = head.hidden(emb[:, 1:T - 1], head.fc(aux[:, : T - 2]), pos)
    parts = [(normed0[m], th[:, 1:T - 1][m], 1.0, True)]
    if ttt and T > 3:
        m1 = mask[:, 2:T - 1]
        if bool(m1.any()):
            normed1, _ = head.hidden(emb[:, 2:T - 1], pre0[:, :-1], pos[:, 1:])
            parts.append((normed1[m1], th[:, 2:T - 1][m1], 0.5, False))
    weights = torch.cat([torch.full((h.shape[0],), w / max(1, h.shape[0]), device=h.device) for h, _, w, _ in parts])
    agree = torch.cat([torch.full((h.shape[0],), a, dtype=torch.bool, device=h.device) for h, _, _, a in parts])
    return linear_forward_kl(torch.cat([p[0] for p in parts]), head.lm_head.weight, torch.cat([p[1] for p in parts]),
                             t_out, temperature=temperature, weights=weights, agree=agree)


class Eagle3Distiller(HiddenStateDistiller):
    """Online trainer of an Eagle3 head (EAGLE/HF layout, one ``llama_eagle3`` layer) on rollouts.

    Teacher side (no grad): one forward of the policy with ``output_hidden_states`` gives the aux
    hidden states at the head's ``eagle_aux_hidden_state_layer_ids`` and the logits (targets at the
    sampling temperature); the head reads the policy's embeddings (vLLM shares them), computed here
    as constants. Trained: ``fc``, ``midlayer.*``, ``norm``, ``lm_head`` (the head's own)."""

    kind = "eagle3"
    what, layers_key, source_arg = "an Eagle3", "eagle_aux_hidden_state_layer_ids", "head_dir"

    def __init__(self, head_dir: str | Path, *, ttt: bool = True, **kw: Any):
        """`ttt`: also train the second (test-time-training) step; `kw`: the loop's settings (Distiller)."""
        self.ttt = bool(ttt)
        super().__init__(head_dir, **kw)

    def _read(self, head_dir: str | Path) -> tuple:
        head, config = load_head(head_dir)
        layer_ids = [int(i) for i in config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
        return head, config, layer_ids, int(config.get("draft_vocab_size") or config["vocab_size"])

    def _prepare(self, teacher, ids, mask) -> dict:
        # the embeddings are the forward's hidden_states[0]: a separate call of a sharded (FSDP)
        # policy's embedding module would see its weight still sharded
        out, h = self._teacher_forward(teacher, ids)
        aux = aux_hidden(out.hidden_states, self.layer_ids, teacher.config.num_hidden_layers)
        return {"mask": mask, "aux": self._cast(self.torch.cat([whole(a) for a in aux], -1)),
                "emb": self._cast(out.hidden_states[0]), "t_hidden": h, "n": int(mask[:, 1:].sum())}

    def _loss(self, item):
        return eagle3_loss(self.module, item, self.t_out, ttt=self.ttt, temperature=self.temperature)
