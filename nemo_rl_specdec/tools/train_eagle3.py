"""Train a tiny Eagle3 head for a policy, offline, from the policy's rollouts and hidden states.

    python -m nemo_rl_specdec.tools.train_eagle3 --policy nemo_rl_specdec/assets/tiny/policy \
        --out nemo_rl_specdec/assets/tiny/eagle3 --seed 0

Writes an EAGLE/HF-layout checkpoint that vLLM's ``eagle3`` method loads; the head, its layout
and its loss are the drafter's own (`drafters/eagle3.py`). Training data:

1. rollouts of the policy (vLLM, no speculation) on task problems: greedy and T=1 samples;
2. one HF forward of the policy over prompt + response gives the aux hidden states and the logits;
3. the Eagle3 loss as vLLM runs the head (step 0 plus a test-time-training step).

Why not the ``speculators`` library: its ``Trainer`` is CUDA-only and its install would need
extra packages next to our pinned torch/vLLM; this loop is ~150 lines and matches vLLM's layout
exactly (verified by the engine test: a trained head is accepted and outputs stay lossless).
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

from nemo_rl_specdec.drafters.eagle3 import Eagle3Head, aux_hidden_and_logits, eagle3_loss
from nemo_rl_specdec.resources import asset_path, config_path
from nemo_rl_specdec.tools.train_tiny import optimizer_step


def log(msg: str) -> None:
    print(f"[train_eagle3 {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def policy_rollouts(policy_dir: str, n_problems: int, seed: int, max_new_tokens: int) -> list:
    """(prompt ids, response ids) from the policy on vLLM: one greedy and two T=1 samples per problem."""
    from nemo_rl_specdec.config import load_run_config
    from nemo_rl_specdec.demo.task import make_problems
    from nemo_rl_specdec.engine.engine import Engine
    from nemo_rl_specdec.rollouts import Request

    cfg = load_run_config(str(config_path("tiny_cpu.yaml")),
                          [f"policy.model_name={policy_dir}", "policy.generation.speculative_decoding.enabled=false"])
    eng = Engine(cfg, spec_enabled=False, name="eagle3_data", seed=seed)
    try:
        tok = eng.tokenizer()
        probs = make_problems(n_problems, seed)
        reqs = [Request(tok(p.prompt, add_special_tokens=False)["input_ids"]) for p in probs]
        out = []
        for temp, reps in ((0.0, 1), (1.0, 2)):
            res = eng.generate([r for r in reqs for _ in range(reps)], max_new_tokens=max_new_tokens, temperature=temp)
            out += [(r.prompt_token_ids, r.token_ids) for r in res.rollouts if r.token_ids]
    finally:
        eng.close()
    return out


def train(policy_dir: str, data: list, args) -> tuple:
    from transformers import AutoModelForCausalLM

    from nemo_rl_specdec.train.distill import _Seq, micro_batches, pad_batch

    policy = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32).eval()
    for p in policy.parameters():
        p.requires_grad_(False)
    c = policy.config
    L = c.num_hidden_layers
    layer_ids = args.aux_layer_ids or sorted({1, max(1, L // 2), L - 1})
    H, hd = c.hidden_size, getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    nh = H // hd
    nkv = max(1, nh // 2) if nh % 2 == 0 else nh
    torch.manual_seed(args.seed)
    theta = float((getattr(c, "rope_parameters", None) or {}).get("rope_theta", getattr(c, "rope_theta", 10000.0)))
    head = Eagle3Head(H, len(layer_ids), c.vocab_size, nh, nkv, hd, 2 * H, c.rms_norm_eps, theta).float()
    with torch.no_grad():
        head.lm_head.weight.copy_(policy.get_output_embeddings().weight)
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.0)
    seqs = [_Seq(list(p), list(r)) for p, r in data]
    batches = micro_batches([len(s.prompt) + len(s.response) for s in seqs], args.micro_batch_tokens)
    # precompute the policy side once: aux states, teacher log-probs, embeddings
    cache = []
    for idx in batches:
        ids, mask = pad_batch([seqs[i] for i in idx], int(c.pad_token_id or 0))
        aux, logits = aux_hidden_and_logits(policy, ids, layer_ids)
        with torch.no_grad():
            emb = policy.model.embed_tokens(ids)
        cache.append((ids, mask, torch.cat(aux, -1), F.log_softmax(logits.float(), -1), emb))
    t0, total_steps, step = time.time(), args.epochs * len(cache), 0
    g = torch.Generator().manual_seed(args.seed)
    hist = []
    for ep in range(args.epochs):
        order = torch.randperm(len(cache), generator=g).tolist()
        tot = hit = n = 0.0
        for bi in order:
            ids, mask, aux, t_logp, emb = cache[bi]
            loss, lg0, tgt0 = eagle3_loss(head, mask, aux, t_logp, emb, ttt=args.ttt)
            lr = args.lr * 0.5 * (1 + math.cos(math.pi * step / max(1, total_steps)))
            tot += optimizer_step(head, opt, loss, lr)
            step += 1
            with torch.no_grad():
                hit += float((lg0.argmax(-1) == tgt0.argmax(-1)).sum())
                n += float(lg0.shape[0])
        hist.append({"epoch": ep + 1, "loss": round(tot / len(cache), 4), "top1_step0": round(hit / max(1, n), 4)})
        log(f"epoch {ep + 1}: loss {hist[-1]['loss']:.4f}, step-0 top-1 agreement with the policy "
            f"{hist[-1]['top1_step0']:.3f} ({time.time() - t0:.0f}s)")
    return head, layer_ids, (H, nh, nkv, hd, 2 * H, c), {"history": hist, "seconds": round(time.time() - t0, 1)}


def save(head, layer_ids, dims, out: Path, info: dict, args, n_rollouts: int) -> None:
    from safetensors.torch import save_file

    H, nh, nkv, hd, inter, c = dims
    out.mkdir(parents=True, exist_ok=True)
    save_file(head.checkpoint_tensors(), str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": inter, "num_hidden_layers": 1, "num_attention_heads": nh, "num_key_value_heads": nkv,
           "head_dim": hd, "hidden_act": "silu", "rms_norm_eps": c.rms_norm_eps,
           "max_position_embeddings": c.max_position_embeddings, "rope_theta": head.theta,
           "vocab_size": c.vocab_size, "draft_vocab_size": c.vocab_size, "target_hidden_size": H,
           "tie_word_embeddings": False, "torch_dtype": "float32",
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids), "use_aux_hidden_state": True}}
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    manifest = {"script": "nemo_rl_specdec.tools.train_eagle3", "args": vars(args) | {"out": None, "policy": None},
                "rollouts": n_rollouts, "params": sum(p.numel() for p in head.parameters()), "training": info,
                "versions": {"torch": torch.__version__}}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"wrote {out}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", default=str(asset_path("tiny", "policy")))
    ap.add_argument("--out", default=str(asset_path("tiny", "eagle3")))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--problems", type=int, default=160)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--aux-layer-ids", type=int, nargs="*", default=None)
    ap.add_argument("--no-ttt", dest="ttt", action="store_false")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = policy_rollouts(args.policy, args.problems, args.seed, args.max_new_tokens)
    log(f"{len(data)} rollouts, {sum(len(r) for _, r in data)} response tokens")
    head, layer_ids, dims, info = train(args.policy, data, args)
    save(head, layer_ids, dims, Path(args.out), info, args, len(data))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
