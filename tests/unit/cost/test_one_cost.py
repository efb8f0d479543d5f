"""One step-cost function: pricing, the simulator's step, the per-step rules (replay and simulator),
the hybrid's forwards, best_drafts, the online fit and the scheduling bound give the same cost for
the same step. No wall-clock time is measured."""
from __future__ import annotations

import numpy as np
import pytest

from nemo_rl_specdec.cost.model import CostModel, Step
from nemo_rl_specdec.cost.online import HybridStepCost, StepCostFit, StepCostSource
from nemo_rl_specdec.cost.price import PricedHybridCost, PricedStepCost, model_forward_s, price, step_costs
from nemo_rl_specdec.cost.profile import load_profile
from nemo_rl_specdec.cost.trace import Trace, TraceError, TraceStep

K = 8


@pytest.fixture(scope="module")
def h100():
    return load_profile("h100_qwen3_8b")


def _trace(kind: str, sizes=(8, 64, 200), k: int = K, uniform: bool = False, seed: int = 0) -> Trace:
    """One decode step per batch size (contexts and drafts drawn; `uniform`: one context per step)."""
    rng = np.random.default_rng(seed)
    steps = []
    for n in sizes:
        ctx = [int(rng.integers(500, 3000))] * n if uniform else rng.integers(500, 3000, n).tolist()
        drafts = np.minimum(rng.geometric(0.3, n) - 1, k).tolist()
        steps.append(TraceStep([f"r{i}" for i in range(n)], ctx, drafts, [0] * n, 0,
                               1e-4 if kind == "list" else None))
    return Trace(kind, k, steps, {"list": "das", "model": "eagle3"}[kind], "replay")


def test_pricing_and_the_simulators_step_are_one_function(h100):
    for kind, key in (("list", "das"), ("model", "eagle3")):
        trace = _trace(kind)
        cm = h100.cost_model(key)
        priced = price(trace, h100)
        for s, c, total in zip(trace.steps, step_costs(trace, h100), priced.step_s, strict=True):
            # the simulator prices a step the same way (proposer: a history drafter's runs on every decode step)
            sim = cm.step_cost(np.asarray(s.drafts, float), np.asarray(s.ctx, float),
                               proposer=True if kind == "list" else None).at(0)
            assert total == c.total_s == pytest.approx(sim, rel=1e-12)
            assert c.proposer_s > 0 if kind == "list" else c.draft_s > 0


def test_the_rules_split_is_the_priced_step_with_every_draft_verified(h100):
    """The replayed rule (`PricedStepCost`) and the simulator's rule (`CostModel.split`, engine_sim) see a
    step's sums; on a trace of steps at one context each, t0 + c_tok x drafts is its priced time."""
    trace = _trace("list", uniform=True)
    rule = PricedStepCost(h100, "das", K)
    for s, total in zip(trace.steps, price(trace, h100).step_s, strict=True):
        d = sum(s.drafts)
        t0, c_tok = rule.split(len(s.rids), sum(s.ctx), d)
        assert t0 + c_tok * d == pytest.approx(total, rel=1e-9)
        assert h100.cost_model("das").split(len(s.rids), sum(s.ctx), d) == (t0, c_tok)
        # without drafts the rule's t0 is the priced step that verifies none (the proposer ran)
        none = Trace("list", K, [TraceStep(s.rids, s.ctx, [0] * len(s.rids), [0] * len(s.rids), 0, 1e-4)], "das")
        assert t0 == pytest.approx(price(none, h100).rollout_s, rel=1e-12)


def test_a_model_drafters_forwards_are_the_functions_draft_term(h100):
    ctx = np.linspace(500, 3000, 64)
    for f in (1, 3):
        step = Step.of(ctx, np.full(64, float(f)), forwards=f)
        assert model_forward_s(h100, "eagle3", f, ctx) == h100.cost_model("eagle3").cost(step).draft_s > 0


def test_the_online_fit_is_a_fit_of_the_functions_linear_parameters():
    truth = CostModel(c_base=2e-3, c_seq=5e-6, c_tok=4e-5, c_ctx=1e-8, draft_fwd_base=3e-4, draft_fwd_seq=2e-6,
                      draft_kind="model")
    fit = StepCostFit(min_samples=32, refit_every=32, draft_forwards=True)
    rng = np.random.default_rng(1)
    for _ in range(64):
        n, d = int(rng.integers(1, 64)), int(rng.integers(0, 5))
        ctx = rng.integers(100, 2000, n).astype(float)
        f = max(d, 1)
        t = truth.cost(Step.of(ctx, np.full(n, float(d)), forwards=f)).total_s
        fit.add(n, n * (1 + d), int(ctx.sum()), t, forwards=f)
    assert np.allclose(fit.cost_model().linear_coef, truth.linear_coef, rtol=1e-6, atol=1e-12)
    t0, c_tok = fit.split(10, 5000)
    assert (t0, c_tok) == pytest.approx(truth.split(10, 5000, 10))
    assert fit.forward_s(10, 3) == pytest.approx(2 * (3e-4 + 2e-6 * 10))


def test_the_hybrids_first_forward_and_the_skippable_rest_are_one_split_of_the_function(h100):
    """`CostModel.draft_forwards` is what the priced hybrid cost, the online fit and the simulator weigh:
    the numbers each of them computed on its own before, bit for bit."""
    cm = h100.cost_model("eagle3")
    for n, k in ((1, 1), (8, 3), (64, 8)):
        ctx = np.linspace(500, 3000, n)
        first, rest = cm.draft_forwards(ctx, k)
        old_first = cm.cost(Step.of(ctx, np.ones(n), forwards=1)).draft_s   # sim/engine_sim.py
        assert (first, rest) == (old_first, cm.cost(Step.of(ctx, np.full(n, float(k)), forwards=k)).draft_s - old_first)
        # cost/price.py PricedHybridCost: model_forward_s at the step's mean context
        priced = PricedHybridCost(h100, "das", "eagle3", K)
        t0, _ = priced.split(n, int(ctx.sum()))
        mean = np.full(n, int(ctx.sum()) / n)
        t0_history, _ = PricedStepCost(h100, "das", K).split(n, int(ctx.sum()))
        assert t0 == t0_history + model_forward_s(h100, "eagle3", 1, mean)
        assert priced.forward_s(n, k) == (model_forward_s(h100, "eagle3", k, mean)
                                          - model_forward_s(h100, "eagle3", 1, mean))
    # cost/online.py: the fitted linear form's forwards over idle requests
    fit = StepCostFit(min_samples=8, refit_every=8, draft_forwards=True)
    truth = CostModel(c_base=2e-3, c_seq=5e-6, c_tok=4e-5, draft_fwd_base=3e-4, draft_fwd_seq=2e-6, draft_kind="model")
    for i in range(16):
        n, f = 1 + i % 5, 1 + i % 3
        step = Step.of(np.full(n, 100.0), np.full(n, float(f)), forwards=f)
        fit.add(n, n * (1 + f), 100 * n, truth.cost(step).total_s, forwards=f)
    online = fit.cost_model()
    assert online is not None
    for n, k in ((0, 2), (1, 1), (7, 3), (300, 8)):
        idle = np.zeros(n)
        assert fit.forward_s(n, k) == (online.cost(Step.of(idle, idle, forwards=k)).draft_s
                                       - online.cost(Step.of(idle, idle, forwards=1)).draft_s)


def test_a_requests_share_of_a_step_is_the_function_without_its_fixed_cost():
    cm = CostModel(c_base=0.0, c_seq=3e-6, c_tok=4e-5, c_ctx=1e-8, draft_tok=2e-6, draft_ctx=1e-9)
    share = cm.request_s(np.arange(5)[None, :], np.array([0.0, 100.0, 3000.0])[:, None])
    for i, c in enumerate((0.0, 100.0, 3000.0)):
        for d in range(5):
            assert share[i, d] == pytest.approx(cm.cost(Step.of([c], [float(d)])).total_s, rel=1e-12)
    with pytest.raises(ValueError, match="request_s"):
        CostModel(draft_kind="model").request_s(1, 100.0)


def test_the_per_step_rules_step_costs_say_when_they_answer(h100):
    """The online fit and the profile's prices are both what the rules read (`StepCostSource`; the hybrid's
    `HybridStepCost`); the fit is `ready` after its warm-up, the prices from the start."""
    fit, priced = StepCostFit(), PricedStepCost(h100, "das", K)
    assert isinstance(fit, StepCostSource) and isinstance(priced, StepCostSource)
    assert isinstance(StepCostFit(draft_forwards=True), HybridStepCost)
    assert isinstance(PricedHybridCost(h100, "das", "eagle3", K), HybridStepCost)
    assert not fit.ready and fit.split(8, 800) is None
    assert priced.ready and priced.r2 is None and priced.split(8, 800) is not None
    priced.add(8, 16, 800, 1e-3)
    again = PricedStepCost(h100, "das", K)
    again.load_state_dict(priced.state_dict())
    assert again.samples == priced.samples == 1


def test_best_drafts_and_the_scheduling_bound_price_with_the_function():
    from nemo_rl_specdec.scheduling.budget import expected_accepted, k_for_batch
    from nemo_rl_specdec.sim.best_drafts import best_drafts

    cm = CostModel(c_base=1.0, c_tok=1.0 / 64, draft_fwd_base=0.05, draft_kind="model")
    for b in (1, 8, 64, 200):
        A = expected_accepted(0.7, K)
        rates = [b * A[d] / cm.mean_step_time(b, d, 0.0) for d in range(K + 1)]
        assert k_for_batch(b, K, 0.7, 1.0, 1.0 / 64, 0.0, 0.05) == int(np.argmax(rates))
        assert best_drafts(cm, np.zeros(b), np.tile(A, (b, 1)), K) == int(np.argmax(rates))


def test_bad_input_is_refused_naming_the_field(h100):
    trace = _trace("list")
    with pytest.raises(TraceError, match="host_speed"):
        price(trace, h100, host_speed=0.0)
    with pytest.raises(TraceError, match="host_speed"):
        price(trace, h100, host_speed=-2.0)
    with pytest.raises(ValueError, match="host_speed"):
        h100.cost_model("das").cost(Step.of([100.0], [1.0]), host_speed=0.0)
    with pytest.raises(TraceError, match=r"steps\[0\]: request 'r0' verified 9 drafts"):
        Trace("list", K, [TraceStep(["r0"], [10], [K + 1], [0], 0, 1e-4)], "das")


def test_a_model_drafters_first_forward_runs_over_every_target_token_and_the_draft_prefills(h100):
    eagle, dflash, das = h100.cost_model("eagle3"), h100.cost_model("dflash"), h100.cost_model("das")
    roof, shape = eagle.roofline, eagle.draft_shape
    n, ctx = 200, np.full(200, 2000.0)
    step = Step.of(ctx, np.full(n, 3.0))
    first, _ = roof.forward(shape, n * 4, ctx.sum(), 0.0, ctx.sum() * 4, 0.0, overhead=False)
    rest, _ = roof.forward(shape, n, ctx.sum(), 0.0, ctx.sum(), 0.0, overhead=False)
    lines = [roof.forward(shape, t, ctx.sum(), 0.0, a, 0.0, overhead=False)[1]
             for t, a in ((n * 4, ctx.sum() * 4), (n, ctx.sum()))]
    expected = 3 * eagle.draft_fwd_base + first + 2 * rest + max(lines[0][0], lines[0][2]) \
        + 2 * max(lines[1][0], lines[1][2])
    assert eagle.cost(step).draft_s == pytest.approx(expected)
    # a step that only prefills runs the draft over the prompt (model and block drafters), not a history proposer
    prefill = Step.of([], [], prefill_tokens=4096)
    assert eagle.cost(prefill).draft_s > eagle.draft_fwd_base > 0 and dflash.cost(prefill).draft_s > 0
    assert das.cost(prefill).draft_s == das.cost(prefill).proposer_s == 0
