"""The online step-cost fit recovers planted constants and answers nothing during its warm-up."""
import numpy as np
import pytest

from nemo_rl_specdec.cost.online import StepCostFit


def test_recovers_planted_constants_and_splits_a_step():
    rng = np.random.default_rng(0)
    fit = StepCostFit(min_samples=32, refit_every=8)
    assert fit.split(4, 400) is None
    for _ in range(400):
        n = int(rng.integers(1, 33))
        v = n + int(rng.integers(0, 8 * n + 1))
        ctx = n * int(rng.integers(20, 400))
        t = 4e-3 + 1e-4 * n + 6e-5 * v + 3e-8 * ctx
        fit.add(n, v, ctx, t * (1 + 0.01 * rng.standard_normal()))
    m = fit.metrics()
    assert m["samples"] == 400 and m["r2"] > 0.99
    assert m["c_base_s"] == pytest.approx(4e-3, rel=0.1) and m["c_tok_s"] == pytest.approx(6e-5, rel=0.1)
    t0, c_tok = fit.split(10, 2000)
    assert t0 == pytest.approx(4e-3 + 1e-4 * 10 + 6e-5 * 10 + 3e-8 * 2000, rel=0.05)
    assert c_tok == pytest.approx(6e-5, rel=0.1)


def test_steps_the_engine_was_held_up_in_do_not_bend_the_fit():
    # 2% of the steps take 10-100x longer (another engine on the core, a pause between calls): with
    # them in, least squares puts the cost of a draft token near zero; they are dropped
    rng = np.random.default_rng(1)
    fit = StepCostFit(min_samples=32, refit_every=8)
    for i in range(400):
        n = int(rng.integers(1, 65))
        v = n + int(rng.integers(0, 8 * n + 1))
        t = 8e-3 + 2e-4 * n + 5e-5 * v
        if i % 50 == 7:
            t *= float(rng.uniform(10, 100))
        fit.add(n, v, 100 * n, t * (1 + 0.05 * rng.standard_normal()))
    m = fit.metrics()
    assert m["c_tok_s"] == pytest.approx(5e-5, rel=0.15) and m["r2"] > 0.9
    assert 380 <= m["kept"] < 400


def test_steps_without_drafts_are_not_enough():
    fit = StepCostFit(min_samples=8, refit_every=1)
    for n in range(1, 51):
        fit.add(n, n, 100 * n, 0.01 + 1e-4 * n)  # no drafts ever: c_tok cannot be told from c_seq
    assert fit.split(4, 100) is None and fit.metrics()["c_tok_s"] is None


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="window"):
        StepCostFit(window=8, min_samples=32)
