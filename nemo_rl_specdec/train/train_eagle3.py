"""Train a tiny Eagle3 head for a policy, offline, from the policy's rollouts and hidden states.

    python -m nemo_rl_specdec.train.train_eagle3 --policy nemo_rl_specdec/assets/tiny/policy \
        --out nemo_rl_specdec/assets/tiny/eagle3 --seed 0

Writes an EAGLE/HF-layout checkpoint that vLLM's ``eagle3`` method loads (reference/drafters_cpu.md
§1.1): ``config.json`` with ``architectures: ["LlamaForCausalLMEagle3"]`` and
``eagle_config.eagle_aux_hidden_state_layer_ids``, and ``model.safetensors`` with
``midlayer.*`` (one decoder layer whose q/k/v see ``cat[input_layernorm(emb), hidden_norm(g)]``),
``fc.weight`` (fuses the aux hidden states into ``g``), ``norm.weight`` and ``lm_head.weight``.
There is no ``embed_tokens``: vLLM shares the policy's embedding (used frozen in training).

The head is a plain torch mirror of vLLM's ``llama_eagle3`` forward (same parameter names), so
no conversion step exists. Training data:

1. rollouts of the policy (vLLM, no speculation) on task problems: greedy and T=1 samples;
2. one HF forward of the policy over prompt + response: hooks on the decoder layers give the aux
   hidden states (id i = residual stream after i layers) and the logits;
3. Eagle3 step 0 as vLLM runs it: at position t the head reads token x_{t+1} and the fused aux
   states g_t and predicts x_{t+2}; loss = KL(policy's distribution at t+1 || head) on response
   positions, plus a second "test-time training" step that feeds the head its own pre-norm
   output as the hidden state (what vLLM does for draft positions >= 2).

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


def log(msg: str) -> None:
    print(f"[train_eagle3 {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class RMSNorm(torch.nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope(x, pos, theta: float):
    """Neox-style rotary embedding on [B, heads, T, hd] at integer positions [B, T]."""
    hd = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = pos.float().unsqueeze(-1) * inv  # [B, T, hd/2]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1).unsqueeze(1), torch.cat([ang.sin(), ang.sin()], -1).unsqueeze(1)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class MidLayer(torch.nn.Module):
    def __init__(self, H: int, nh: int, nkv: int, hd: int, inter: int, eps: float):
        super().__init__()
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.self_attn = torch.nn.Module()
        self.self_attn.q_proj = torch.nn.Linear(2 * H, nh * hd, bias=False)
        self.self_attn.k_proj = torch.nn.Linear(2 * H, nkv * hd, bias=False)
        self.self_attn.v_proj = torch.nn.Linear(2 * H, nkv * hd, bias=False)
        self.self_attn.o_proj = torch.nn.Linear(nh * hd, H, bias=False)
        self.mlp = torch.nn.Module()
        self.mlp.gate_proj = torch.nn.Linear(H, inter, bias=False)
        self.mlp.up_proj = torch.nn.Linear(H, inter, bias=False)
        self.mlp.down_proj = torch.nn.Linear(inter, H, bias=False)
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
        h = L.mlp.down_proj(F.silu(L.mlp.gate_proj(m)) * L.mlp.up_proj(m)) + h
        return self.lm_head(self.norm(h)), h

    def checkpoint_tensors(self) -> dict:
        return {k: v.detach().clone().contiguous() for k, v in self.state_dict().items()}


def aux_hidden_and_logits(policy, ids, layer_ids, embeddings: bool = False):
    """Aux hidden states (id i = residual stream after i decoder layers, 0 = embeddings) and logits,
    from one no-grad forward with ``output_hidden_states`` (entry i < num_hidden_layers is the input
    of layer i; the last entry is after the final norm, so ids must stay below the layer count);
    with `embeddings`, the token embeddings (entry 0) as a third value."""
    L = policy.config.num_hidden_layers
    bad = [i for i in layer_ids if not 0 <= int(i) < L]
    if bad:
        raise ValueError(f"eagle_aux_hidden_state_layer_ids: {bad} outside [0, {L}) for a {L}-layer policy")
    with torch.no_grad():
        out = policy(input_ids=ids, output_hidden_states=True)
    aux = [out.hidden_states[int(i)] for i in layer_ids]
    return (aux, out.logits, out.hidden_states[0]) if embeddings else (aux, out.logits)


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
    head = Eagle3Head(H, len(ids), int(cfg.get("draft_vocab_size") or cfg["vocab_size"]),
                      int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"]), hd,
                      int(cfg["intermediate_size"]), float(cfg.get("rms_norm_eps", 1e-6)),
                      float(cfg.get("rope_theta", 10000.0))).float()
    tensors = {}
    for f in sorted(head_dir.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    missing, unexpected = head.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        raise ValueError(f"{head_dir}: not a one-layer llama_eagle3 head (missing {missing[:4]}, "
                         f"unexpected {unexpected[:4]})")
    return head, cfg


def eagle3_loss(head, mask, aux, t_logp, emb, *, ttt: bool = True, temperature: float = 1.0):
    """Eagle3 training loss on one padded batch, as vLLM runs the head.

    mask [B, T-1] (pad_batch: logits at t predict a response token), aux = cat of the aux hidden
    states [B, T, n*H], t_logp = the policy's log-probs at `temperature` [B, T, V], emb = the
    policy's embeddings of ids [B, T]. Step 0 at positions t = 0..T-3 reads x_{t+1} and g_t and
    is trained towards the policy at t+1 (the distribution of x_{t+2}); with `ttt`, a second step
    feeds the head its own pre-norm output (draft position 2), weight 0.5.
    Returns (loss, step-0 logits at trained positions, step-0 teacher log-probs there)."""
    from nemo_rl_specdec.train.distill import forward_kl

    B, T = mask.shape[0], mask.shape[1] + 1
    pos = torch.arange(T - 2).unsqueeze(0).expand(B, -1)
    m = mask[:, 1:T - 1]  # position t+1 predicts a response token
    logits0, pre0 = head(emb[:, 1:T - 1], head.fc(aux[:, : T - 2]), pos)
    tgt = t_logp[:, 1:T - 1]
    loss = forward_kl(tgt[m], logits0[m], temperature)
    if ttt and T > 3:
        m1 = mask[:, 2:T - 1]
        if bool(m1.any()):
            logits1, _ = head(emb[:, 2:T - 1], pre0[:, :-1], pos[:, 1:])
            loss = loss + 0.5 * forward_kl(t_logp[:, 2:T - 1][m1], logits1[m1], temperature)
    return loss, logits0[m], tgt[m]


def policy_rollouts(policy_dir: str, n_problems: int, seed: int, max_new_tokens: int) -> list:
    """(prompt ids, response ids) from the policy on vLLM: one greedy and two T=1 samples per problem."""
    from nemo_rl_specdec.config import load_run_config
    from nemo_rl_specdec.demo.task import make_problems
    from nemo_rl_specdec.engine.engine import Engine, Request

    cfg = load_run_config(str(Path(__file__).resolve().parents[2] / "configs" / "tiny_cpu.yaml"),
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
            for pg in opt.param_groups:
                pg["lr"] = lr
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            step += 1
            with torch.no_grad():
                hit += float((lg0.argmax(-1) == tgt0.argmax(-1)).sum())
                n += float(lg0.shape[0])
                tot += loss.item()
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
    manifest = {"script": "nemo_rl_specdec.train.train_eagle3", "args": vars(args) | {"out": None, "policy": None},
                "rollouts": n_rollouts, "params": sum(p.numel() for p in head.parameters()), "training": info,
                "versions": {"torch": torch.__version__}}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"wrote {out}")


def main(argv=None):
    from nemo_rl_specdec.demo.task import TINY_ASSETS_DIR

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", default=str(TINY_ASSETS_DIR / "policy"))
    ap.add_argument("--out", default=str(TINY_ASSETS_DIR / "eagle3"))
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
