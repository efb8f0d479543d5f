"""Time target forwards of a randomly initialised model of a given shape, on a GPU, across tokens
per step and context lengths: the samples the simulator's roofline is fitted on.

    python -m nemo_rl_specdec.tools.time_forward --shape qwen3-8b --out samples.json

Weights do not matter for timing, so the model is a transformers `Qwen3ForCausalLM` of the named
shape with random bf16 weights. One sample is one forward as a vLLM engine step runs it: `requests`
sequences, each with `ctx` tokens already in its KV cache, verifying `tokens_per_request` new
tokens (logits for every one). The KV cache is preallocated per layer and the attention writes the
new keys and values into it and attends over it in one flash-attention call with the query heads
of a KV head packed together (pack-GQA), so every context token's KV is read once per request per
step, as vLLM's paged kernels read it; the KV contents are random. On a GPU the step's tokens
attend to the whole context and step, without a mask: a mask sends PyTorch's SDPA to its math
kernel, which copies the KV per query head, and unpacked GQA reads each KV head once per query
head; both cost several times the step. The attention FLOPs recorded per sample are the ones
computed.
`--attention causal` (exact, any device) is what the tests compare with transformers' forward.
Steps of at most `--graph-max` tokens (vLLM's largest default CUDA-graph capture size) are replayed
from a captured CUDA graph, larger ones run eagerly; every sample also records its eager time.

The output records the device, library versions, the attention path taken, the model's shape in
the simulator's terms (`ModelShape`: bytes a forward reads, FLOPs per token, KV bytes per token,
attention FLOPs per (query, context) pair) and per sample the median of `--reps` timed runs.
`cost/fit.py`'s `fit_roofline` turns these into a scenario's roofline (`hardware.roofline.measured`).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ATTN = "specdec_kv_static"

# transformers `Qwen3Config` fields of the shapes this tool builds
QWEN3_8B: dict[str, Any] = dict(
    vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
    num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=1e6,
    max_position_embeddings=40960, tie_word_embeddings=False)
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-8b": QWEN3_8B,
    # the draft side, each a Qwen3 stack of the shape one draft forward reads and computes:
    # a draft model of Qwen3-0.6B's shape (tied embeddings, 28 layers of width 1024);
    "qwen3-0.6b": {**QWEN3_8B, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "tie_word_embeddings": True},
    # an Eagle3 head for Qwen3-8B: one Qwen3-8B decoder layer and a 32,000-token draft lm_head (its
    # fc from three hidden states, 0.05e9 parameters, is left out: 7% of the bytes a forward reads);
    "eagle3-qwen3-8b": {**QWEN3_8B, "vocab_size": 32000, "num_hidden_layers": 1},
    # an MTP layer of an 8B policy: one decoder layer over the policy's full-vocabulary lm_head;
    "mtp-qwen3-8b": {**QWEN3_8B, "num_hidden_layers": 1},
    # a DFlash draft for Qwen3-8B: five decoder layers of the policy's width over its lm_head, one
    # forward per step over a block of positions per request (time it with --per-request 8,16).
    "dflash-qwen3-8b": {**QWEN3_8B, "num_hidden_layers": 5},
    # a CPU-sized shape with the same structure, for checking the tool itself
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=1e6,
                 max_position_embeddings=4096, tie_word_embeddings=False),
}


def log(msg: str) -> None:
    print(f"[time_forward {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class KVStatic:
    """Per-layer KV buffers [requests, kv_heads, ctx + n, head_dim]: positions [0, ctx) are the
    context, [ctx, ctx + n) are written by the step. `causal`: the step's tokens see only their
    past (lower-right causal mask); else every token attends to the whole buffer."""

    def __init__(self, layers: int, requests: int, kv_heads: int, ctx: int, n: int, head_dim: int,
                 dtype, device, causal: bool):
        shape = (requests, kv_heads, ctx + n, head_dim)
        self.k = [torch.randn(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.randn(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.ctx, self.n, self.causal = ctx, n, causal


_KV: list = [None]  # the buffers of the step being timed (read by the registered attention)


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Write the step's keys/values into the static buffers and attend over context + step."""
    kv = _KV[0]
    i = module.layer_idx
    kv.k[i][:, :, kv.ctx:].copy_(key)
    kv.v[i][:, :, kv.ctx:].copy_(value)
    if kv.n > 1 and kv.causal:
        from torch.nn.attention.bias import causal_lower_right

        out = F.scaled_dot_product_attention(query, kv.k[i], kv.v[i], attn_mask=causal_lower_right(kv.n, kv.ctx + kv.n),
                                             scale=scaling, enable_gqa=True)
    else:
        out = packed_gqa_attention(query, kv.k[i], kv.v[i], scaling)
    return out.transpose(1, 2).contiguous(), None


def packed_gqa_attention(query, key, value, scale):
    """Full attention of every query over `key`/`value`, the query heads that share a KV head
    packed into one sequence (flash-attention's pack-GQA): each KV head is read once per request,
    also when a request verifies several tokens. One flash call on a GPU (an error, not the math
    kernel, where flash cannot run)."""
    b, h, n, d = query.shape
    kvh = key.shape[1]
    q = query.reshape(b, kvh, (h // kvh) * n, d)
    if query.is_cuda:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            out = F.scaled_dot_product_attention(q, key, value, scale=scale)
    else:
        out = F.scaled_dot_product_attention(q, key, value, scale=scale)
    return out.reshape(b, h, n, d)


def build_model(shape: str, device: str, dtype):
    from transformers import AttentionInterface, Qwen3Config, Qwen3ForCausalLM

    AttentionInterface.register(ATTN, attention)
    # transformers' @strict dataclass config takes the legacy `torch_dtype` through **kwargs (its
    # __post_init__), which the dataclass's declared fields leave out
    cfg = Qwen3Config(**SHAPES[shape], torch_dtype=dtype)  # type: ignore[call-arg]
    cfg._attn_implementation = ATTN
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg).to(dtype)
    model.eval()
    return model, cfg


def model_shape(model, cfg, dtype_bytes: int) -> dict:
    """The model in the simulator's `ModelShape` terms (per forward, before any tp split)."""
    embed = model.model.embed_tokens.weight.numel()
    params = sum(p.numel() for p in model.parameters())
    layers, kvh, hd, heads = (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim,
                              cfg.num_attention_heads)
    read = params if cfg.tie_word_embeddings else params - embed  # a tied table is read as the lm_head
    return {
        "weight_bytes": read * dtype_bytes,       # the embedding table is gathered, not read
        "flops_per_token": 2 * read,
        "kv_bytes_per_token": layers * kvh * hd * 2 * dtype_bytes,
        "attn_flops_per_ctx": 4 * layers * heads * hd,      # QK^T and PV per (query, context token)
        "num_layers": layers,
        "hidden_size": cfg.hidden_size,
        "params": params,
    }


def grid(contexts: list, max_tokens: int, kv_tokens: int, requests: list, per_request: list) -> list:
    """(requests, tokens per request, ctx) triples: decode (1 token) and verify-shaped (2-8) steps
    over the request counts, and wider steps up to `max_tokens` at each context, all within
    `kv_tokens` KV slots."""
    out = set()
    for c in contexts:
        for b in requests:
            for n in per_request:
                if b * (c + n) <= kv_tokens and b * n <= max_tokens:
                    out.add((b, n, c))
        b = max(r for r in requests if r * c <= kv_tokens // 2) if any(r * c <= kv_tokens // 2 for r in requests) else 0
        n = 16
        while b and b * n <= max_tokens:
            if b * (c + n) <= kv_tokens:
                out.add((b, n, c))
            n *= 2
    return sorted(out, key=lambda t: (t[2], t[0] * t[1], t[0]))


def interleaved(points: list) -> list:
    """`grid`'s points, the contexts taken in turn, so a run cut at its time budget has timed every
    context (each from its smallest steps up) rather than the small contexts alone."""
    by_ctx: dict = {}
    for p in points:
        by_ctx.setdefault(p[2], []).append(p)
    lanes = [by_ctx[c] for c in sorted(by_ctx)]
    return [lane[i] for i in range(max((len(x) for x in lanes), default=0)) for lane in lanes if i < len(lane)]


def _time(fn, reps: int, device: str) -> float:
    """Median seconds of `reps` calls of fn (CUDA events on a GPU)."""
    times = []
    for _ in range(reps):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_step(model, cfg, b: int, n: int, c: int, *, device: str, dtype, reps: int, graph_max: int,
              causal: bool) -> dict:
    kv = KVStatic(cfg.num_hidden_layers, b, cfg.num_key_value_heads, c, n, cfg.head_dim, dtype, device, causal)
    _KV[0] = kv
    ids = torch.randint(0, cfg.vocab_size, (b, n), device=device)
    pos = torch.arange(c, c + n, device=device).expand(b, n).contiguous()

    def fwd():
        return model(input_ids=ids, position_ids=pos, use_cache=False).logits

    with torch.inference_mode():
        for _ in range(2):
            fwd()
        if device == "cuda":
            torch.cuda.synchronize()
        eager_s = _time(fwd, reps, device)
        graph_s, mode = None, "eager"
        if device == "cuda" and b * n <= graph_max:
            try:
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    fwd()
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    fwd()
                g.replay()
                torch.cuda.synchronize()
                graph_s, mode = _time(g.replay, reps, device), "graph"
                del g
            except Exception as e:  # recorded per sample: the fit then uses the eager time
                mode = f"eager (graph capture failed: {type(e).__name__}: {str(e)[:120]})"
    _KV[0] = None
    del kv
    if device == "cuda":
        torch.cuda.empty_cache()
    attn_ctx = b * (n * c + n * (n + 1) // 2) if causal else b * n * (c + n)
    return {"requests": b, "tokens_per_request": n, "tokens": b * n, "ctx": c, "ctx_sum": b * c,
            "attn_ctx": attn_ctx, "seconds": graph_s if graph_s is not None else eager_s,
            "eager_seconds": eager_s, "graph_seconds": graph_s, "mode": mode}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-8b")
    ap.add_argument("--out", required=True, help="samples JSON (rewritten after every sample)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--contexts", default="1024,2048,4096,8192,16384")
    ap.add_argument("--requests", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--per-request", default="1,2,4,8")
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--kv-gib", type=float, default=40.0, help="KV memory the grid may use")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--graph-max", type=int, default=512)
    ap.add_argument("--attention", choices=["full", "causal"], default=None,
                    help="default: full on a GPU (one flash call), causal elsewhere")
    ap.add_argument("--budget-s", type=float, default=480.0, help="stop adding samples after this long")
    args = ap.parse_args(argv)

    t_start = time.time()
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model, cfg = build_model(args.shape, args.device, dtype)
    shape = model_shape(model, cfg, torch.finfo(dtype).bits // 8)
    causal = (args.attention or ("full" if args.device == "cuda" else "causal")) == "causal"
    kv_tokens = int(args.kv_gib * 2**30 / shape["kv_bytes_per_token"])
    points = grid([int(x) for x in args.contexts.split(",")], args.max_tokens, kv_tokens,
                  [int(x) for x in args.requests.split(",")], [int(x) for x in args.per_request.split(",")])
    import transformers

    out = {
        "tool": "nemo_rl_specdec.tools.time_forward",
        "shape_name": args.shape,
        "model": shape,
        "device": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu",
        "dtype": str(dtype).replace("torch.", ""),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "cuda": torch.version.cuda},
        "attention": ("sdpa over static KV buffers, GQA-native, KV read once per request per step, "
                      + ("causal lower-right mask" if causal
                         else "no mask (flash on a GPU): each token attends to context + step")),
        "graph_max": args.graph_max,
        "reps": args.reps,
        "samples": [],
    }
    log(f"{args.shape} on {out['device']}: {shape['params'] / 1e9:.2f}B params, {len(points)} steps to time")
    for b, n, c in interleaved(points):
        if time.time() - t_start > args.budget_s:
            out["truncated"] = f"stopped at the {args.budget_s:.0f} s budget"
            log(out["truncated"])
            break
        s = time_step(model, cfg, b, n, c, device=args.device, dtype=dtype, reps=args.reps,
                      graph_max=args.graph_max, causal=causal)
        out["samples"].append(s)
        log(f"requests {b:4d} x {n:4d} tokens, ctx {c:6d}: {s['seconds'] * 1e3:8.3f} ms ({s['mode'][:40]}), "
            f"eager {s['eager_seconds'] * 1e3:8.3f} ms")
        Path(args.out).write_text(json.dumps(out, indent=1))
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
