"""generation.py: our VllmGeneration subclass on stand-ins (placement, async routing, step metrics)."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
from fakes import (  # noqa: E402
    FakeEngine,
    FakeVllmGeneration,
    batch,
    nrl_step,
    worker_cfg,
)

from nemo_rl_specdec.adapter import payload


def generation_cfg(placement="length_aware"):
    g = worker_cfg(drafter="ngram", scheduling={"placement": placement})
    g["_pad_token_id"] = 0
    return g


def test_length_aware_generate_matches_contiguous_results_in_input_order(fake_nemo_rl):
    from nemo_rl_specdec.adapter import generation

    cls = generation.SpecDecVllmGeneration
    assert issubclass(cls, FakeVllmGeneration) and cls.__module__ == generation.__name__
    prompts = [[g, g + 1] for g in range(8) for _ in range(4)]   # 8 groups x 4 samples, contiguous
    data = batch(prompts)
    ours = cls([FakeEngine(), FakeEngine()], generation_cfg())
    plain = FakeVllmGeneration([FakeEngine(), FakeEngine()], generation_cfg())
    want = plain.generate(data)
    first = ours.generate(data)          # no history yet: spreads groups, same outputs
    second = ours.generate(data)         # with history: longest predicted first
    for got in (first, second):
        assert set(got) == set(want)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
    sent = ours.worker_group.calls[-1]
    assert sent != plain.worker_group.calls[-1]           # a different placement than contiguous
    stats = ours._specdec_placement_stats
    assert stats["predicted_imbalance"] <= stats["contiguous_predicted_imbalance"]
    assert set(stats) == {"predicted_imbalance", "contiguous_predicted_imbalance", "actual_imbalance"}


def test_contiguous_placement_is_nemo_rls_generate(fake_nemo_rl):
    from nemo_rl_specdec.adapter import generation

    ours = generation.SpecDecVllmGeneration([FakeEngine(), FakeEngine()], generation_cfg("contiguous"))
    plain = FakeVllmGeneration([FakeEngine(), FakeEngine()], generation_cfg("contiguous"))
    data = batch([[1], [2], [3]])
    np.testing.assert_array_equal(ours.generate(data)["output_ids"], plain.generate(data)["output_ids"])
    assert ours.worker_group.calls == plain.worker_group.calls


def test_generate_async_routes_to_the_least_loaded_engine(fake_nemo_rl):
    from nemo_rl_specdec.adapter import generation

    ours = generation.SpecDecVllmGeneration([FakeEngine(), FakeEngine()], generation_cfg())
    long_p, short_p = [3, 3, 3, 1], [1, 1]
    ours._specdec_planner.observe(payload.problem_ids(batch([long_p, short_p])["input_ids"], [4, 2]), [1000, 10])

    async def run():
        # hold the long request open while two short ones arrive: both must avoid its engine
        agen = ours.generate_async(batch([long_p]))
        first = await agen.__anext__()
        shorts = []
        for _ in range(2):
            shorts.append([i async for i in ours.generate_async(batch([short_p]))])
        rest = [i async for i in agen]
        return first, shorts, rest

    first, shorts, rest = asyncio.run(run())
    assert ours.shards_used == [0, 1, 1]
    assert rest == [] and all(len(s) == 1 for s in shorts)
    assert ours._specdec_planner.outstanding == [0.0, 0.0]
    ours.fleet_selector = object()  # NeMo-RL's health-aware selection wins when attached

    async def one():
        return [i async for i in ours.generate_async(batch([short_p]))]
    asyncio.run(one())
    asyncio.run(one())
    assert ours.shards_used[3:] == [0, 1]  # NeMo-RL's own round robin, its counter untouched by our picks


def test_get_step_metrics_merges_nemo_rl_and_specdec_keys(fake_nemo_rl, monkeypatch):
    from nemo_rl_specdec.adapter import generation

    monkeypatch.setattr(generation, "_ray_get", lambda futures: futures)
    ours = generation.SpecDecVllmGeneration([FakeEngine(), FakeEngine({"policy_version": 2, "drafter_version": 1})],
                                             generation_cfg())
    ours.base_metrics = nrl_step(10, 40, 20)
    ours.snapshot_step_metrics()
    ours.generate(batch([[1, 2], [3, 4], [5, 6]]))
    m = ours.get_step_metrics()
    for k, v in nrl_step(10, 40, 20).items():
        assert m[k] == v                                            # NeMo-RL's keys unchanged
    assert m["specdec/drafter_lag"] == 1.0 and m["specdec/engines_in_lockstep"] == 0.0
    assert m["specdec/acceptance_length_by_lag/1"] == pytest.approx(3.0)
    assert "specdec/placement/actual_imbalance" in m
    ours.snapshot_step_metrics()
    assert "specdec/placement/actual_imbalance" not in ours.get_step_metrics()  # per step


def test_no_drafts_is_judged_on_what_the_engines_generated_in_nemo_rls_window(fake_nemo_rl, monkeypatch):
    """Async GRPO opens its window after the collector handed the batch over: a window in which the
    engines generated nothing has no drafts either, and that is no alarm; generating without drafting is."""
    import warnings

    from nemo_rl_specdec.adapter import generation

    monkeypatch.setattr(generation, "_ray_get", lambda futures: futures)
    engines = [FakeEngine(), FakeEngine()]
    ours = generation.SpecDecVllmGeneration(engines, generation_cfg())
    ours.base_metrics = nrl_step(0, 0, 0)

    def step(generated, drafts):
        ours.snapshot_step_metrics()
        for e in engines:
            e.counters = {**e.counters, "generated_tokens": e.counters["generated_tokens"] + generated,
                          "drafts": e.counters["drafts"] + drafts}
        return ours.get_step_metrics()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        idle = step(0, 0)                                           # the collector was done before the window
    assert idle["specdec/generated_tokens"] == 0.0 and "specdec/no_drafts" not in idle
    assert step(5, 2)["specdec/no_drafts"] == 0.0                   # both engines drafted
    with pytest.warns(RuntimeWarning, match="0 drafts"):
        busy = step(7, 0)
    assert busy["specdec/generated_tokens"] == 14.0 and busy["specdec/no_drafts"] == 1.0


def test_finish_generation_stages_rollouts_on_every_engine_before_nemo_rls_sleep(fake_nemo_rl, monkeypatch):
    from nemo_rl_specdec.adapter import generation

    monkeypatch.setattr(generation, "_ray_get", lambda futures: futures)
    engines = [FakeEngine(), FakeEngine()]
    cfg = worker_cfg(drafter="suffix")
    cfg["_pad_token_id"] = 0
    ours = generation.SpecDecVllmGeneration(engines, cfg)
    seen = []
    nemo_rls = FakeVllmGeneration.finish_generation
    monkeypatch.setattr(FakeVllmGeneration, "finish_generation", lambda self: (  # staged before the sleep
        seen.append([getattr(e, "stage_calls", 0) for e in engines]), nemo_rls(self))[-1])
    assert ours.finish_generation() is True          # nothing generated through it (async GRPO's validation)
    assert seen == [[0, 0]] and ours._specdec_stage_reports == []
    with generation.validating(ours):
        ours.generate(batch([[1, 2]]))
    ours.finish_generation()
    assert seen[-1] == [0, 0]                           # a validation phase stages nothing
    ours.generate(batch([[1, 2], [3, 4]]))
    assert ours.finish_generation() is True
    assert seen[-1] == [1, 1] and ours.finished == 3   # staged on every engine before NeMo-RL's sleep
    assert ours._specdec_stage_reports == [FakeEngine().specdec_stage_generated()] * 2
    ours.finish_generation()
    assert seen[-1] == [1, 1]                           # once per rollout phase
    plain = generation.SpecDecVllmGeneration([FakeEngine()], generation_cfg())  # ngram: takes no rollouts
    assert plain.finish_generation() is True and not hasattr(plain.worker_group.engines[0], "stage_calls")


def test_a_drafter_check_that_fails_at_wake_up_stops_the_run_with_its_own_error(fake_nemo_rl, monkeypatch):
    """NeMo-RL's VllmGeneration catches every error of its engines' wake-up and only prints it: the
    worker keeps why our drafter check failed, and our generation raises it, named, before anything
    drafts with that drafter; a wake-up whose check passed goes on."""
    from nemo_rl_specdec.adapter import generation, workers
    from nemo_rl_specdec.lockstep import DrafterRefreshError

    monkeypatch.setattr(generation, "_ray_get", lambda futures: futures)
    state = workers.SpecDecWorkerState()
    assert state.specdec_wake_error() == ""
    with pytest.raises(DrafterRefreshError), state._specdec_wake_check():
        raise DrafterRefreshError("the drafter is no longer the pushed version 3")
    engines = [FakeEngine(), FakeEngine()]
    cfg = worker_cfg(drafter="suffix")
    cfg["_pad_token_id"] = 0
    ours = generation.SpecDecVllmGeneration(engines, cfg)
    assert ours.prepare_for_generation(tags=["weights"]) is True
    engines[1].wake_failure = state.specdec_wake_error()
    with pytest.raises(DrafterRefreshError, match=r"failed on 1 engine\(s\): DrafterRefreshError: the drafter is no "
                                                  r"longer the pushed version 3$"):
        ours.prepare_for_generation(tags=["weights"])
    with state._specdec_wake_check():
        pass
    assert state.specdec_wake_error() == ""
