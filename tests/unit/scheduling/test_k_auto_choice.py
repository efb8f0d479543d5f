"""`scheduling.k: auto`'s choice (scheduling/k_auto.py) on planted step costs and acceptance.

The scheduler hooks run on real vLLM engines in tests/engine/test_k_auto.py."""
from __future__ import annotations

import numpy as np
import pytest

from nemo_rl_specdec.scheduling import k_auto
from nemo_rl_specdec.scheduling.budget import schedule_ranges
from nemo_rl_specdec.scheduling.k_auto import KAuto


def planted(k_max=6, max_batch=64, allow_zero=True, coef=(0.010, 1e-4, 2e-4, 0.0, 0.003, 5e-5),
            accept=(0.8, 0.6, 0.45, 0.3, 0.2, 0.1), batches=(1, 2, 4, 8, 16, 32, 64), ctx=100.0):
    ka = KAuto(k_max, max_batch, allow_zero=allow_zero, name="t")
    ka.fit.coef = np.asarray(coef, dtype=float)
    rng = np.random.default_rng(0)
    for _ in range(20000):  # drafts of full length whose accepted prefix follows the planted curve
        u = rng.random()
        ka.acceptance.record(0, [0] * k_max, int(sum(u < a for a in accept)))
    for b in batches:
        ka._batches.extend([b] * 10)
    ka._ctx_per_req.append(ctx)
    ka.scheduled = k_auto.WARMUP_STEPS + 1
    return ka


def brute_force(ka, b, coef, ctx):
    a = ka.curve()
    best, best_thr = None, -1.0
    for d in range(ka.k_min, ka.k_max + 1):
        f = max(d, 1)
        t = coef[0] + coef[1] * b + coef[2] * b * (1 + d) + coef[3] * ctx * b + coef[4] * f + coef[5] * f * b
        thr = b * (1 + sum(a[:d])) / t
        if thr > best_thr * (1 + 1e-12):
            best, best_thr = d, thr
    return best


def test_measured_acceptance_follows_the_planted_curve():
    ka = planted()
    assert np.allclose(ka.curve(), [0.8, 0.6, 0.45, 0.3, 0.2, 0.1], atol=0.02)


@pytest.mark.parametrize("coef", [
    (0.010, 1e-4, 2e-4, 0.0, 0.003, 5e-5),   # draft forwards cheap: long drafts at small batches
    (0.010, 1e-4, 2e-3, 0.0, 0.001, 0.0),    # verification dear: k falls fast with the batch
    (0.002, 0.0, 1e-4, 1e-6, 0.010, 1e-4),   # draft forwards dear: short drafts everywhere
])
@pytest.mark.parametrize("allow_zero", [True, False])
def test_the_chosen_schedule_is_the_brute_force_optimum(coef, allow_zero):
    ka = planted(coef=coef, allow_zero=allow_zero)
    ka.recheck()
    for b in range(1, ka.max_batch + 1):
        assert ka.lookup[b] == brute_force(ka, b, coef, 100.0), b
    assert min(ka.lookup[1:]) >= (0 if allow_zero else 1)
    assert ka.switches == 1 and ka.regret > k_auto.SWITCH_REGRET


def test_drafts_that_lose_everywhere_turn_speculation_off_unless_auto_disable_is_off():
    # vLLM runs a model drafter's first forward even at k = 0, so k = 0 saves verification only:
    # drafts lose once a verified token costs more than its acceptance brings
    coef = (0.001, 0.0, 1e-3, 0.0, 0.02, 0.0)
    accept = (0.02, 0.01, 0.0, 0.0, 0.0, 0.0)
    on = planted(coef=coef, accept=accept)
    on.recheck()
    assert set(on.lookup[1:]) == {0}
    off = planted(coef=coef, accept=accept, allow_zero=False)
    off.recheck()
    assert set(off.lookup[1:]) == {1}


def test_a_schedule_within_the_switch_margin_is_kept():
    coef = (0.010, 1e-4, 2e-4, 0.0, 0.003, 5e-5)
    ka = planted(coef=coef)
    ka.recheck()
    chosen = list(ka.lookup)
    ka.lookup[1:] = [min(k + 1, ka.k_max) if b == 64 else k for b, k in enumerate(chosen[1:], 1)]
    thr = ka.throughput()
    ka.recheck()  # one batch size of seven off by one draft token: well inside 5%
    assert ka.switches == 1 and 0 < ka.regret <= k_auto.SWITCH_REGRET
    assert ka.lookup[64] == min(chosen[64] + 1, ka.k_max) and thr.shape == (64, 7)


def test_the_lookup_is_changed_in_place_and_its_ranges_are_vllm_shaped():
    ka = planted()
    held = ka.lookup  # what the scheduler holds
    ka.recheck()
    assert held is ka.lookup
    ranges = schedule_ranges(ka.lookup)
    assert ranges[0][0] == 1 and ranges[-1][1] == ka.max_batch
    assert all(lo <= hi and hi + 1 == nxt for (lo, hi, _), (nxt, _, _) in zip(ranges, ranges[1:], strict=False))


def test_exploration_cycles_k_in_the_warm_up_then_one_step_in_explore_every():
    ka = KAuto(4, 8, allow_zero=True)
    ks = [ka._next_lookup()[1] for _ in range(k_auto.WARMUP_STEPS)]
    assert sorted(set(ks)) == [0, 1, 2, 3, 4]
    after = [ka._next_lookup() is ka.lookup for _ in range(4 * k_auto.EXPLORE_EVERY)]
    assert after.count(False) == 4


@pytest.mark.parametrize("k_max,allow_zero", [(8, False), (3, True), (8, True)])
def test_exploration_after_the_warm_up_visits_every_k_whatever_the_cycle_length(k_max, allow_zero):
    """A cycle whose length divides EXPLORE_EVERY (1..8, 0..3) must not explore one k forever."""
    ka = KAuto(k_max, 4, allow_zero=allow_zero)
    for _ in range(k_auto.WARMUP_STEPS):
        ka._next_lookup()
    later = [t[1] for t in (ka._next_lookup() for _ in range(20 * k_auto.EXPLORE_EVERY)) if t is not ka.lookup]
    assert set(later) == set(range(0 if allow_zero else 1, k_max + 1))


def test_attach_refuses_a_scheduler_without_a_per_batch_size_schedule():
    class Scheduler:
        dynamic_sd_lookup = None

    with pytest.raises(RuntimeError, match="per-batch-size schedule"):
        KAuto(4, 8).attach(Scheduler())
