"""The GPU timing tool computes the real forward: with the static KV buffers filled from a
prefix, its logits equal transformers' own (sdpa, cached) forward; the grid stays in budget."""
from __future__ import annotations

import json

import pytest
import torch

from nemo_rl_specdec.tools import time_forward as tf


@pytest.fixture(scope="module")
def tiny():
    return tf.build_model("tiny", "cpu", torch.float32)


@pytest.mark.parametrize("n", [1, 5])
def test_static_kv_attention_is_the_models_forward(tiny, n):
    model, cfg = tiny
    b, c = 3, 40
    ids = torch.randint(0, cfg.vocab_size, (b, c + n), generator=torch.Generator().manual_seed(n))
    with torch.inference_mode():
        cfg._attn_implementation = "sdpa"
        ref = model(input_ids=ids).logits[:, c:]
        prefix = model(input_ids=ids[:, :c], use_cache=True).past_key_values
        cfg._attn_implementation = tf.ATTN
        kv = tf.KVStatic(cfg.num_hidden_layers, b, cfg.num_key_value_heads, c, n, cfg.head_dim,
                         torch.float32, "cpu", causal=True)
        for i in range(cfg.num_hidden_layers):
            kv.k[i][:, :, :c] = prefix.layers[i].keys
            kv.v[i][:, :, :c] = prefix.layers[i].values
        tf._KV[0] = kv
        try:
            pos = torch.arange(c, c + n).expand(b, n)
            got = model(input_ids=ids[:, c:], position_ids=pos, use_cache=False).logits
        finally:
            tf._KV[0] = None
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_grid_spans_tokens_and_contexts_within_kv_budget():
    kv_tokens = 300_000
    pts = tf.grid([1024, 16384], 4096, kv_tokens, [1, 4, 16, 64, 256], [1, 4])
    assert all(b * (c + n) <= kv_tokens and b * n <= 4096 for b, n, c in pts)
    for c in (1024, 16384):
        tokens = {b * n for b, n, cc in pts if cc == c}
        assert min(tokens) == 1 and max(tokens) == 4096


def test_samples_file_records_shape_and_steps(tmp_path):
    out = tmp_path / "s.json"
    assert tf.main(["--shape", "tiny", "--device", "cpu", "--out", str(out), "--contexts", "64",
                    "--requests", "1,4", "--per-request", "1,2", "--max-tokens", "32", "--reps", "1"]) == 0
    d = json.loads(out.read_text())
    m = d["model"]
    assert m["kv_bytes_per_token"] == 2 * 2 * 16 * 4 * 2   # layers x kv heads x head dim x (K, V) x fp32
    assert {(s["requests"], s["tokens_per_request"]) for s in d["samples"]} >= {(1, 1), (4, 2)}
    assert all(s["seconds"] > 0 and s["ctx_sum"] == s["requests"] * 64 for s in d["samples"])


def test_packed_gqa_is_full_gqa_attention():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, generator=g) for s in [(2, 8, 5, 16), (2, 2, 37, 16), (2, 2, 37, 16)])
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(tf.packed_gqa_attention(q, k, v, None), ref)


def test_a_budget_cut_keeps_every_context():
    pts = tf.grid([1024, 4096, 16384], 4096, 300_000, [1, 4, 16, 64, 256], [1, 2, 4, 8])
    order = tf.interleaved(pts)
    assert sorted(order) == sorted(pts)
    assert {c for _, _, c in order[:3]} == {1024, 4096, 16384}


@pytest.mark.parametrize("name", ["qwen3-0.6b", "eagle3-qwen3-8b", "mtp-qwen3-8b", "dflash-qwen3-8b"])
def test_draft_shapes_read_their_lm_head(name):
    """A draft forward reads every weight but the embedding table it gathers from; a tied table is
    read as the lm_head, so it counts (Qwen3-0.6B: 0.6e9 parameters, 1.2 GB in bf16)."""
    cfg = tf.SHAPES[name]
    with torch.device("meta"):
        from transformers import Qwen3Config, Qwen3ForCausalLM

        model = Qwen3ForCausalLM(Qwen3Config(**cfg))
    m = tf.model_shape(model, model.config, 2)
    lm_head = cfg["vocab_size"] * cfg["hidden_size"]
    assert m["weight_bytes"] >= 2 * lm_head
    assert m["flops_per_token"] == m["weight_bytes"]
    if name == "qwen3-0.6b":
        assert 0.55e9 < m["params"] < 0.65e9 and m["weight_bytes"] == 2 * m["params"]
