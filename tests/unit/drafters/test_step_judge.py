"""scheduling.budget: adaptive — the per-step choice of draft lengths."""
import itertools

import numpy as np
import pytest

from nemo_rl_specdec.drafters.machinery.step_judge import batch_bin, draft_lengths, drafts_pay


def _rate(gains, t0, c_tok, d):
    committed = sum(1 + sum(np.minimum.accumulate(g)[:di]) for g, di in zip(gains, d, strict=True))
    return committed / (t0 + c_tok * sum(d))


def _random_step(seed):
    """1-3 requests with 0-4 draft tokens each (non-increasing gains) and a random step cost."""
    rng = np.random.default_rng(seed)
    gains = [np.sort(rng.uniform(0, 1, int(rng.integers(0, 5))))[::-1] for _ in range(int(rng.integers(1, 4)))]
    return gains, float(rng.uniform(0.5, 2.0)), float(rng.uniform(0.0, 0.6))


@pytest.mark.parametrize("seed", range(40))
def test_draft_lengths_are_the_brute_force_optimum(seed):
    gains, t0, c_tok = _random_step(seed)
    d = draft_lengths(gains, t0, c_tok)
    best = max(_rate(gains, t0, c_tok, c) for c in itertools.product(*[range(len(g) + 1) for g in gains]))
    assert _rate(gains, t0, c_tok, d) == pytest.approx(best, rel=1e-12)
    assert all(0 <= di <= len(g) for di, g in zip(d, gains, strict=True))


def test_free_drafts_are_all_taken_and_expensive_ones_none():
    gains = [[0.9, 0.8, 0.1], [0.5]]
    assert draft_lengths(gains, t0=1.0, c_tok=0.0) == [3, 1]
    assert draft_lengths(gains, t0=1.0, c_tok=10.0) == [0, 0]  # speculation off for this step
    assert draft_lengths(gains, t0=1.0, c_tok=0.3) == [2, 0]   # 3.7 tokens in 1.6: a 0.5 token is not worth 0.3 more


def test_a_rising_gain_curve_is_cut_to_its_running_minimum():
    # the third token cannot be likelier than the second: it counts 0.05, not 0.9
    assert draft_lengths([[0.9, 0.05, 0.9]], t0=1.0, c_tok=0.5) == [1]


@pytest.mark.parametrize("seed", range(20))
def test_requests_without_drafts_count_in_the_step(seed):
    # a step of 5 requests, 2 of them with drafts: the same choice as the 5 rows with 3 empty ones
    rng = np.random.default_rng(seed)
    gains = [np.sort(rng.uniform(0, 1, 4))[::-1] for _ in range(2)]
    t0, c_tok = float(rng.uniform(0.5, 2.0)), float(rng.uniform(0.0, 0.6))
    padded = gains + [[]] * 3
    assert draft_lengths(gains, t0, c_tok, requests=5) == draft_lengths(padded, t0, c_tok)[:2]
    assert drafts_pay(gains, t0, c_tok, requests=5) == drafts_pay(padded, t0, c_tok)


@pytest.mark.parametrize("seed", range(20))
def test_a_nan_padded_matrix_is_the_same_as_ragged_rows(seed):
    rng = np.random.default_rng(seed)
    gains = [rng.uniform(0, 1, int(rng.integers(0, 5))) for _ in range(4)]
    padded = np.full((4, 4), np.nan)
    for i, g in enumerate(gains):
        padded[i, :len(g)] = g
    t0, c_tok = float(rng.uniform(0.5, 2.0)), float(rng.uniform(0.0, 0.6))
    assert draft_lengths(padded, t0, c_tok, 6) == draft_lengths(gains, t0, c_tok, 6)
    assert drafts_pay(padded, t0, c_tok, 6) == drafts_pay(gains, t0, c_tok, 6)


def test_a_draft_token_nobody_expects_accepted_still_costs_its_verification():
    assert drafts_pay([[0.5]], t0=1.0, c_tok=0.2)
    assert not drafts_pay([[0.5, 0.0, 0.0]], t0=1.0, c_tok=0.2)  # 1.5 in 1.6 loses to 1 in 1


def test_more_requests_raise_the_bar_a_draft_must_clear():
    # 0.5 tokens for 0.3 s pays against 1 token per 1 s, not against 4 tokens per 1 s
    assert draft_lengths([[0.5]], t0=1.0, c_tok=0.3) == [1]
    assert draft_lengths([[0.5]], t0=1.0, c_tok=0.3, requests=4) == [0]
    with pytest.raises(ValueError, match="at least the 2 requests"):
        draft_lengths([[0.5], [0.5]], t0=1.0, c_tok=0.3, requests=1)


@pytest.mark.parametrize("seed", range(40))
def test_drafts_pay_compares_all_drafts_with_none(seed):
    gains, t0, c_tok = _random_step(seed)
    full = [len(g) for g in gains]
    expect = sum(full) > 0 and _rate(gains, t0, c_tok, full) > _rate(gains, t0, c_tok, [0] * len(gains))
    assert drafts_pay(gains, t0, c_tok) == expect


def test_drafts_pay_on_planted_costs():
    gains = [[0.9, 0.8, 0.1], [0.5]]              # 2.3 expected tokens for 4 draft tokens
    assert drafts_pay(gains, t0=1.0, c_tok=0.1)   # 4.3 tokens in 1.4: beats 2 in 1
    assert not drafts_pay(gains, t0=1.0, c_tok=0.4)  # 4.3 in 2.6 loses to 2 in 1
    assert not drafts_pay([[], []], t0=1.0, c_tok=0.0)  # nothing to verify


def test_bad_step_cost_is_refused():
    with pytest.raises(ValueError, match="t0 > 0"):
        draft_lengths([[0.5]], t0=0.0, c_tok=0.1)
    with pytest.raises(ValueError, match="c_tok >= 0"):
        draft_lengths([[0.5]], t0=1.0, c_tok=-1.0)
    with pytest.raises(ValueError, match="t0 > 0"):
        drafts_pay([[0.5]], t0=-1.0, c_tok=0.1)


def test_off_steps_are_binned_by_batch_size():
    assert [batch_bin(n) for n in (1, 2, 3, 4, 5, 8, 9, 64, 65)] == \
        ["1", "2", "3-4", "3-4", "5-8", "5-8", "9-16", "33-64", "65-128"]


def _judge():
    from nemo_rl_specdec.drafters.machinery.step_judge import StepJudge

    j = StepJudge("test", {}, adaptive=False, auto_disable=True)
    for i in range(64):  # a planted linear step cost: 1 ms per step, 1 ms per draft token
        req, drafts = 1 + i % 4, i % 5
        j.fit.add(req, req + drafts, 100 * req, 1e-3 + 1e-3 * (req + drafts))
    return j


def test_a_bin_that_keeps_losing_is_skipped_but_probed_and_comes_back():
    from nemo_rl_specdec.drafters.machinery import step_judge

    j = _judge()
    losing, paying = [[0.01, 0.01]], [[1.0, 1.0]]
    for _ in range(step_judge.OFF_STREAK):
        assert not j.skip(1)
        assert j.choose(losing, [2], 1, 100) == [0]
    assert j.stats()["off_bins"] == ["1"] and not j.skip(2)  # other batch sizes keep drafting
    skips = [j.skip(1) for _ in range(step_judge.PROBE_EVERY)]
    assert skips.count(False) == 1 and not skips[-1]  # one probe step in PROBE_EVERY
    assert j.counters["skipped_steps"] == step_judge.PROBE_EVERY - 1
    assert j.choose(paying, [2], 1, 100) == [2]  # the probe's drafts pay: the bin is on again
    assert j.stats()["off_bins"] == [] and not j.skip(1)


def test_skipped_steps_are_not_step_cost_samples():
    j = _judge()
    n = j.fit.samples
    j.called(0.0, 4, 8, 400, prefilled=False)
    j.called(0.010, 4, 4, 400, prefilled=False, skipped=True)   # this call skipped drafting
    j.called(0.015, 4, 8, 400, prefilled=False)                  # the step after a skipped call
    j.called(0.025, 4, 8, 400, prefilled=False)
    assert j.fit.samples == n + 1  # only the last step had the proposer's time at both ends
