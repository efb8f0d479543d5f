"""Train a tiny DFlash draft for a policy, offline, from the policy's rollouts and hidden states.

    python -m nemo_rl_specdec.tools.train_dflash --policy nemo_rl_specdec/assets/tiny/policy \
        --out nemo_rl_specdec/assets/tiny/dflash --seed 0

Writes a checkpoint that vLLM's ``dflash`` method loads (``DFlashDraftModel``); the draft, its
layout and its loss are the drafter's own (`drafters/dflash.py`). Training data:

1. rollouts of the policy (vLLM, no speculation) on task problems: greedy and T=1 samples
   (the same data as the Eagle3 head, `tools/train_eagle3.py`);
2. one HF forward of the policy over prompt + response gives the hidden states of the target
   layers and the logits;
3. the DFlash loss as vLLM runs the draft: blocks of x_n and `block_size - 1` mask tokens at
   random response positions n (a new draw every epoch), forward KL towards the policy at every
   block offset, earlier offsets weighted more.

The mask token is an id the tokenizer never produces (the policy's vocabulary is padded beyond
the tokenizer's), so it carries no text meaning into the blocks.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from nemo_rl_specdec.drafters.dflash import (
    ARCHITECTURE,
    DFlashDraft,
    dflash_loss,
    pick_anchors,
    query_blocks,
    target_hidden,
)
from nemo_rl_specdec.resources import asset_path
from nemo_rl_specdec.tools.train_eagle3 import policy_rollouts
from nemo_rl_specdec.tools.train_tiny import optimizer_step


def log(msg: str) -> None:
    print(f"[train_dflash {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def unused_token_id(policy_dir: str, vocab_size: int) -> int:
    """The highest id of the model's vocabulary that the tokenizer never produces."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(policy_dir)
    used = set(tok.get_vocab().values())
    free = [i for i in range(vocab_size) if i not in used]
    if not free:
        raise ValueError(f"{policy_dir}: every id of the {vocab_size}-token vocabulary is a token; pass --mask-token-id")
    return free[-1]


def draft_config(c, args, layer_ids, mask_token_id: int, dims) -> dict:
    """config.json of the draft: Qwen3 dimensions, DFlash fields (what vLLM's qwen3_dflash reads)."""
    H, nh, nkv, hd, inter = dims
    return {"architectures": [ARCHITECTURE], "model_type": "qwen3", "hidden_size": H, "intermediate_size": inter,
            "num_hidden_layers": args.layers, "num_attention_heads": nh, "num_key_value_heads": nkv, "head_dim": hd,
            "hidden_act": "silu", "rms_norm_eps": c.rms_norm_eps, "max_position_embeddings": c.max_position_embeddings,
            "rope_parameters": {"rope_theta": rope_theta(c), "rope_type": "default"}, "attention_bias": False,
            "vocab_size": c.vocab_size, "target_hidden_size": c.hidden_size, "tie_word_embeddings": False,
            "block_size": args.block_size, "torch_dtype": "float32",
            "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": list(layer_ids)}}


def rope_theta(c) -> float:
    return float((getattr(c, "rope_parameters", None) or {}).get("rope_theta", getattr(c, "rope_theta", 10000.0)))


def train(policy_dir: str, data: list, args) -> tuple:
    from transformers import AutoModelForCausalLM

    from nemo_rl_specdec.train.distill import _Seq, micro_batches, pad_batch

    policy = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32).eval()
    for p in policy.parameters():
        p.requires_grad_(False)
    c = policy.config
    L = c.num_hidden_layers
    layer_ids = args.target_layer_ids or list(range(L))
    mask_id = args.mask_token_id if args.mask_token_id is not None else unused_token_id(policy_dir, c.vocab_size)
    H, hd = c.hidden_size, getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    nh = H // hd
    nkv = max(1, nh // 2) if nh % 2 == 0 else nh
    dims = (H, nh, nkv, hd, 2 * H)
    torch.manual_seed(args.seed)
    draft = DFlashDraft(H, len(layer_ids), nh, nkv, hd, 2 * H, args.layers, c.rms_norm_eps, rope_theta(c)).float()
    embed = policy.get_input_embeddings().weight.detach()
    lm_head = policy.get_output_embeddings().weight.detach()
    opt = torch.optim.AdamW(draft.parameters(), lr=args.lr, weight_decay=0.0)
    seqs = [_Seq(list(p), list(r)) for p, r in data]
    batches = micro_batches([len(s.prompt) + len(s.response) for s in seqs], args.micro_batch_tokens)
    cache = []  # the policy side once: target-layer states, teacher log-probs
    for idx in batches:
        ids, mask = pad_batch([seqs[i] for i in idx], int(c.pad_token_id or 0))
        aux, logits = target_hidden(policy, ids, layer_ids)
        cache.append((ids, mask, aux, F.log_softmax(logits.float(), -1)))
    t0, total_steps, step = time.time(), args.epochs * len(cache), 0
    g = torch.Generator().manual_seed(args.seed)
    hist = []
    for ep in range(args.epochs):
        order = torch.randperm(len(cache), generator=g).tolist()
        tot = hit = n = 0.0
        for bi in order:
            ids, mask, aux, t_logp = cache[bi]
            anchors, valid = pick_anchors(mask, args.max_anchors, generator=g)
            item = {"aux": aux, "t_logp": t_logp, "mask": mask, "anchors": anchors, "valid": valid,
                    "query": query_blocks(embed, ids, anchors, args.block_size, mask_id), "lm_head": lm_head}
            loss, lg1, tgt1 = dflash_loss(draft, item, decay=args.decay)
            lr = args.lr * 0.5 * (1 + math.cos(math.pi * step / max(1, total_steps)))
            tot += optimizer_step(draft, opt, loss, lr)
            step += 1
            with torch.no_grad():
                hit += float((lg1.argmax(-1) == tgt1.argmax(-1)).sum())
                n += float(lg1.shape[0])
        hist.append({"epoch": ep + 1, "loss": round(tot / len(cache), 4), "top1_offset1": round(hit / max(1, n), 4)})
        log(f"epoch {ep + 1}: loss {hist[-1]['loss']:.4f}, offset-1 top-1 agreement with the policy "
            f"{hist[-1]['top1_offset1']:.3f} ({time.time() - t0:.0f}s)")
    cfg = draft_config(c, args, layer_ids, mask_id, dims)
    return draft, cfg, {"history": hist, "seconds": round(time.time() - t0, 1)}


def save(draft, cfg: dict, out: Path, info: dict, args, n_rollouts: int) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(draft.checkpoint_tensors(), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    manifest = {"script": "nemo_rl_specdec.tools.train_dflash", "args": vars(args) | {"out": None, "policy": None},
                "rollouts": n_rollouts, "params": sum(p.numel() for p in draft.parameters()), "training": info,
                "versions": {"torch": torch.__version__}}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"wrote {out}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", default=str(asset_path("tiny", "policy")))
    ap.add_argument("--out", default=str(asset_path("tiny", "dflash")))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--problems", type=int, default=160)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=9, help="query block: one token + block_size - 1 drafts")
    ap.add_argument("--max-anchors", type=int, default=32, help="blocks per rollout and epoch")
    ap.add_argument("--decay", type=float, default=4.0, help="loss weight of block offset j: exp(-(j-1)/decay)")
    ap.add_argument("--target-layer-ids", type=int, nargs="*", default=None, help="default: every policy layer")
    ap.add_argument("--mask-token-id", type=int, default=None, help="default: the highest id no text produces")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = policy_rollouts(args.policy, args.problems, args.seed, args.max_new_tokens)
    log(f"{len(data)} rollouts, {sum(len(r) for _, r in data)} response tokens")
    draft, cfg, info = train(args.policy, data, args)
    save(draft, cfg, Path(args.out), info, args, len(data))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
