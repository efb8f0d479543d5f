"""The hybrid drafter's per-step rule: history drafts only, or the model forward and the better draft per request."""
import itertools

import numpy as np
import pytest

from nemo_rl_specdec.drafters.machinery.hybrid_choice import HybridChoice, choose


def _rate(rows, lengths, n, seconds, c_tok):
    committed = n + sum(float(np.minimum.accumulate(np.asarray(r, dtype=float))[:d].sum()) if d else 0.0
                        for r, d in zip(rows, lengths, strict=True))
    return committed / (seconds + c_tok * sum(lengths))


def _brute_force(hist, model, t0, c_tok, forward, n):
    """The best rate over both options, every per-request assignment of rows and every prefix."""
    best = max(_rate(hist, d, n, t0, c_tok) for d in itertools.product(*[range(len(g) + 1) for g in hist]))
    for pick in itertools.product((0, 1), repeat=len(hist)):
        rows = [model[i] if p else hist[i] for i, p in enumerate(pick)]
        for d in itertools.product(*[range(len(g) + 1) for g in rows]):
            best = max(best, _rate(rows, d, n, t0 + forward, c_tok))
    return best


def _rate_of(choice: HybridChoice, hist, model, t0, c_tok, forward, n):
    rows = [model[i] if s == "model" else hist[i] for i, s in enumerate(choice.source)]
    return _rate(rows, choice.lengths, n, t0 + (forward if choice.run_model else 0.0), c_tok)


def _random_step(seed):
    """1-4 requests, history rows of 0-4 tokens, model rows of k = 3 tokens (non-increasing), random costs."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 5))
    hist = [np.sort(rng.uniform(0, 1, int(rng.integers(0, 5))))[::-1] for _ in range(n)]
    model = [np.sort(rng.uniform(0, 1, 3))[::-1] for _ in range(n)]
    return hist, model, float(rng.uniform(0.5, 2.0)), float(rng.uniform(0.0, 0.3)), float(rng.uniform(0.0, 0.4))


@pytest.mark.parametrize("seed", range(60))
def test_the_choice_is_the_brute_force_optimum_of_both_options(seed):
    hist, model, t0, c_tok, forward = _random_step(seed)
    extra = seed % 3  # requests in the step without any row
    n = len(hist) + extra
    choice = choose(hist, model, t0, c_tok, forward, requests=n)
    best = _brute_force(hist, model, t0, c_tok, forward, n)
    assert _rate_of(choice, hist, model, t0, c_tok, forward, n) == pytest.approx(best, rel=1e-9)
    for s, d, h, m in zip(choice.source, choice.lengths, hist, model, strict=True):
        assert (s == "none") == (d == 0)
        assert d <= len(m if s == "model" else h)
        assert choice.run_model or s != "model"


def test_the_model_forward_is_skipped_when_every_history_draft_pays_more():
    hist = [[1.0, 1.0, 0.95, 0.9], [0.98, 0.97, 0.9]]
    model = [[0.7, 0.4, 0.2]] * 2
    choice = choose(hist, model, t0=1.0, c_tok=0.02, model_forward_s=0.1)
    assert not choice.run_model
    assert choice.source == ["history", "history"] and choice.lengths == [4, 3]


def test_a_request_without_a_history_draft_takes_the_model_draft_when_the_forward_runs():
    hist = [[1.0, 1.0, 0.95], []]
    model = [[0.7, 0.4, 0.2], [0.8, 0.6, 0.4]]
    choice = choose(hist, model, t0=1.0, c_tok=0.02, model_forward_s=0.05)
    assert choice.run_model
    assert choice.source == ["history", "model"]
    assert choice.lengths[0] == 3 and choice.lengths[1] > 0


def test_costs_shift_the_choice():
    hist = [[0.9, 0.5], [], []]
    model = [[0.8, 0.6, 0.4]] * 3
    # a cheap forward: the two requests without history drafts pay for it
    assert choose(hist, model, t0=1.0, c_tok=0.02, model_forward_s=0.05).run_model
    # the same drafts with a forward that costs most of a step: history only
    dear = choose(hist, model, t0=1.0, c_tok=0.02, model_forward_s=0.9)
    assert not dear.run_model and dear.source == ["history", "none", "none"]
    # verifying a token costs more than a 0.5 token is worth at this step's rate: it is cut
    cut = choose(hist, [[]] * 3, t0=1.0, c_tok=0.3, model_forward_s=0.0)
    assert cut.lengths == [1, 0, 0] and not cut.run_model
    # a request whose history draft is short but sure, against a longer likely model draft
    one = [[1.0]], [[0.95, 0.9, 0.85]]
    assert choose(*one, t0=1.0, c_tok=0.0, model_forward_s=0.01).source == ["model"]
    assert choose(*one, t0=1.0, c_tok=0.0, model_forward_s=1.0).source == ["history"]
    # with every draft token dear, nothing is verified and nothing runs
    off = choose(*one, t0=1.0, c_tok=5.0, model_forward_s=0.0)
    assert off == HybridChoice(source=["none"], lengths=[0], run_model=False)


def test_ties_go_to_history_and_no_forward():
    # the same row in both halves and a free forward: the same rate either way
    choice = choose([[0.9, 0.5]], [[0.9, 0.5]], t0=1.0, c_tok=0.1, model_forward_s=0.0)
    assert choice.source == ["history"] and not choice.run_model


def test_more_requests_without_drafts_raise_the_bar():
    hist, model = [[]], [[0.6, 0.3]]
    assert choose(hist, model, t0=1.0, c_tok=0.05, model_forward_s=0.1).run_model
    assert not choose(hist, model, t0=1.0, c_tok=0.05, model_forward_s=0.1, requests=8).run_model


def test_nan_padded_matrices_equal_ragged_rows():
    rng = np.random.default_rng(3)
    hist = [np.sort(rng.uniform(0, 1, int(rng.integers(0, 4))))[::-1] for _ in range(5)]
    model = [np.sort(rng.uniform(0, 1, 3))[::-1] for _ in range(5)]
    padded = np.full((5, 3), np.nan)
    for i, g in enumerate(hist):
        padded[i, :len(g)] = g
    assert choose(padded, np.array(model), 1.0, 0.05, 0.2, 7) == choose(hist, model, 1.0, 0.05, 0.2, 7)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="model_gains: one row per request, 2 requests, got 1"):
        choose([[0.5], []], [[0.5]], t0=1.0, c_tok=0.1, model_forward_s=0.1)
    with pytest.raises(ValueError, match="model_forward_s: need >= 0"):
        choose([[0.5]], [[0.5]], t0=1.0, c_tok=0.1, model_forward_s=-0.1)
    with pytest.raises(ValueError, match="model_forward_s: need >= 0"):
        choose([[0.5]], [[0.5]], t0=1.0, c_tok=0.1, model_forward_s=float("nan"))
    with pytest.raises(ValueError, match="t0 > 0"):
        choose([[0.5]], [[0.5]], t0=0.0, c_tok=0.1, model_forward_s=0.1)
    with pytest.raises(ValueError, match="c_tok >= 0"):
        choose([[0.5]], [[0.5]], t0=1.0, c_tok=-0.1, model_forward_s=0.1)
    with pytest.raises(ValueError, match="at least the 2 requests"):
        choose([[0.5], []], [[0.5], []], t0=1.0, c_tok=0.1, model_forward_s=0.1, requests=1)
