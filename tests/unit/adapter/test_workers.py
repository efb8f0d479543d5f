"""workers.py: our sync and async vLLM worker Impls built on the stand-ins of NeMo-RL's."""
from __future__ import annotations

import asyncio
import importlib
import importlib.machinery
import sys

import numpy as np
import pytest
from fakes import (  # noqa: E402
    FakeBatchedDataDict,
    FakeGenerationWorkerImpl,
    batch,
    spec,
    worker_cfg,
)

from nemo_rl_specdec.adapter import api, payload, translate
from nemo_rl_specdec.lockstep import LockstepState, StaleDrafterError
from nemo_rl_specdec.rollouts import problem_id


def test_sync_worker_injects_extension_stages_rollouts_and_versions_refits(fake_nemo_rl, exchange):
    from nemo_rl_specdec.adapter import workers

    impl = workers.SpecDecVllmGenerationWorkerImpl
    assert issubclass(impl, FakeGenerationWorkerImpl) and impl.__module__ == workers.__name__
    w = impl(worker_cfg(exchange, drafter="suffix"), bundle_indices=[0], extra_env_vars=("VLLM_QUANT_CFG",))
    other = impl(worker_cfg(exchange, drafter="suffix"), bundle_indices=[1])  # a second data-parallel engine
    assert w.llm_kwargs["worker_extension_cls"] == translate.OUR_EXTENSION
    assert w.extra_env_vars == ["VLLM_QUANT_CFG", "PYTHONPATH"]
    w.post_init()
    other.post_init()
    assert w.post_init_done
    assert all(r.calls[0] == ("init", spec(drafter="suffix").model_dump(mode="json")) for r in w.llm.ranks)

    data = batch([[1, 2, 3], [4, 5]])
    data[payload.BUDGET_KEY] = np.array([3, -1])
    data[payload.PREDICTED_KEY] = np.array([40.0, -1.0])
    w.generate(data)
    # every request reached vLLM with its problem id, and the driver's budget where it set one
    (_, params), = w.llm.requests
    assert [p.extra_args for p in params] == [
        {"problem_id": problem_id([1, 2, 3]), "specdec_budget": 3, "specdec_predicted_len": 40.0},
        {"problem_id": problem_id([4, 5])}]
    other.generate(batch([[6, 7]]))
    val = batch([[9, 9]])
    val[payload.NO_RECORD_KEY] = np.array([True])
    w.generate(val)  # a validation batch: never handed to the drafter

    # both engines refit (collectively, as NeMo-RL does): each gets the whole step
    results = {}
    t = __import__("threading").Thread(
        target=lambda: results.setdefault("other", other.update_weights_from_collective()))
    t.start()
    assert w.update_weights_from_collective() is True
    t.join(30)
    assert results["other"] is True and w._specdec_lockstep.policy_version == 1
    for rank in w.llm.ranks + other.llm.ranks:
        _, names, version, _, rollouts = rank.calls[-1]
        assert version == 1
        assert sorted(r.prompt_token_ids.tolist() for r in rollouts) == [[1, 2, 3], [4, 5], [6, 7]]
        assert {r.problem_id for r in rollouts} == {problem_id([1, 2, 3]), problem_id([4, 5]), problem_id([6, 7])}
    rep = w.specdec_report()
    assert rep["state"]["policy_version"] == 1 and rep["ranks_agree"] and rep["rollouts_staged"] == 2
    assert rep["validation_rollouts_skipped"] == 1

    # a failing refit does not advance the version
    w.llm.ranks[1].fail_next = True
    t = __import__("threading").Thread(target=other.update_weights_from_collective)
    t.start()
    assert w.update_weights_from_collective() is False
    t.join(30)
    assert w._specdec_lockstep.policy_version == 1
    rep = w.specdec_report()
    assert rep["ranks_agree"] is False and rep["actor_policy_version"] == 1
    with pytest.raises(StaleDrafterError, match="the refit to policy version 2 failed"):  # until one lands whole
        w.generate(batch([[1, 2]]))


def test_sync_worker_with_the_block_disabled_is_nemo_rls_worker(fake_nemo_rl):
    from nemo_rl_specdec.adapter import workers

    cfg = worker_cfg()
    cfg["speculative_decoding"]["enabled"] = False
    w = workers.SpecDecVllmGenerationWorkerImpl(cfg, bundle_indices=[0])
    assert w.llm_kwargs["worker_extension_cls"] == api.HOST_EXTENSION
    w.post_init()
    assert not hasattr(w.llm.ranks[0], "calls")
    assert w.update_weights_from_collective() is True
    assert w._specdec_lockstep.policy_version == 0 and w.specdec_report() == {}


def test_worker_refreshes_every_n_steps_and_refuses_a_drafter_past_max_policy_lag(fake_nemo_rl, exchange):
    """every_n_steps=2: updates 1, 3, 5 refresh the drafter; the rollouts of an off-cadence step
    wait for the next refresh. With max_policy_lag=0 the engine then refuses to generate, naming
    both versions; with max_policy_lag=1 it generates."""
    from nemo_rl_specdec.adapter import workers
    from nemo_rl_specdec.lockstep import StaleDrafterError

    def make(lag):
        cfg = worker_cfg(exchange, drafter="suffix", refresh={"mode": "rebuild", "every_n_steps": 2,
                                                              "max_policy_lag": lag})
        w = workers.SpecDecVllmGenerationWorkerImpl(cfg, bundle_indices=[0])
        w.post_init()
        return w

    w = make(1)
    w.generate(batch([[1, 2]]))
    assert w.update_weights_from_collective() is True        # update 1: refresh, 1 rollout
    w.generate(batch([[3, 4]]))
    assert w.update_weights_from_collective() is True        # update 2: off-cadence
    rank = w.llm.ranks[0]
    assert rank.refreshes == [True, False] and rank.calls[-1][4] is None
    w.generate(batch([[5, 6]]))                               # lag 1 <= 1: allowed
    assert w.update_weights_from_collective() is True        # update 3: refresh with both waiting rollouts
    assert rank.refreshes == [True, False, True]
    assert sorted(r.prompt_token_ids.tolist() for r in rank.calls[-1][4]) == [[3, 4], [5, 6]]
    with pytest.raises(ValueError, match=r"refresh.max_policy_lag: got 0; allowed: >= 1"):
        make(0)  # every_n_steps=2 needs a lag of 1: rejected before any engine exists
    strict = workers.SpecDecVllmGenerationWorkerImpl(
        worker_cfg(exchange, drafter="suffix", refresh={"mode": "rebuild", "max_policy_lag": 0}), bundle_indices=[0])
    strict.post_init()
    strict._specdec_lockstep = LockstepState(policy_version=3, drafter_version=1)
    with pytest.raises(StaleDrafterError,
                       match=r"policy_version=3 drafter_version=1 \(lag 2 > refresh.max_policy_lag=0"):
        strict.generate(batch([[1, 2]]))


def _both(a, b):
    """Run a() and b() at once (engines swap collectively through the exchange); (a's, b's) results."""
    import threading

    got = {}
    t = threading.Thread(target=lambda: got.setdefault("b", b()))
    t.start()
    got["a"] = a()
    t.join(30)
    return got["a"], got["b"]


def test_rollouts_are_staged_when_generation_ends_and_the_refit_installs_them(fake_nemo_rl, exchange):
    """The end of generation swaps both engines' rollouts and stages the whole step for the next version in
    every rank; rollouts generated afterwards are appended before the refit, whose update says "staged";
    a validation phase stages nothing, and a refit no end of generation staged hands over refs as before."""
    from nemo_rl_specdec.adapter import workers
    from nemo_rl_specdec.lockstep import STAGED_ROLLOUTS

    impl = workers.SpecDecVllmGenerationWorkerImpl
    w, other = (impl(worker_cfg(exchange, drafter="suffix"), bundle_indices=[i]) for i in (0, 1))
    w.post_init()
    other.post_init()
    w.generate(batch([[1, 2, 3]]))
    other.generate(batch([[4, 5]]))
    got, got_other = _both(w.specdec_stage_generated, other.specdec_stage_generated)
    assert got["version"] == got_other["version"] == 1 and got["rollouts"] == 2 and got["errors"] == 0
    for rank in w.llm.ranks + other.llm.ranks:
        assert rank.staged == [(1, [[1, 2, 3], [4, 5]])]
    assert w._specdec_lockstep.policy_version == 0 and w.specdec_report()["staged_for"] == 1
    w.generate(batch([[6, 7]]))                         # after the staging, before the refit
    assert _both(w.update_weights_from_collective, other.update_weights_from_collective) == (True, True)
    for rank in w.llm.ranks + other.llm.ranks:
        assert rank.calls[-1][2] == 1 and rank.calls[-1][4] == STAGED_ROLLOUTS
    assert [r.staged for r in w.llm.ranks] == [[(1, [[1, 2, 3], [4, 5]]), (1, [[6, 7]])]] * 2  # appended
    assert other.llm.ranks[0].staged == w.llm.ranks[0].staged
    rep = w.specdec_report()
    assert rep["staged_for"] is None and rep["rollouts_staged"] == 2 and rep["last_stage"]["version"] == 1
    # a validation phase: nothing recorded, so nothing is staged and the refit rebuilds from an empty step
    val = batch([[9, 9]])
    val[payload.NO_RECORD_KEY] = np.array([True])
    w.generate(val)
    assert _both(w.specdec_stage_generated, other.specdec_stage_generated) == ({}, {})
    assert _both(w.update_weights_from_collective, other.update_weights_from_collective) == (True, True)
    assert w.llm.ranks[0].calls[-1][2] == 2 and len(w.llm.ranks[0].calls[-1][4]) == 0
    assert len(w.llm.ranks[0].staged) == 2


def test_the_end_of_generation_stages_nothing_off_cadence_or_for_a_disabled_drafter(fake_nemo_rl, exchange):
    from nemo_rl_specdec.adapter import workers

    cfg = worker_cfg(exchange, drafter="suffix", refresh={"mode": "rebuild", "every_n_steps": 2, "max_policy_lag": 1})
    w = workers.SpecDecVllmGenerationWorkerImpl(cfg, bundle_indices=[0])
    w.post_init()
    w._specdec_lockstep = LockstepState(policy_version=1)  # the next update (2) does not refresh
    w.generate(batch([[1, 2]]))
    assert w.specdec_stage_generated() == {} and len(w._specdec_stash) == 1  # they wait for update 3
    frozen = workers.SpecDecVllmGenerationWorkerImpl(worker_cfg(exchange, drafter="suffix", refresh={"mode": "frozen"}),
                                                     bundle_indices=[0])
    frozen.generate(batch([[1, 2]]))
    assert frozen.specdec_stage_generated() == {}
    w._specdec_lockstep = LockstepState(policy_version=2, drafter_version=2, disabled=True)
    assert w.specdec_stage_generated() == {} and len(w._specdec_stash) == 0  # swapped, not staged
    assert not hasattr(w.llm.ranks[0], "staged")


def test_worker_verifies_the_drafter_after_every_wake_up_that_brings_weights_back(fake_nemo_rl):
    from nemo_rl_specdec.adapter import workers

    w = workers.SpecDecVllmGenerationWorkerImpl(worker_cfg(drafter="ngram"), bundle_indices=[0])
    w.wake_up(tags=["kv_cache"])            # NeMo-RL wakes the KV cache separately: weights untouched
    assert not hasattr(w.llm.ranks[0], "verified")
    w.wake_up(tags=["weights"])
    w.wake_up()
    assert all(r.verified == [True, True] for r in w.llm.ranks) and w.woken == [["kv_cache"], ["weights"], None]


def test_every_sleep_is_preceded_by_the_drafters_restorable_check_sync_and_async(fake_nemo_rl):
    """NeMo-RL's `llm.sleep(level)` on our workers first has every vLLM worker check that its drafter
    can come back from that level (`specdec_check_restorable`); a refusal raises before the sleep."""
    import asyncio

    from nemo_rl_specdec.adapter import workers
    from nemo_rl_specdec.config.run import ConfigError

    w = workers.SpecDecVllmGenerationWorkerImpl(worker_cfg(drafter="ngram"), bundle_indices=[0])
    w.post_init()
    w.llm.sleep(level=1)
    assert all(r.checked_levels == [1] for r in w.llm.ranks) and w.llm.slept == [1]
    w.llm.ranks[-1].refuses_level = 2
    with pytest.raises(ConfigError, match=r"sleep_level: got 2"):
        w.llm.sleep(level=2)
    assert w.llm.slept == [1]                # refused before the sleep
    a = workers.SpecDecVllmAsyncGenerationWorkerImpl(worker_cfg(drafter="ngram"), bundle_indices=[0])
    asyncio.run(a.post_init_async())
    asyncio.run(a.llm.sleep(level=1))
    assert all(r.checked_levels == [1] for r in a.llm.ranks) and a.llm.slept == [1]


def test_a_batch_the_worker_cannot_record_fails_the_next_refit_by_name(fake_nemo_rl, exchange):
    from nemo_rl_specdec.adapter import workers
    from nemo_rl_specdec.rollouts import RolloutError

    w = workers.SpecDecVllmGenerationWorkerImpl(worker_cfg(exchange, drafter="suffix"), bundle_indices=[0])
    w.post_init()
    bad = batch([[1, 2, 3]])
    out = w.generate(bad)
    assert out["generation_lengths"].tolist()  # the generation itself is returned
    w._specdec_observe(FakeBatchedDataDict({"input_ids": bad["input_ids"]}), out)  # no input_lengths
    with pytest.raises(RolloutError,
                       match=r"1 generation batch\(es\) .* could not be recorded .*KeyError: 'input_lengths'"):
        w.update_weights_from_collective()


def test_worker_keeps_no_rollouts_for_drafters_that_do_not_use_them(fake_nemo_rl):
    from nemo_rl_specdec.adapter import workers

    w = workers.SpecDecVllmGenerationWorkerImpl(worker_cfg(drafter="ngram"), bundle_indices=[0])
    w.generate(batch([[1, 2]]))
    assert w._specdec_stash is None
    assert w.update_weights_from_collective() is True
    assert w.llm.ranks[0].calls[-1][4] is None  # nothing staged: an ngram drafter takes none


def test_worker_refuses_a_rollout_drafter_without_the_exchange(fake_nemo_rl):
    from nemo_rl_specdec.adapter import workers

    with pytest.raises(RuntimeError, match="_specdec_exchange is missing"):
        workers.SpecDecVllmGenerationWorkerImpl(worker_cfg(drafter="suffix"), bundle_indices=[0])


def test_worker_preflight_names_the_arctic_recipe(fake_nemo_rl, monkeypatch):
    from nemo_rl_specdec.adapter import workers

    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding", None)  # import fails
    with pytest.raises(ImportError, match=r"(?s)drafter=suffix: arctic_inference does not import.*no-build-isolation"):
        workers.SpecDecVllmGenerationWorkerImpl(worker_cfg("x", drafter="suffix"), bundle_indices=[0])


def test_worker_composes_with_the_checkpoint_engine_extension(fake_nemo_rl, monkeypatch):
    from nemo_rl_specdec.adapter import workers

    monkeypatch.setattr(FakeGenerationWorkerImpl, "use_checkpoint_engine", True)
    w = workers.SpecDecVllmGenerationWorkerImpl(worker_cfg(drafter="ngram"), bundle_indices=[0])
    assert w.llm_kwargs["worker_extension_cls"] == translate.OUR_EXTENSION_CKPT
    assert w.checkpoint_engine_rpc("prepare_checkpoint_engine") == ("passthrough", "prepare_checkpoint_engine")


def test_async_worker_stages_and_versions_like_the_sync_one(fake_nemo_rl, exchange):
    from nemo_rl_specdec.adapter import workers

    impl = workers.SpecDecVllmAsyncGenerationWorkerImpl
    w = impl(worker_cfg(exchange, drafter="suffix"), bundle_indices=[0])
    assert w.llm_kwargs["worker_extension_cls"] == translate.OUR_EXTENSION

    async def scenario():
        await w.post_init_async()
        items = [item async for item in w.generate_async(batch([[7, 8, 9]]))]
        ok = await w.update_weights_from_collective_async()
        rep = await w.specdec_report()
        passthrough = await w.checkpoint_engine_rpc_async("finalize_checkpoint_engine")
        _ = [item async for item in w.generate_async(batch([[3, 4]]))]
        staged = await w.specdec_stage_generated()      # the end of a generation phase (finish_generation)
        ok2 = await w.update_weights_from_collective_async()
        return items, ok, rep, passthrough, staged, ok2

    items, ok, rep, passthrough, staged, ok2 = asyncio.run(scenario())
    assert len(items) == 1 and ok is True
    assert w.llm.ranks[0].calls[0][0] == "init"
    _, _, version, _, rollouts = w.llm.ranks[0].calls[1]
    (r,) = list(rollouts)
    assert version == 1 and r.prompt_token_ids.tolist() == [7, 8, 9] and len(r.token_ids) == (7 + 8 + 9) % 5 + 1
    assert rep["state"]["policy_version"] == 1 and rep["rollouts_staged"] == 1
    assert passthrough == ("passthrough", "finalize_checkpoint_engine")
    assert staged["version"] == 2 and ok2 is True and w._specdec_lockstep.policy_version == 2
    assert w.llm.ranks[0].staged == [(2, [[3, 4]])] and w.llm.ranks[0].calls[-1][2:5:2] == (2, "staged")


def test_ray_actor_classes_build_by_fqn(fake_nemo_rl):
    ray = pytest.importorskip("ray")
    from nemo_rl_specdec.adapter import workers

    mod, _, name = translate.OUR_SYNC_WORKER.rpartition(".")
    actor = getattr(importlib.import_module(mod), name)
    assert isinstance(actor, ray.actor.ActorClass)
    assert getattr(importlib.import_module(mod), name) is actor  # built once
    assert isinstance(workers.SpecDecVllmAsyncGenerationWorker, ray.actor.ActorClass)


def test_worker_actor_classes_export_their_methods_by_reference(fake_nemo_rl):
    """Ray exports an actor class with cloudpickle, each method wrapped; a method pickled by value drags its
    globals along, and `_REQUEST_EXTRAS` (a ContextVar) cannot be pickled, so NeMo-RL's RayWorkerGroup could
    not create our actor. Every method we define must be found by its module and qualified name."""
    import pickle

    from ray import cloudpickle

    from nemo_rl_specdec.adapter import workers

    for name in ("SpecDecVllmGenerationWorkerImpl", "SpecDecVllmAsyncGenerationWorkerImpl"):
        impl = getattr(workers, name)
        ours = {a: f for a, f in vars(impl).items() if callable(f) and f.__module__ == workers.__name__}
        assert "generate" in ours or "generate_async" in ours
        for attr, fn in ours.items():
            blob = cloudpickle.dumps(fn)
            assert pickle.loads(blob) is fn, f"{name}.{attr} is pickled by value"


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_checkpoint_carries_the_engines_versions_and_the_rollouts_waiting_for_the_next_update(
        fake_nemo_rl, ray_local, kind):
    """What a worker actor saves (workers.py `_specdec_saved`) and a new one restores: its version, its
    vLLM workers' state, and the rollouts generated since the last refit, which the resumed engine's
    first refit hands to the drafter with the next version, as the engine that stopped would have."""
    from nemo_rl_specdec.adapter import workers

    impl = workers.SpecDecVllmGenerationWorkerImpl if kind == "sync" else workers.SpecDecVllmAsyncGenerationWorkerImpl

    async def call(x):
        return await x if asyncio.iscoroutine(x) else x

    async def gen(w, rows):
        if kind == "sync":
            return w.generate(batch(rows))
        return [item async for item in w.generate_async(batch(rows))]

    from nemo_rl_specdec.adapter.exchange import exchange_actor_class

    names = [f"test_exchange_{kind}_{i}" for i in range(2)]  # the stopped run's and the resumed run's
    actors = [exchange_actor_class().options(name=n).remote(timeout_s=60) for n in names]

    async def scenario():
        w = impl(worker_cfg(names[0], drafter="suffix"), bundle_indices=[0])
        await call(w.post_init() if kind == "sync" else w.post_init_async())
        await gen(w, [[7, 8, 9]])
        await call(w.update_weights_from_collective() if kind == "sync" else w.update_weights_from_collective_async())
        await gen(w, [[3, 4]])  # generated after the last refit: the next update's
        saved = await call(w.specdec_export_state())
        w2 = impl(worker_cfg(names[1], drafter="suffix"), bundle_indices=[0])
        await call(w2.post_init() if kind == "sync" else w2.post_init_async())
        restored = await call(w2.specdec_restore_state(saved))
        ok = await call(w2.update_weights_from_collective() if kind == "sync"
                        else w2.update_weights_from_collective_async())
        return saved, restored, ok, w2

    try:
        saved, restored, ok, w2 = asyncio.run(scenario())
    finally:
        for a in actors:
            ray_local.kill(a)
    assert saved["version"] == 1 and saved["worker"]["state"]["policy_version"] == 1
    assert saved["pending"]["problem_ids"] == [problem_id([3, 4])]
    assert restored == {"version": 1, "restored_entries": 0} and ok is True
    _, _, version, _, rollouts = w2.llm.ranks[0].calls[-1]
    assert version == 2 and [r.prompt_token_ids.tolist() for r in rollouts] == [[3, 4]]
    assert w2._specdec_lockstep.policy_version == 2


def test_the_actors_version_is_its_engines_and_a_report_that_disagrees_is_refused(fake_nemo_rl, exchange):
    """One lockstep state: a refit the workers report at another version, and a restore whose workers
    disagree with the saved engine, are refused naming both versions."""
    from nemo_rl_specdec.adapter import workers
    from nemo_rl_specdec.lockstep import DrafterRefreshError

    w = workers.SpecDecVllmGenerationWorkerImpl(worker_cfg(exchange, drafter="suffix"), bundle_indices=[0])
    w.post_init()
    state = {"policy_version": 1, "drafter_version": 1, "drafter_built_from": 1}
    w._specdec_record_refit(True, 1, [{"state": state}])
    assert w._specdec_lockstep == LockstepState(1, 1, 1)
    with pytest.raises(DrafterRefreshError, match="refit to policy version 2 succeeded, but the engine reports 1"):
        w._specdec_record_refit(True, 2, [{"state": state}])
    disagree = "saved engine is at policy version 3, its restored vLLM workers at 1"
    with pytest.raises(DrafterRefreshError, match=disagree):
        w._specdec_restore({"version": 3}, [state])
    assert w._specdec_lockstep == LockstepState(1, 1, 1)
