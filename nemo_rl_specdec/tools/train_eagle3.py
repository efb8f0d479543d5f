"""Train a tiny Eagle3 head for a policy, offline, from the policy's rollouts and hidden states.

    python -m nemo_rl_specdec.tools.train_eagle3 --policy nemo_rl_specdec/assets/tiny/policy \
        --out nemo_rl_specdec/assets/tiny/eagle3 --seed 0 --families sum,sort,base

Writes an EAGLE/HF-layout checkpoint that vLLM's ``eagle3`` method loads; the head, its layout
and its loss are the drafter's own (`drafters/eagle3.py`). Training data:

1. rollouts of the policy (vLLM, no speculation) on task problems: greedy and T=1 samples;
2. one HF forward of the policy over prompt + response gives the aux hidden states and the logits;
3. the Eagle3 loss as vLLM runs the head (step 0 plus a test-time-training step).

``--draft-vocab-size N`` gives the head a draft vocabulary: the N most frequent response tokens of
its training rollouts (``lm_head`` of N rows, ``d2t``/``t2d`` maps as vLLM's Eagle3 reads them).

Why not the ``speculators`` library: its ``Trainer`` is CUDA-only and its install would need
extra packages next to our pinned torch/vLLM; this loop is ~150 lines and matches vLLM's layout
exactly (verified by the engine test: a trained head is accepted and outputs stay lossless).
"""
from __future__ import annotations

import os
import time

import torch

from nemo_rl_specdec.drafters.eagle3 import Eagle3Head, aux_hidden, choose_draft_vocab, eagle3_loss, token_counts
from nemo_rl_specdec.rollouts import TokenSequence
from nemo_rl_specdec.tools import draft_training as dt


def log(msg: str) -> None:
    print(f"[train_eagle3 {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def train(policy_dir: str, data: list, args) -> tuple:
    """(head, config.json dict, training info) for the policy in `policy_dir` on its rollouts `data`."""
    policy = dt.frozen_policy(policy_dir)
    c = policy.config
    L = c.num_hidden_layers
    layer_ids = args.aux_layer_ids or sorted({1, max(1, L // 2), L - 1})
    H, nh, nkv, hd, inter = dt.head_dims(c)
    torch.manual_seed(args.seed)
    head = Eagle3Head(H, len(layer_ids), c.vocab_size, nh, nkv, hd, inter, c.rms_norm_eps, dt.rope_theta(c)).float()
    t_out = policy.get_output_embeddings().weight.detach()
    draft_vocab = c.vocab_size if args.draft_vocab_size is None else args.draft_vocab_size
    if draft_vocab > c.vocab_size:
        raise SystemExit(f"--draft-vocab-size: got {draft_vocab}; allowed: <= {c.vocab_size}, the policy's vocabulary")
    if draft_vocab < c.vocab_size:  # the rollouts' most frequent response tokens; the loss's target over them
        seqs = [TokenSequence(list(p), list(r)) for p, r in data]
        ids = choose_draft_vocab(token_counts(seqs, c.vocab_size), draft_vocab)
        head.set_draft_vocab(ids, rows=t_out[ids].float())
        t_out = t_out[ids]
        log(f"draft vocabulary: {draft_vocab} of {c.vocab_size} tokens")
    else:
        with torch.no_grad():
            head.lm_head.weight.copy_(t_out)
    cache = []  # the policy side once: aux states, embeddings, final hidden states
    for ids, mask in dt.padded_batches(data, int(c.pad_token_id or 0), args.micro_batch_tokens):
        with torch.no_grad():
            out = policy(input_ids=ids, output_hidden_states=True)
        cache.append({"mask": mask, "aux": torch.cat(aux_hidden(out.hidden_states, layer_ids, L), -1),
                      "emb": out.hidden_states[0], "t_hidden": out.hidden_states[-1]})

    def loss(item, _generator):
        return eagle3_loss(head, item, t_out, ttt=args.ttt)

    info = dt.train_epochs(head, cache, loss, args, log, "top1_step0")
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": inter, "num_hidden_layers": 1, "num_attention_heads": nh, "num_key_value_heads": nkv,
           "head_dim": hd, "hidden_act": "silu", "rms_norm_eps": c.rms_norm_eps,
           "max_position_embeddings": c.max_position_embeddings, "rope_theta": head.theta,
           "vocab_size": c.vocab_size, "draft_vocab_size": draft_vocab, "target_hidden_size": H,
           "tie_word_embeddings": False, "torch_dtype": "float32",
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids), "use_aux_hidden_state": True},
           # the same ids where vLLM 0.20.0 reads them (later versions read eagle_config's); without them it
           # would feed the head its model's default layers
           "eagle_aux_hidden_state_layer_ids": list(layer_ids)}
    return head, cfg, info


def main(argv=None):
    ap = dt.argument_parser(__doc__.split("\n")[0], "eagle3")
    ap.add_argument("--aux-layer-ids", type=int, nargs="*", default=None)
    ap.add_argument("--no-ttt", dest="ttt", action="store_false")
    ap.add_argument("--draft-vocab-size", type=int, default=None,
                    help="tokens the head drafts from: the most frequent response tokens of its training rollouts "
                         "(lm_head rows and the d2t/t2d maps vLLM reads); default: the whole vocabulary")
    dt.build(ap.parse_args(argv), train, "nemo_rl_specdec.tools.train_eagle3", log)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
