"""The `mtp` drafter: MiMo-style multi-token-prediction layers that ship inside the policy
checkpoint (``model.mtp_layers.*``); vLLM's `mtp` method runs them with the policy's shared
embedding and lm_head.

Owns its vLLM mapping (it has no settings: vLLM reads the layers, and how many there are, from
the policy checkpoint), the HF-module mirror of vLLM's MiMo MTP layer (same
parameter names), the readers of the policy side it needs (pre-norm hidden state, inputs), and
its online distiller. The bundled MTP policy is built by `tools/train_tiny_mtp.py`.

In NeMo-RL the layers are refreshed by a trainer that trains them
(`policy.megatron_cfg.mtp_num_layers > 0`: they arrive in the policy's weight stream), else they
stay the checkpoint's.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemo_rl_specdec.config.schema import PathError
from nemo_rl_specdec.drafters.base import SOURCE_CHECKPOINT_ONCE, SOURCE_REFIT_STREAM, ModelDrafter
from nemo_rl_specdec.drafters.machinery.checkpoint import load_checkpoint, read_safetensors, state_tensors
from nemo_rl_specdec.drafters.machinery.lazy_torch import LazyTorchModules
from nemo_rl_specdec.drafters.roles import Block, TrainerStreams
from nemo_rl_specdec.train.distill import (
    Distiller,
    DistillInputError,
    estimating,
    last_layer_output,
    settle,
)
from nemo_rl_specdec.train.kl import KL, linear_forward_kl

if TYPE_CHECKING:
    import torch

MTP_PREFIX = "model.mtp_layers.0."


class MTP(ModelDrafter):
    name = "mtp"
    refresh_modes = ("refit", "online", "frozen")
    weights_in_policy_checkpoint = True
    refit_hint = "refit needs the trainer to train and stream the MTP layers: policy.megatron_cfg.mtp_num_layers > 0"
    trainer_stream = "policy.megatron_cfg.mtp_num_layers > 0"

    def vllm_config(self, spec: Block, temperature: float) -> dict:
        # the drafter is read from the target checkpoint
        return {"method": "mtp", "num_speculative_tokens": spec.num_speculative_tokens,
                "draft_sample_method": self.draft_sample_method(spec, temperature)}

    def check_policy(self, spec: Block, policy_dir: Any) -> None:
        import json

        cfg = json.loads((Path(policy_dir) / "config.json").read_text())
        if not int(cfg.get("num_nextn_predict_layers") or 0):
            raise PathError("drafter", self.name, f"a drafter other than 'mtp': the policy {policy_dir} has no MTP "
                            "layers (its config.json has no num_nextn_predict_layers)")

    def build_distiller(self, spec: Block, *, temperature: float, seed: int,
                        model_path: str | None, **kw: Any) -> Distiller:
        if not model_path:
            raise DistillInputError("drafter 'mtp' trains the MTP layers of the policy checkpoint: pass model_path")
        return MTPDistiller(model_path, temperature=temperature, seed=seed, **kw)

    def weight_source(self, spec: Block, streams: TrainerStreams) -> str:
        return SOURCE_REFIT_STREAM if streams.mtp else SOURCE_CHECKPOINT_ONCE


# --------------------------------------------------------------------------- the MTP layer in torch

def _build_torch_modules() -> dict:
    """The MTP layer's torch module class, built on first use (`machinery/lazy_torch.py`)."""
    import torch

    class MTPLayer(torch.nn.Module):
        """HF-module mirror of vLLM's MiMoMultiTokenPredictorLayer (same parameter names)."""

        def __init__(self, config: Any):
            super().__init__()
            from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RMSNorm

            H, eps = config.hidden_size, config.rms_norm_eps
            self.token_layernorm = Qwen2RMSNorm(H, eps=eps)
            self.hidden_layernorm = Qwen2RMSNorm(H, eps=eps)
            self.input_proj = torch.nn.Linear(2 * H, H, bias=False)
            self.block = Qwen2DecoderLayer(config, layer_idx=config.num_hidden_layers - 1)  # a full-attention layer
            self.final_layernorm = Qwen2RMSNorm(H, eps=eps)

        def forward(self, hidden: torch.Tensor, embeds: torch.Tensor, position_ids: torch.Tensor,
                    rotary: Callable[[torch.Tensor, torch.Tensor], Any]) -> torch.Tensor:
            embeds = torch.where((position_ids == 0).unsqueeze(-1), torch.zeros_like(embeds), embeds)
            x = self.input_proj(torch.cat([self.hidden_layernorm(hidden), self.token_layernorm(embeds)], -1))
            out = self.block(
                x, attention_mask=None, position_ids=position_ids, position_embeddings=rotary(x, position_ids)
            )
            out = out[0] if isinstance(out, tuple) else out
            return self.final_layernorm(out)

        def checkpoint_tensors(self) -> dict:
            return {MTP_PREFIX + k.replace("block.", "", 1): v for k, v in state_tensors(self).items()}

    return {"MTPLayer": MTPLayer}


torch_modules = LazyTorchModules(__name__, ("MTPLayer",), _build_torch_modules)
__getattr__ = torch_modules.module_getattr


MTP_OWN = ("token_layernorm.", "hidden_layernorm.", "input_proj.", "final_layernorm.")


def load_mtp_layer(model_dir: str | Path) -> tuple:
    """(MTPLayer with layer 0's tensors, the policy's HF config) read from the checkpoint's safetensors
    (transformers' Qwen2ForCausalLM drops ``model.mtp_layers.*`` on load, so they are read here)."""
    import torch
    from transformers import AutoConfig

    model_dir = Path(model_dir)
    cfg = AutoConfig.from_pretrained(str(model_dir))
    n = int(getattr(cfg, "num_nextn_predict_layers", 0) or 0)
    if n < 1:
        raise ValueError(f"{model_dir}: config.json has no num_nextn_predict_layers (not a MiMo-style MTP policy)")
    cfg._attn_implementation = "sdpa"  # causal with attention_mask=None
    if estimating():  # shapes only (train/estimate.py): there are no values to load
        return settle(torch_modules().MTPLayer(cfg), dtype=torch.float32), cfg
    tensors = read_safetensors(model_dir, _mtp_name)
    if not tensors:
        raise ValueError(f"{model_dir}: no {MTP_PREFIX}* tensors in its safetensors files")
    mtp = settle(torch_modules().MTPLayer(cfg), dtype=torch.float32)
    load_checkpoint(mtp, tensors, model_dir, "MTP layer 0 does not match the MiMo layout")
    return mtp, cfg


def _mtp_name(key: str) -> str | None:
    """A policy checkpoint's tensor name as the MTP layer's module names it (None: not the MTP layer's)."""
    if not key.startswith(MTP_PREFIX):
        return None
    rest = key[len(MTP_PREFIX):]
    return rest if rest.startswith(MTP_OWN) else "block." + rest


def pre_norm_hidden(policy: Any, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, last decoder layer output before the final norm) for ids [B, T]."""
    with last_layer_output(policy) as box:
        logits = policy(input_ids=ids).logits
    return logits, box["last"]


def mtp_inputs(ids: torch.Tensor, hidden: torch.Tensor,
               embeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the MTP layer reads at positions t = 0..T-2: (h_t [B, T-1, H], emb(x_{t+1}), positions t),
    from the last layer's pre-norm outputs `hidden` and the token embeddings `embeds` of ids [B, T]."""
    import torch

    T = ids.shape[1]
    pos = torch.arange(T - 1, device=ids.device).unsqueeze(0).expand(ids.shape[0], -1)
    return hidden[:, :-1], embeds[:, 1:], pos


def mtp_logits(policy: Any, mtp: Any, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """MTP logits at positions 0..T-2 (predicting ids[:, 2:] at 0..T-3)."""
    h, emb, pos = mtp_inputs(ids, hidden, policy.model.embed_tokens(ids))
    return policy.lm_head(mtp(h, emb, pos, policy.model.rotary_emb))


def mtp_loss(policy: Any, mtp: Any, ids: torch.Tensor, labels: torch.Tensor,
             hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    import torch.nn.functional as F

    lg = mtp_logits(policy, mtp, ids, hidden)[:, :-1]  # position t predicts x_{t+2}
    tgt = labels[:, 2:]
    return F.cross_entropy(lg.reshape(-1, lg.shape[-1]), tgt.reshape(-1), ignore_index=-100), lg, tgt


class MTPDistiller(Distiller):
    """Online trainer of a MiMo-style MTP layer (``model.mtp_layers.0.*``) on rollouts.

    The layer's tensors are read from the policy checkpoint's safetensors (transformers'
    Qwen2ForCausalLM drops them on load). Teacher side (no grad): the policy's last decoder layer
    output before the final norm h_t, its embeddings of x_{t+1} (the forward's hidden_states[0]),
    its RoPE tables, all in the layer's dtype, and its (tied) lm_head, whole and in the layer's dtype
    once per step; target at t = the policy's distribution at t+1. vLLM shares the embedding and
    lm_head with the target, so only the MTP layer is trained and pushed."""

    kind = "mtp"

    def _load(self, model_dir: str | Path) -> tuple:
        if not Path(model_dir).is_dir():
            raise FileNotFoundError(f"model_dir: {model_dir} is not a checkpoint directory")
        self.model_dir = str(model_dir)
        try:
            self.mtp, self.config = load_mtp_layer(model_dir)
        except ValueError as e:
            raise DistillInputError(str(e)) from None
        return self.mtp, self.config.vocab_size

    def _check_teacher(self, teacher: Any) -> None:
        super()._check_teacher(teacher)
        if teacher.config.hidden_size != self.config.hidden_size:
            raise DistillInputError(f"the policy's hidden_size {teacher.config.hidden_size} is not the MTP layer's "
                                    f"{self.config.hidden_size}")
        for attr in ("model", "lm_head"):
            if not hasattr(teacher, attr):
                raise DistillInputError(f"the teacher has no .{attr}: expected an HF causal LM (Qwen2ForCausalLM)")


    def _hidden_wanted(self, teacher: Any) -> set:
        return {0, teacher.config.num_hidden_layers}  # the embeddings, the last layer's output before the norm

    def _prepare(self, teacher: Any, ids: torch.Tensor, mask: torch.Tensor) -> dict:
        kept, final = self._teacher_forward(teacher, ids)
        L = teacher.config.num_hidden_layers
        h, emb, pos = mtp_inputs(ids, self._cast(kept[L]), self._cast(kept[0]))
        cos, sin = teacher.model.rotary_emb(h, pos)
        return {"mask": mask, "h": h, "emb": emb, "pos": pos, "rope": (cos.detach(), sin.detach()),
                "t_hidden": final, "n": int(mask[:, 1:].sum())}

    def _loss(self, item: dict) -> KL:
        rope = item["rope"]
        out = self.mtp(item["h"], item["emb"], item["pos"], lambda x, p: rope)[:, :-1]  # t predicts x_{t+2}
        T1 = out.shape[1]
        m = item["mask"][:, 1:T1 + 1]
        # the MTP layer's logits go through the policy's lm_head as vLLM shares it (in the policy's dtype)
        return linear_forward_kl(out[m], self.t_out, item["t_hidden"][:, 1:T1 + 1][m], self.t_out,
                                 temperature=self.temperature)

    # ------------------------------------------------------------------ export
    def state_dict(self) -> dict:
        """The MTP layer's tensors as ``model.mtp_layers.0.*`` (what vLLM's MiMo MTP drafter loads)."""
        return self.mtp.checkpoint_tensors()

    def save(self, path: str | Path, policy_state_dict: dict | None = None) -> None:
        """A full MiMo checkpoint directory: the policy (`policy_state_dict`, else the original one's
        non-MTP tensors) plus the current MTP layer, config and tokenizer files copied."""
        import shutil

        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        for f in Path(self.model_dir).iterdir():
            if f.is_file() and f.suffix != ".safetensors":
                shutil.copy(f, path / f.name)
        if policy_state_dict is None:
            policy_state_dict = read_safetensors(self.model_dir)
        tensors = {k: v.detach().contiguous() for k, v in policy_state_dict.items()
                   if not k.startswith("model.mtp_layers.")}
        if self.config.tie_word_embeddings:
            tensors.pop("lm_head.weight", None)
        tensors.update(self.state_dict())
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
