"""Our n-gram proposer (`ngram.backend: specdec`): vLLM's matcher under the per-step rule, with
acceptance calibrated by draft position. Driven without an engine: a stand-in runner gives the
batch's request ids; the token rows are what vLLM's runner passes."""
import logging
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("vllm.v1.spec_decode.ngram_proposer")

ROW = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]  # the tail 1 2 3 was seen before: the lookup drafts 4 5 6 7


def _proposer(budget="uniform", auto_disable=True, k=4):
    from nemo_rl_specdec.drafters.ngram import NgramProposer

    vc = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(max_model_len=64),
        scheduler_config=SimpleNamespace(max_num_seqs=8),
    )
    p = NgramProposer(vc)
    p.specdec_attach(SimpleNamespace(input_batch=SimpleNamespace(req_ids=["a"])),
                     {"ngram": {"backend": "specdec", "prompt_lookup_min": 2, "prompt_lookup_max": 3},
                      "scheduling": {"budget": budget}, "auto_disable": auto_disable})
    return p


def _rows(row=ROW):
    tokens = np.zeros((1, 64), dtype=np.int32)
    tokens[0, :len(row)] = row
    return tokens, np.array([len(row)])


def _plant(p, c_base, c_tok, n=64):
    for i in range(n):
        req, drafts = 1 + i % 4, i % 5
        p.judge.fit.add(req, req + drafts, 100 * req, c_base + c_tok * (req + drafts))


def _rejected(p, times=200):
    for _ in range(times):  # n-gram drafts so far: never accepted
        p.calibration.record(0, [0] * 4, 0)
    p.calibration.flush()


def test_drafts_are_vllms_prompt_lookup_while_the_fit_warms_up():
    p = _proposer()
    tokens, n = _rows()
    assert p.propose([[3]], n, tokens) == [[4, 5, 6, 7]]
    assert p.counters["drafts"] == 1 and p.counters["auto_disable_steps"] == 0  # warm-up: nothing judged


def test_acceptance_is_calibrated_by_draft_position():
    p = _proposer(auto_disable=False)
    tokens, n = _rows()
    for _ in range(300):
        p._reqs.clear()
        p.propose([[3]], n, tokens)    # drafts 4 5 6 7
        p.propose([[4, 5]], n, tokens)  # the target accepted the first draft token only
    p.calibration.flush()
    pos = p.specdec_metrics()
    assert pos["ngram/acceptance/pos1"] > 0.9 and pos["ngram/acceptance/pos2"] < 0.1
    assert p.calibration.token_rates(0, [0, 0, 0]) == p.calibration.rates[0][:3]


def test_auto_disable_withholds_losing_drafts_logs_it_and_keeps_scoring_them(caplog):
    p = _proposer()
    _plant(p, c_base=1e-3, c_tok=1e-3)
    _rejected(p)
    tokens, n = _rows()
    with caplog.at_level(logging.INFO, logger="nemo_rl_specdec"):
        assert p.propose([[3]], n, tokens) == [[]]
    c = p.counters
    assert c["auto_disable_off_steps"] == 1 and c["auto_disable_cut_tokens"] == 4 and c["drafts"] == 0
    assert c["withheld_drafts"] == 1 and p.specdec_stats()["off_by_batch"] == {"1": 1}
    assert any("n-gram auto_disable: speculation off at 1 requests" in m for m in caplog.messages)
    # the target then produced 4, then 9: the withheld 4 5 6 7 would have had one token accepted,
    # and the one withheld at the next step (4 5 6 7 again, the row is unchanged) none
    proposed, accepted = p.calibration._proposed[0].sum(), p.calibration._accepted[0].sum()
    p.propose([[4]], n, tokens)
    p.propose([[9]], n, tokens)
    p.calibration.flush()
    assert p.calibration._proposed[0].sum() == proposed + 8
    assert p.calibration._accepted[0].sum() == pytest.approx(accepted + 1)
    assert len(p._reqs["a"][1]) == 1  # the draft withheld at the last step waits for the next tokens


def test_adaptive_cuts_to_the_paying_prefix():
    p = _proposer(budget="adaptive")
    _plant(p, c_base=1e-2, c_tok=2e-3)
    for _ in range(300):  # the first two positions are accepted, the rest never
        p.calibration.record(0, [0] * 4, 2)
    p.calibration.flush()
    tokens, n = _rows()
    assert p.propose([[3]], n, tokens) == [[4, 5]]
    assert p.counters["adaptive_steps"] == 1 and p.counters["adaptive_cut_tokens"] == 2


def test_cheap_drafts_are_all_kept():
    p = _proposer()
    _plant(p, c_base=1e-2, c_tok=1e-7)
    tokens, n = _rows()
    assert p.propose([[3]], n, tokens) == [[4, 5, 6, 7]]
    assert p.counters["auto_disable_steps"] == 1 and p.counters["auto_disable_off_steps"] == 0


def test_a_batch_size_that_keeps_losing_skips_the_lookup(monkeypatch):
    from nemo_rl_specdec.drafters.machinery import step_judge

    p = _proposer()
    _plant(p, c_base=1e-3, c_tok=1e-3)
    _rejected(p)
    tokens, n = _rows()
    for _ in range(step_judge.OFF_STREAK):
        assert p.propose([[3]], n, tokens) == [[]]
    calls = []
    monkeypatch.setattr(p.matcher, "propose", lambda *a: calls.append(1) or [[4, 5, 6, 7]])
    for _ in range(step_judge.PROBE_EVERY):
        assert p.propose([[3]], n, tokens) == [[]]
    assert len(calls) == 1 and p.counters["skipped_steps"] == step_judge.PROBE_EVERY - 1  # one probe
    assert p.specdec_stats()["off_bins"] == ["1"]


def test_vllms_matcher_is_built_again_only_when_the_lookup_changes():
    p = _proposer()  # built at __init__ (defaults 2-4), then attached with 2-3: rebuilt once
    first = p.matcher
    p.configure({"ngram": {"backend": "specdec", "prompt_lookup_min": 2, "prompt_lookup_max": 3}})
    assert p.matcher is first
    p.configure({"ngram": {"backend": "specdec", "prompt_lookup_min": 3, "prompt_lookup_max": 3}})
    assert p.matcher is not first and p.matcher.min_n == 3
