"""scheduling.budget: adaptive — the per-step choice of draft lengths and the weights behind it."""
import itertools

import numpy as np
import pytest

from nemo_rl_specdec.scheduling.adaptive import draft_lengths, makespan_weights


def _rate(gains, weights, t0, c_tok, d):
    committed = sum(w * (1 + sum(np.minimum.accumulate(g)[:di])) for g, w, di in zip(gains, weights, d))
    return committed / (t0 + c_tok * sum(d))


@pytest.mark.parametrize("seed", range(40))
def test_draft_lengths_are_the_brute_force_optimum(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 4))
    gains = [np.sort(rng.uniform(0, 1, int(rng.integers(0, 5))))[::-1] for _ in range(n)]
    weights = list(rng.uniform(0.05, 1, n))
    t0, c_tok = float(rng.uniform(0.5, 2.0)), float(rng.uniform(0.0, 0.6))
    d = draft_lengths(gains, weights, t0, c_tok)
    best = max(_rate(gains, weights, t0, c_tok, c)
               for c in itertools.product(*[range(len(g) + 1) for g in gains]))
    assert _rate(gains, weights, t0, c_tok, d) == pytest.approx(best, rel=1e-12)
    assert all(0 <= di <= len(g) for di, g in zip(d, gains))


def test_free_drafts_are_all_taken_and_expensive_ones_none():
    gains = [[0.9, 0.8, 0.1], [0.5]]
    assert draft_lengths(gains, [1, 1], t0=1.0, c_tok=0.0) == [3, 1]
    assert draft_lengths(gains, [1, 1], t0=1.0, c_tok=10.0) == [0, 0]  # speculation off for this step


def test_a_rising_gain_curve_is_cut_to_its_running_minimum():
    # the third token cannot be likelier than the second: it counts 0.05, not 0.9
    assert draft_lengths([[0.9, 0.05, 0.9]], [1], t0=1.0, c_tok=0.5) == [1]


def test_the_tail_request_gets_the_drafts():
    gains = [[0.6] * 4, [0.6] * 4]
    w = makespan_weights(generated=[10, 10], predicted=[300, 30])
    assert w[0] == 1.0 and w[1] == pytest.approx(20 / 290)
    d = draft_lengths(gains, w, t0=1.0, c_tok=0.2)
    assert d[0] == 4 and d[1] == 0


def test_a_request_past_its_prediction_is_promoted():
    w = makespan_weights(generated=[50, 120, 5], predicted=[300, 100, None])
    assert w == [1.0, 1.0, 1.0]
    w = makespan_weights(generated=[50, 20], predicted=[300, 100])
    assert w[0] == 1.0 and w[1] == pytest.approx(80 / 250)
    assert makespan_weights([1, 2], [None, None]) == [1.0, 1.0]


def test_bad_step_cost_is_refused():
    with pytest.raises(ValueError, match="t0 > 0"):
        draft_lengths([[0.5]], [1.0], t0=0.0, c_tok=0.1)
    with pytest.raises(ValueError, match="weights"):
        draft_lengths([[0.5]], [1.0, 1.0], t0=1.0, c_tok=0.1)
