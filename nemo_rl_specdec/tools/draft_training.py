"""The offline loop shared by the builders of drafts that read the policy's hidden states
(`train_eagle3.py` and its siblings): the policy's rollouts on vLLM, the frozen policy and its
per-batch teacher side computed once, the cosine-schedule epochs with top-1 agreement, the
checkpoint with its MANIFEST, and the command-line options they all take. Each builder supplies
its module, its loss and its config.json."""
from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import torch

from nemo_rl_specdec.demo import task


def families_arg(text: str) -> tuple:
    """The trainers' ``--families``: comma-separated task families (``task.check_families``)."""
    try:
        return task.check_families(text.split(","))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def optimizer_step(model, opt, loss, lr: float) -> float:
    """One AdamW step at `lr` with gradient-norm clipping; returns the loss."""
    for g in opt.param_groups:
        g["lr"] = lr
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


def policy_rollouts(policy_dir: str, n_problems: int, seed: int, max_new_tokens: int, families=("sum",)) -> list:
    """(prompt ids, response ids) from the policy on vLLM: one greedy and two T=1 samples per problem
    of the task `families`."""
    from nemo_rl_specdec.config.run import load_run_config
    from nemo_rl_specdec.demo.task import make_problems
    from nemo_rl_specdec.driver.engine import Engine
    from nemo_rl_specdec.resources import config_path
    from nemo_rl_specdec.rollouts import Request

    cfg = load_run_config(str(config_path("tiny_cpu.yaml")),
                          [f"policy.model_name={policy_dir}", "policy.generation.speculative_decoding.enabled=false"])
    eng = Engine(cfg, spec_enabled=False, name="draft_data", seed=seed)
    try:
        tok = eng.tokenizer()
        probs = make_problems(n_problems, seed, families)
        reqs = [Request(tok(p.prompt, add_special_tokens=False)["input_ids"]) for p in probs]
        out = []
        for temp, reps in ((0.0, 1), (1.0, 2)):
            res = eng.generate([r for r in reqs for _ in range(reps)], max_new_tokens=max_new_tokens, temperature=temp)
            out += [(r.prompt_token_ids, r.token_ids) for r in res.rollouts if r.token_ids]
    finally:
        eng.close()
    return out


def frozen_policy(policy_dir: str):
    """The HF policy in float32, eval mode, no parameter requiring grad."""
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32).eval()
    for p in policy.parameters():
        p.requires_grad_(False)
    return policy


def padded_batches(data: list, pad_id: int, micro_batch_tokens: int) -> list:
    """(ids, mask) per micro-batch of the rollouts, as the online distillers pad them."""
    from nemo_rl_specdec.rollouts import TokenSequence
    from nemo_rl_specdec.train.distill import micro_batches, pad_batch

    seqs = [TokenSequence(list(p), list(r)) for p, r in data]
    batches = micro_batches([len(s.prompt) + len(s.response) for s in seqs], micro_batch_tokens)
    return [pad_batch([seqs[i] for i in idx], pad_id) for idx in batches]


def train_epochs(module, cache: list, loss_fn: Callable, args, log: Callable, agreement: str) -> dict:
    """`args.epochs` shuffled passes over `cache` with AdamW at a cosine learning rate from `args.lr`;
    `loss_fn(item, generator) -> KL` (train/kl.py: the loss and the top-1 agreement it counted).
    Returns {"history": per-epoch loss and top-1 agreement (named `agreement`), "seconds"}."""
    opt = torch.optim.AdamW(module.parameters(), lr=args.lr, weight_decay=0.0)
    t0, total_steps, step = time.time(), args.epochs * len(cache), 0
    g = torch.Generator().manual_seed(args.seed)
    hist = []
    for ep in range(args.epochs):
        order = torch.randperm(len(cache), generator=g).tolist()
        tot = hit = n = 0.0
        for bi in order:
            kl = loss_fn(cache[bi], g)
            lr = args.lr * 0.5 * (1 + math.cos(math.pi * step / max(1, total_steps)))
            tot += optimizer_step(module, opt, kl.loss, lr)
            step += 1
            hit, n = hit + kl.hits, n + kl.counted
        hist.append({"epoch": ep + 1, "loss": round(tot / len(cache), 4), agreement: round(hit / max(1, n), 4)})
        log(f"epoch {ep + 1}: loss {hist[-1]['loss']:.4f}, {agreement} agreement with the policy "
            f"{hist[-1][agreement]:.3f} ({time.time() - t0:.0f}s)")
    return {"history": hist, "seconds": round(time.time() - t0, 1)}


def write_checkpoint(module, cfg: dict, out: Path, *, script: str, args, n_rollouts: int, info: dict,
                     log: Callable) -> None:
    """`out`/model.safetensors (the module's `checkpoint_tensors()`), config.json and MANIFEST.json."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(module.checkpoint_tensors(), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    manifest = {"script": script, "args": vars(args) | {"out": None, "policy": None}, "rollouts": n_rollouts,
                "params": sum(p.numel() for p in module.parameters()), "training": info,
                "versions": {"torch": torch.__version__}}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"wrote {out}")


def argument_parser(description: str, asset: str) -> argparse.ArgumentParser:
    """The options every draft builder takes (policy, output, data, schedule, threads)."""
    from nemo_rl_specdec.resources import asset_path

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--policy", default=str(asset_path("tiny", "policy")))
    ap.add_argument("--out", default=str(asset_path("tiny", asset)))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--problems", type=int, default=160)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--families", type=families_arg, default=("sum",),
                    help="comma-separated task families the policy's rollouts answer")
    return ap


def rope_theta(c) -> float:
    """The policy config's rotary base (transformers 5 `rope_parameters` or the older `rope_theta`)."""
    return float((getattr(c, "rope_parameters", None) or {}).get("rope_theta", getattr(c, "rope_theta", 10000.0)))


def head_dims(c) -> tuple:
    """(hidden, heads, kv heads, head dim, intermediate) of a small draft for the policy config `c`."""
    H, hd = c.hidden_size, getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    nh = H // hd
    return H, nh, (max(1, nh // 2) if nh % 2 == 0 else nh), hd, 2 * H


def build(args, train: Callable, script: str, log: Callable) -> None:
    """The builder's run: rollouts of `args.policy`, `train(policy_dir, data, args) -> (module,
    config.json dict, info)`, the checkpoint in `args.out`."""
    torch.set_num_threads(args.threads)
    data = policy_rollouts(args.policy, args.problems, args.seed, args.max_new_tokens, args.families)
    log(f"{len(data)} rollouts, {sum(len(r) for _, r in data)} response tokens")
    module, cfg, info = train(args.policy, data, args)
    write_checkpoint(module, cfg, Path(args.out), script=script, args=args, n_rollouts=len(data), info=info, log=log)
