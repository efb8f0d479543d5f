"""DAS with `scheduling.budget: adaptive`, without an engine: drafts are cut per step from the
online step-cost fit, speculation turns off (and says so) where no draft token pays, and nothing
is cut during the fit's warm-up."""
import logging
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("arctic_inference.suffix_decoding._C")

PROMPT = [5, 6, 7, 8]
RESPONSE = list(range(40, 80))


class _Runner:
    def __init__(self, rows, width=128):
        self.input_batch = SimpleNamespace(req_ids=[r[0] for r in rows])
        self.requests = {rid: SimpleNamespace(sampling_params=SimpleNamespace(extra_args=extra),
                                              prompt_token_ids=PROMPT) for rid, extra, _ in rows}
        self.tokens = np.zeros((len(rows), width), dtype=np.int32)
        self.n = np.zeros(len(rows), dtype=np.int64)
        for i, (_, _, toks) in enumerate(rows):
            self.tokens[i, :len(toks)] = toks
            self.n[i] = len(toks)


def _proposer(runner, budget="adaptive", k=4):
    from nemo_rl_specdec.drafters.suffix import DASProposer

    vc = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                         model_config=SimpleNamespace(max_model_len=256))
    p = DASProposer(vc)
    p.specdec_attach(runner, {"suffix": {"scope": "problem", "max_tree_depth": 32, "min_token_prob": 0.0},
                              "scheduling": {"budget": budget}})
    p.use_local = False
    p.specdec_rebuild([{"problem_id": "p", "prompt_token_ids": PROMPT, "token_ids": RESPONSE,
                        "policy_version": 0}], 1)
    return p


def _plant(p, c_base, c_tok, n=64):
    """Steps of a planted linear cost, with varying draft tokens (what the fit learns from)."""
    for i in range(n):
        req, drafts = 1 + i % 4, i % 5
        p.step_cost.add(req, req + drafts, 100 * req, c_base + c_tok * (req + drafts))


def _rows(gen=10, extra=None):
    return [("a", {"problem_id": "p", **(extra or {})}, PROMPT + RESPONSE[:gen])]


def test_no_cut_during_the_warm_up():
    r = _Runner(_rows())
    p = _proposer(r)
    assert p.step_cost.split(1, 14) is None
    assert p.propose([[1]], r.n, r.tokens) == [RESPONSE[10:14]]
    assert p.counters["adaptive_steps"] == 0


def test_expensive_drafts_turn_speculation_off_and_it_is_logged(caplog):
    r = _Runner(_rows())
    p = _proposer(r)
    _plant(p, c_base=1e-3, c_tok=1e-3)  # a draft token costs as much as the request's own token
    for _ in range(200):  # this tree's drafts were rarely accepted so far
        p.calibration.record(0, [1.0] * 4, 0)
    p.calibration.flush()
    with caplog.at_level(logging.INFO, logger="nemo_rl_specdec"):
        assert p.propose([[1]], r.n, r.tokens) == [[]]
    assert p.counters["adaptive_off_steps"] == 1 and p.counters["adaptive_cut_tokens"] == 4
    assert p.counters["drafts"] == 0
    assert any("speculation off at 1 requests" in m for m in caplog.messages)
    # the draft it withheld is still scored against what the target produces (calibration stays unbiased)
    assert p._reqs["a"].others and p._reqs["a"].others[0][2] == RESPONSE[10:14]


def test_cheap_drafts_are_all_kept():
    r = _Runner(_rows())
    p = _proposer(r)
    _plant(p, c_base=1e-2, c_tok=1e-6)
    assert p.propose([[1]], r.n, r.tokens) == [RESPONSE[10:14]]
    assert p.counters["adaptive_steps"] == 1 and p.counters["adaptive_cut_tokens"] == 0
    st = p.specdec_stats()
    assert st["adaptive"] is True and st["step_cost"]["samples"] == 64 and st["step_cost"]["c_tok_s"] > 0


def test_step_times_are_sampled_between_calls_of_the_same_requests():
    r = _Runner(_rows())
    p = _proposer(r, budget="uniform")
    for _ in range(5):
        p.propose([[1]], r.n, r.tokens)
    assert p.step_cost.samples == 4  # the first call's step prefilled the request: not a decode sample
    assert p.counters["adaptive_steps"] == 0  # uniform: measured, never cut
