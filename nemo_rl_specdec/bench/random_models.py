"""Randomly initialised teachers and drafters of given shapes, in the layouts the distillers load.

Weights do not change what a distillation step allocates or how long it takes, so a memory or
time measurement needs only the shapes. :func:`small_shapes` and :func:`qwen3_8b_shapes` name
them: a teacher (transformers ``Qwen3Config`` fields; the MTP teacher is a ``Qwen2Config`` of the
same dimensions, as MiMo-style MTP checkpoints are Qwen2) and one entry per drafter.

:func:`write_checkpoints` writes, under a root directory, one directory per drafter, each what the
drafter's distiller loads:

- ``teacher``: the teacher's ``config.json`` only. :func:`build_teacher` makes the teacher from
  it with random weights (fixed seed) directly on its device: nothing to save or read back;
- ``draft_model``: a ``Qwen3ForCausalLM`` checkpoint (``save_pretrained``) sharing the vocabulary;
- ``eagle3``: the EAGLE/HF layout ``drafters/eagle3.py`` ``load_head`` reads (``config.json`` with
  ``eagle_config.eagle_aux_hidden_state_layer_ids``, ``model.safetensors`` with ``midlayer.*``,
  ``fc``, ``norm``, ``lm_head``);
- ``dflash``: the ``DFlashDraftModel`` layout of ``drafters/dflash.py`` ``load_draft``;
- ``mtp``: a MiMo-style policy directory: ``config.json`` (``MiMoForCausalLM``, ``model_type:
  qwen2``, ``num_nextn_predict_layers: 1``) and ``model.safetensors`` with the MTP layer's
  ``model.mtp_layers.0.*`` tensors, all ``drafters/mtp.py`` ``load_mtp_layer`` reads from a policy
  checkpoint; the policy's own tensors are left out (its teacher is built from the config).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DRAFTERS = ("draft_model", "eagle3", "dflash", "mtp")
PAD_ID = 0


def _heads(hidden: int, head_dim: int) -> tuple[int, int]:
    nh = max(1, hidden // head_dim)
    return nh, max(1, nh // 2) if nh % 2 == 0 else nh


def _spread(layers: int, n: int) -> list[int]:
    """Up to `n` distinct layer ids spread from layer 1 to layer `layers` - 3 (the last one for
    teachers of fewer than 5 layers), as DFlash drafts read them."""
    lo = min(1, layers - 1)
    hi = layers - 3 if layers >= 5 else layers - 1
    if n <= 1 or hi <= lo:
        return [lo]
    return sorted({lo + i * (hi - lo) // (n - 1) for i in range(n)})


def small_shapes(vocab_size: int, hidden_size: int = 256, layers: int = 4, head_dim: int = 64) -> dict:
    """A teacher of `hidden_size` x `layers` over the full `vocab_size`, and drafters to match: a
    draft model of half the width and half the layers (tied embeddings, as Qwen3-0.6B), an Eagle3
    head and a one-layer DFlash draft of the teacher's width, the MTP layer of a Qwen2 teacher of the
    same dimensions. The Eagle3 head drafts from 32,000 tokens where the vocabulary is larger."""
    nh, nkv = _heads(hidden_size, head_dim)
    teacher = dict(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=layers,
                   num_attention_heads=nh, num_key_value_heads=nkv, head_dim=head_dim,
                   intermediate_size=3 * hidden_size, tie_word_embeddings=False, rope_theta=1e6)
    dh = max(head_dim, hidden_size // 2)
    dnh, dnkv = _heads(dh, head_dim)
    draft = dict(vocab_size=vocab_size, hidden_size=dh, num_hidden_layers=max(1, layers // 2),
                 num_attention_heads=dnh, num_key_value_heads=dnkv, head_dim=head_dim, intermediate_size=3 * dh,
                 tie_word_embeddings=True, rope_theta=1e6)
    aux = sorted({min(1, layers - 1), layers // 2, layers - 1})
    head = dict(hidden_size=hidden_size, num_attention_heads=nh, num_key_value_heads=nkv, head_dim=head_dim,
                intermediate_size=3 * hidden_size)
    return {"teacher": teacher, "draft_model": draft,
            "eagle3": {**head, "aux_layer_ids": aux, "draft_vocab_size": default_draft_vocab(vocab_size)},
            "dflash": {**head, "num_hidden_layers": 1, "target_layer_ids": _spread(layers, min(5, layers)),
                       "block_size": 16},
            "mtp": {}}


def default_draft_vocab(vocab_size: int) -> int:
    """An Eagle3 head's draft vocabulary: 32,000 tokens (as published heads have) for larger vocabularies."""
    from nemo_rl_specdec.drafters.eagle3 import DEFAULT_DRAFT_VOCAB

    return min(int(vocab_size), DEFAULT_DRAFT_VOCAB)


def qwen3_8b_shapes(vocab_size: int = 151936) -> dict:
    """Qwen3-8B as the teacher (36 layers of 4096, 32 heads, 8 KV heads, 12288 MLP), a draft model of
    Qwen3-0.6B's shape, an Eagle3 head of the teacher's width with a 32,000-token draft vocabulary, a five-layer
    DFlash draft reading five teacher layers (block 16), and the MTP layer of a Qwen2 teacher of the
    same dimensions."""
    teacher = dict(vocab_size=vocab_size, hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                   num_key_value_heads=8, head_dim=128, intermediate_size=12288, tie_word_embeddings=False,
                   rope_theta=1e6)
    draft = dict(vocab_size=vocab_size, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, intermediate_size=3072, tie_word_embeddings=True,
                 rope_theta=1e6)
    head = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                intermediate_size=12288)
    return {"teacher": teacher, "draft_model": draft,
            "eagle3": {**head, "aux_layer_ids": [1, 18, 35], "draft_vocab_size": default_draft_vocab(vocab_size)},
            "dflash": {**head, "num_hidden_layers": 5, "target_layer_ids": _spread(36, 5), "block_size": 16},
            "mtp": {}}


# --------------------------------------------------------------------------- configs
def _qwen(arch: str, shape: dict, **extra) -> Any:
    from transformers import Qwen2Config, Qwen3Config

    s = dict(shape)
    theta = s.pop("rope_theta", 1e6)
    cls = Qwen3Config if arch == "qwen3" else Qwen2Config
    return cls(**s, max_position_embeddings=40960, rms_norm_eps=1e-6, hidden_act="silu",
               rope_parameters={"rope_theta": theta, "rope_type": "default"}, pad_token_id=PAD_ID,
               bos_token_id=1, eos_token_id=2, **extra)


def in_policy(drafter: str) -> bool:
    """Whether the drafter's layers are the policy checkpoint's (MTP): then its teacher is that checkpoint."""
    from nemo_rl_specdec.drafters.registry import weights_in_policy

    return weights_in_policy(drafter)


def teacher_config(shapes: dict, drafter: str) -> Any:
    """The teacher's transformers config for `drafter`: Qwen3, or where the drafter's layers are the
    policy's (MTP) a MiMo-style Qwen2."""
    if in_policy(drafter):
        return _qwen("qwen2", shapes["teacher"], architectures=["MiMoForCausalLM"], num_nextn_predict_layers=1)
    return _qwen("qwen3", shapes["teacher"], architectures=["Qwen3ForCausalLM"])


def build_teacher(config_dir, dtype: Any, device: Any, seed: int = 0):
    """The teacher of `config_dir`/config.json with random weights (seed `seed`), made on `device` in
    `dtype`, in eval mode."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(str(config_dir))
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


# --------------------------------------------------------------------------- checkpoints
def _save_tensors(module, path: Path, config: dict) -> None:
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if _is_meta(module):  # a config-only checkpoint (write_checkpoints)
        return
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in module.checkpoint_tensors().items()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def _eagle3_config(head: dict, t: dict) -> dict:
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": head["hidden_size"],
            "intermediate_size": head["intermediate_size"], "num_hidden_layers": 1,
            "num_attention_heads": head["num_attention_heads"], "num_key_value_heads": head["num_key_value_heads"],
            "head_dim": head["head_dim"], "hidden_act": "silu", "rms_norm_eps": 1e-6,
            "max_position_embeddings": 40960, "rope_theta": t.get("rope_theta", 1e6), "vocab_size": t["vocab_size"],
            "draft_vocab_size": head.get("draft_vocab_size") or t["vocab_size"], "target_hidden_size": t["hidden_size"],
            "tie_word_embeddings": False, "torch_dtype": "float32",
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(head["aux_layer_ids"]),
                             "use_aux_hidden_state": True}}


def _dflash_config(d: dict, t: dict) -> dict:
    from nemo_rl_specdec.drafters.dflash import ARCHITECTURE

    return {"architectures": [ARCHITECTURE], "model_type": "qwen3", "hidden_size": d["hidden_size"],
            "intermediate_size": d["intermediate_size"], "num_hidden_layers": d["num_hidden_layers"],
            "num_attention_heads": d["num_attention_heads"], "num_key_value_heads": d["num_key_value_heads"],
            "head_dim": d["head_dim"], "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 40960,
            "rope_parameters": {"rope_theta": t.get("rope_theta", 1e6), "rope_type": "default"},
            "attention_bias": False, "vocab_size": t["vocab_size"], "target_hidden_size": t["hidden_size"],
            "tie_word_embeddings": False, "block_size": d["block_size"], "torch_dtype": "float32",
            "dflash_config": {"mask_token_id": t["vocab_size"] - 1, "target_layer_ids": list(d["target_layer_ids"])}}


def write_drafter(drafter: str, shapes: dict, root, device: Any = "cpu", seed: int = 0) -> Path:
    """`root`/`drafter`: a checkpoint of random weights (seed `seed`, made on `device`) in the layout
    the drafter's distiller loads (module docstring); on device ``meta``, its config files only (what a
    memory estimate builds the drafter from, train/estimate.py)."""
    import torch

    out = Path(root) / drafter
    t = shapes["teacher"]
    torch.manual_seed(seed)
    if drafter not in WRITERS:
        raise ValueError(f"drafter {drafter!r}: allowed: {list(DRAFTERS)}")
    with torch.device(device):
        WRITERS[drafter](shapes, t, out)
    return out


def _is_meta(module) -> bool:
    return any(t.is_meta for t in module.parameters())


def _write_draft_model(shapes: dict, t: dict, out: Path) -> None:
    import torch
    from transformers import Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    cfg = _qwen("qwen3", shapes["draft_model"], architectures=["Qwen3ForCausalLM"])
    if torch.get_default_device().type == "meta":  # a config-only checkpoint
        out.mkdir(parents=True, exist_ok=True)
        cfg.save_pretrained(str(out))
        return
    Qwen3ForCausalLM(cfg).to("cpu").save_pretrained(str(out))


def _write_eagle3(shapes: dict, t: dict, out: Path) -> None:
    from nemo_rl_specdec.drafters.eagle3 import torch_modules

    h = shapes["eagle3"]
    head = torch_modules().Eagle3Head(h["hidden_size"], len(h["aux_layer_ids"]), t["vocab_size"],
                                      h["num_attention_heads"], h["num_key_value_heads"], h["head_dim"],
                                      h["intermediate_size"], 1e-6, t.get("rope_theta", 1e6),
                                      h.get("draft_vocab_size"))  # a draft vocabulary: the first ids
    _save_tensors(head, out, _eagle3_config(h, t))


def _write_dflash(shapes: dict, t: dict, out: Path) -> None:
    from nemo_rl_specdec.drafters.dflash import torch_modules

    d = shapes["dflash"]
    draft = torch_modules().DFlashDraft(d["hidden_size"], len(d["target_layer_ids"]),
                                        d["num_attention_heads"], d["num_key_value_heads"], d["head_dim"],
                                        d["intermediate_size"], d["num_hidden_layers"], 1e-6,
                                        t.get("rope_theta", 1e6), t["hidden_size"])
    _save_tensors(draft, out, _dflash_config(d, t))


def _write_mtp(shapes: dict, t: dict, out: Path) -> None:
    from safetensors.torch import save_file

    from nemo_rl_specdec.drafters.mtp import torch_modules

    cfg = teacher_config(shapes, "mtp")
    cfg._attn_implementation = "sdpa"
    out.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(str(out))
    layer = torch_modules().MTPLayer(cfg)
    if _is_meta(layer):  # a config-only checkpoint
        return
    save_file({k: v.to("cpu").contiguous() for k, v in layer.checkpoint_tensors().items()},
              str(out / "model.safetensors"), metadata={"format": "pt"})


# how each drafter's random checkpoint is written, in the layout its distiller loads
WRITERS = {"draft_model": _write_draft_model, "eagle3": _write_eagle3, "dflash": _write_dflash, "mtp": _write_mtp}


def write_checkpoints(shapes: dict, root, drafters=DRAFTERS, device: Any = "cpu", seed: int = 0) -> dict:
    """The teacher's config (`root`/teacher) and each drafter's checkpoint (`root`/<drafter>); returns
    {drafter: (teacher config directory, drafter directory)}. The MTP drafter's teacher is its own
    directory (a MiMo-style policy). On device ``meta``: config files only (`write_drafter`)."""
    root = Path(root)
    (root / "teacher").mkdir(parents=True, exist_ok=True)
    teacher_config(shapes, "draft_model").save_pretrained(str(root / "teacher"))
    out = {}
    for i, name in enumerate(drafters):
        path = write_drafter(name, shapes, root, device=device, seed=seed + 1 + i)
        out[name] = (str(path if in_policy(name) else root / "teacher"), str(path))
    if str(device).startswith("cuda"):
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()
    return out
