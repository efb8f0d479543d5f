"""Train a tiny DFlash draft for a policy, offline, from the policy's rollouts and hidden states.

    python -m tools.train_dflash --policy nemo_rl_specdec/assets/tiny/policy \
        --out nemo_rl_specdec/assets/tiny/dflash --seed 0 --families sum,sort,base

Writes a checkpoint that vLLM's ``dflash`` method loads (``DFlashDraftModel``); the draft, its
layout and its loss are the drafter's own (`drafters/dflash.py`). Training data:

1. rollouts of the policy (vLLM, no speculation) on task problems: greedy and T=1 samples
   (the same data as the Eagle3 head, `nemo_rl_specdec/tools/train_eagle3.py`);
2. one HF forward of the policy over prompt + response gives the hidden states of the target
   layers and the logits;
3. the DFlash loss as vLLM runs the draft: blocks of x_n and `block_size - 1` mask tokens at
   random response positions n (a new draw every epoch), forward KL towards the policy at every
   block offset, earlier offsets weighted more.

The mask token is an id the tokenizer never produces (the policy's vocabulary is padded beyond
the tokenizer's), so it carries no text meaning into the blocks.
"""
from __future__ import annotations

import os
import time

import torch

from nemo_rl_specdec.drafters.dflash import (
    ARCHITECTURE,
    DFlashDraft,
    dflash_loss,
    pick_anchors,
    query_blocks,
    target_hidden,
)
from nemo_rl_specdec.tools import draft_training as dt


def log(msg: str) -> None:
    print(f"[train_dflash {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def unused_token_id(policy_dir: str, vocab_size: int) -> int:
    """The highest id of the model's vocabulary that the tokenizer never produces."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(policy_dir)
    used = set(tok.get_vocab().values())
    free = [i for i in range(vocab_size) if i not in used]
    if not free:
        raise ValueError(
            f"{policy_dir}: every id of the {vocab_size}-token vocabulary is a token; pass --mask-token-id"
        )
    return free[-1]


def draft_config(c, args, layer_ids, mask_token_id: int, dims) -> dict:
    """config.json of the draft: Qwen3 dimensions, DFlash fields (what vLLM's qwen3_dflash reads)."""
    H, nh, nkv, hd, inter = dims
    return {"architectures": [ARCHITECTURE], "model_type": "qwen3", "hidden_size": H, "intermediate_size": inter,
            "num_hidden_layers": args.layers, "num_attention_heads": nh, "num_key_value_heads": nkv, "head_dim": hd,
            "hidden_act": "silu", "rms_norm_eps": c.rms_norm_eps, "max_position_embeddings": c.max_position_embeddings,
            "rope_parameters": {"rope_theta": dt.rope_theta(c), "rope_type": "default"}, "attention_bias": False,
            "vocab_size": c.vocab_size, "target_hidden_size": c.hidden_size, "tie_word_embeddings": False,
            "block_size": args.block_size, "torch_dtype": "float32",
            "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": list(layer_ids)}}


def train(policy_dir: str, data: list, args) -> tuple:
    """(draft, config.json dict, training info) for the policy in `policy_dir` on its rollouts `data`."""
    policy = dt.frozen_policy(policy_dir)
    c = policy.config
    layer_ids = args.target_layer_ids or list(range(c.num_hidden_layers))
    mask_id = args.mask_token_id if args.mask_token_id is not None else unused_token_id(policy_dir, c.vocab_size)
    dims = H, nh, nkv, hd, inter = dt.head_dims(c)
    torch.manual_seed(args.seed)
    draft = DFlashDraft(H, len(layer_ids), nh, nkv, hd, inter, args.layers, c.rms_norm_eps, dt.rope_theta(c)).float()
    embed = policy.get_input_embeddings().weight.detach()
    lm_head = policy.get_output_embeddings().weight.detach()
    cache = []  # the policy side once: target-layer states, final hidden states
    for ids, mask in dt.padded_batches(data, int(c.pad_token_id or 0), args.micro_batch_tokens):
        aux, out = target_hidden(policy, ids, layer_ids)
        cache.append((ids, mask, aux, out.hidden_states[-1]))

    def loss(item, generator):
        ids, mask, aux, t_hidden = item
        anchors, valid = pick_anchors(mask, args.max_anchors, generator=generator)
        return dflash_loss(draft, {"aux": aux, "t_hidden": t_hidden, "mask": mask, "anchors": anchors, "valid": valid,
                                   "query": query_blocks(embed, ids, anchors, args.block_size, mask_id)},
                           lm_head, lm_head, decay=args.decay)

    info = dt.train_epochs(draft, cache, loss, args, log, "top1_offset1")
    return draft, draft_config(c, args, layer_ids, mask_id, dims), info


def main(argv=None):
    ap = dt.argument_parser(__doc__.split("\n")[0], "dflash")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=9, help="query block: one token + block_size - 1 drafts")
    ap.add_argument("--max-anchors", type=int, default=32, help="blocks per rollout and epoch")
    ap.add_argument("--decay", type=float, default=4.0, help="loss weight of block offset j: exp(-(j-1)/decay)")
    ap.add_argument("--target-layer-ids", type=int, nargs="*", default=None, help="default: every policy layer")
    ap.add_argument("--mask-token-id", type=int, default=None, help="default: the highest id no text produces")
    dt.build(ap.parse_args(argv), train, "tools.train_dflash", log)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
