"""Train the bundled MTP workload: a tiny Qwen2 policy with one MiMo-style MTP layer.

    python -m tools.train_tiny_mtp --out nemo_rl_specdec/assets/tiny_mtp --seed 0 \\
        --families sum,sort,base --steps 1500

vLLM runs ``method: mtp`` on CPU for ``MiMoForCausalLM`` (Qwen2 + ``model.mtp_layers.*``) in fp32
(reference/drafters_cpu.md §3). The checkpoint is a plain ``Qwen2ForCausalLM`` (``model_type:
qwen2``, so transformers loads the policy without remote code and drops the MTP tensors) whose
``config.json`` names the ``MiMoForCausalLM`` architecture and ``num_nextn_predict_layers: 1``;
the MTP tensors live next to the policy's in ``model.safetensors``:

    model.mtp_layers.0.{token_layernorm, hidden_layernorm, final_layernorm}.weight
    model.mtp_layers.0.input_proj.weight                       [H, 2H]  on cat[hnorm(h_t), tnorm(emb(x_{t+1}))]
    model.mtp_layers.0.{self_attn.{q,k,v,o}_proj, mlp.*, input_layernorm, post_attention_layernorm}

``h_t`` is the policy's final hidden state before the final norm; the MTP layer predicts
``x_{t+2}`` through the shared (tied) embedding/lm_head; vLLM zeroes the token embedding at
position 0, and the MTP layer's RoPE position is t (the drafter runs on the target's positions).

Training (deterministic given --seed, CPU, one thread): the policy and the MTP layer are trained
together by supervised learning on the task's worked solutions (reuses the tokenizer, task and
data stream of :mod:`tools.train_tiny`): loss = CE(next token) + CE(token after
next, MTP). The hidden state fed to the MTP layer is detached, so the MTP loss does not shape the
decoder layers; the shared (tied) embedding/lm_head receive both losses, as in joint MTP training.
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

from nemo_rl_specdec.drafters.mtp import MTPLayer, mtp_loss, pre_norm_hidden
from nemo_rl_specdec.resources import asset_path
from nemo_rl_specdec.tools.draft_training import families_arg
from tools import train_tiny

POLICY_ARCH = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=320)


def log(msg: str) -> None:
    print(f"[train_tiny_mtp {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_policy(tok, seed: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=train_tiny.VOCAB_SIZE, head_dim=32, hidden_act="silu", max_position_embeddings=1024,
                      rope_parameters={"rope_theta": 10000.0, "rope_type": "default"}, rms_norm_eps=1e-6,
                      tie_word_embeddings=True, initializer_range=0.02, use_cache=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      architectures=["Qwen2ForCausalLM"], **POLICY_ARCH)
    cfg._attn_implementation = "sdpa"  # causal with attention_mask=None (the MTP layer relies on it)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).float()


def _lr(step: int, peak: float, total: int, warmup: int = 50) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup)))))


def train(args):
    tok = train_tiny.build_tokenizer()
    policy = make_policy(tok, args.seed)
    train_tiny.init_digit_embeddings(policy, tok, 0.1)
    torch.manual_seed(args.seed + 1)
    mtp = MTPLayer(policy.config).float()
    params = list(policy.parameters()) + list(mtp.parameters())
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    stream = train_tiny.batch_stream(tok, args.seed, args.token_budget, families=args.families)
    t0, ema = time.time(), None
    for step in range(args.steps):
        ids, labels = next(stream)
        logits, hidden = pre_norm_hidden(policy, ids)
        main = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                               ignore_index=-100)
        aux, lg, tgt = mtp_loss(policy, mtp, ids, labels, hidden.detach())
        lr = _lr(step, args.lr, args.steps)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        (main + aux).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        ema = (main.item(), aux.item()) if ema is None else (0.95 * ema[0] + 0.05 * main.item(),
                                                             0.95 * ema[1] + 0.05 * aux.item())
        if (step + 1) % 50 == 0:
            m = tgt != -100
            acc = (lg.argmax(-1)[m] == tgt[m]).float().mean().item()
            log(f"step {step + 1} policy CE {ema[0]:.3f} MTP CE {ema[1]:.3f} MTP top1 {acc:.3f} "
                f"({time.time() - t0:.0f}s)")
    return tok, policy, mtp, {"steps": args.steps, "policy_ce_ema": round(ema[0], 4),
                              "mtp_ce_ema": round(ema[1], 4), "seconds": round(time.time() - t0, 1)}


def save(tok, policy, mtp, out: Path, info: dict, args) -> None:
    from safetensors.torch import load_file, save_file

    train_tiny.save(policy, tok, out)
    st = out / "model.safetensors"
    tensors = dict(load_file(str(st)))
    tensors.update(mtp.checkpoint_tensors())
    save_file(tensors, str(st), metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(architectures=["MiMoForCausalLM"], num_nextn_predict_layers=1)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    manifest = {"script": "tools.train_tiny_mtp", "seed": args.seed, "args": vars(args) | {"out": None},
                "arch": POLICY_ARCH | {"mtp_layers": 1, "architecture": "MiMoForCausalLM (model_type qwen2)"},
                "policy_params": sum(p.numel() for p in policy.parameters()),
                "mtp_params": sum(p.numel() for p in mtp.parameters()), "training": info,
                "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
                "bytes": train_tiny.dir_bytes(out)}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"wrote {out} ({manifest['bytes'] / 1e6:.2f} MB)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(asset_path("tiny_mtp")))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--token-budget", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--families", type=families_arg, default=("sum",),
                    help="comma-separated task families of the training problems")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    tok, policy, mtp, info = train(args)
    save(tok, policy, mtp, Path(args.out), info, args)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
