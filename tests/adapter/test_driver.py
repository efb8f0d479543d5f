"""Driver-side code on NeMo-RL's real classes, with GRPO-shaped batches.

Real here: NeMo-RL's `BatchedDataDict` (batches, `select_indices`, `shard_by_batch_size`,
`from_batches`), its `VllmGeneration.generate` (the contiguous path we compare against) and
`NamedSharding`, its vLLM worker's `generate` (prompt formatting, right-padding check, output
assembly: `output_ids` = prompt + generated + padding, `generation_lengths`,
`unpadded_sequence_lengths`, `logprobs`) run inside our worker subclass, vLLM's `SamplingParams`,
our placement, payload and rollout code, and the real `RolloutStore` / `DASProposer` (arctic
suffix trees). The generation config is the one NeMo-RL's own loading and
`configure_generation_config` produce for configs/qwen3_8b_suffix.yaml.

Stand-ins, each only where the real thing cannot run here: `StubLLM` for the vLLM engine (a real
`vllm.LLM` would need the model's weights; the live-engine tests cover it), and `LocalWorkerGroup`
for NeMo-RL's `RayWorkerGroup` (Ray actors in GPU placement groups).
"""
from __future__ import annotations

import copy
import hashlib
from types import SimpleNamespace

import numpy as np
import pytest

from nemo_rl_specdec import run_grpo
from nemo_rl_specdec.adapter import payload, translate
from nemo_rl_specdec.lockstep import LockstepState
from nemo_rl_specdec.resources import config_path
from nemo_rl_specdec.rollouts import RolloutBatch, problem_id

pytestmark = pytest.mark.nemo_rl

PAD = 0
PROMPTS, GROUP, ENGINES = 6, 4, 2


class StubLLM:
    """Stands in for `vllm.LLM` (no model weights here). Generates, per prompt, a deterministic response
    whose length and tokens depend only on the prompt (so GRPO siblings agree and any misplaced row is
    visible), and records the SamplingParams it was given."""

    def __init__(self, max_model_len: int = 4096):
        self.calls: list = []
        self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(max_model_len=max_model_len, model="stub"))

    @staticmethod
    def response(prompt_tokens) -> list[int]:
        h = hashlib.blake2b(np.asarray(prompt_tokens, np.int64).tobytes(), digest_size=8).digest()
        n = 3 + h[0] % 9
        return [5 + (h[i % 8] + 7 * i) % 90 for i in range(n)]

    def generate(self, prompts, sampling_params, use_tqdm=True, **kw):
        sps = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        assert len(sps) == len(prompts)
        self.calls.append((prompts, sps))
        outs = []
        for p in prompts:
            toks = self.response(p["prompt_token_ids"])
            lp = [{t: SimpleNamespace(logprob=-0.25)} for t in toks]
            outs.append(SimpleNamespace(
                prompt_token_ids=list(p["prompt_token_ids"]),
                outputs=[SimpleNamespace(token_ids=toks, logprobs=lp, finish_reason="stop")]))
        return outs


class LocalWorkerGroup:
    """Stands in for NeMo-RL's RayWorkerGroup (Ray actors in GPU placement groups): runs each data-parallel
    shard on a worker object in this process, with the methods VllmGeneration.generate calls."""

    def __init__(self, workers):
        self.workers = workers
        self.dp_size = len(workers)
        self.sent: list = []

    def run_all_workers_sharded_data(self, method, data, in_sharded_axes, replicate_on_axes,
                                     output_is_replicated, common_kwargs):
        assert in_sharded_axes == ["data_parallel"] and len(data) == self.dp_size
        self.sent.append(list(data))
        return [(w, method, shard, common_kwargs) for w, shard in zip(self.workers, data, strict=True)]

    def get_all_worker_results(self, bundle):
        return [getattr(w, method)(shard, **kw) for w, method, shard, kw in bundle]

    def shutdown(self, cleanup_method=None):  # VllmGeneration.__del__ -> shutdown()
        return True


@pytest.fixture(scope="module")
def gen_cfg(nemo_rl_src, tmp_path_factory):
    """policy.generation for configs/qwen3_8b_suffix.yaml with budget: length_aware (budgets set at
    submission travel with each request) after NeMo-RL's loading and our wrapped
    configure_generation_config (DAS, length-aware placement and budgets)."""
    from nemo_rl.algorithms.grpo import MasterConfig
    from nemo_rl.models.generation import configure_generation_config
    from nemo_rl.utils.config import load_config, register_omegaconf_resolvers
    from omegaconf import OmegaConf

    code, plan = run_grpo.prepare(["--config", str(config_path("qwen3_8b_suffix.yaml"))])
    assert code == -1
    path = run_grpo.write_composed(plan["base"], str(tmp_path_factory.mktemp("suffix")))
    register_omegaconf_resolvers()
    cfg = load_config(str(path))
    OmegaConf.update(cfg, "policy.generation.speculative_decoding.scheduling.budget", "length_aware")
    master = MasterConfig(**OmegaConf.to_container(cfg, resolve=True))
    gen = run_grpo.make_configure_wrapper(configure_generation_config)(
        copy.deepcopy(master.policy["generation"]), SimpleNamespace(pad_token_id=PAD, eos_token_id=2))
    gen[translate.EXCHANGE_KEY] = "specdec_rollouts_test"  # what SpecDecVllmGeneration.__init__ adds
    return gen


def make_worker(gen_cfg, monkeypatch):
    """Our sync worker (real NeMo-RL VllmGenerationWorkerImpl underneath), built the way NeMo-RL's CPU tests
    build workers: `__new__` plus the attributes its methods read; the engine is created through our
    `_create_engine` with NeMo-RL's base `_create_engine` replaced by StubLLM (no weights here)."""
    import vllm
    from nemo_rl.models.generation.vllm import vllm_worker as nrl_worker
    from nemo_rl.models.generation.vllm.vllm_worker import VllmGenerationWorkerImpl

    from nemo_rl_specdec.adapter import workers

    cls = workers.SpecDecVllmGenerationWorkerImpl
    w = object.__new__(cls)
    w.cfg = copy.deepcopy(gen_cfg)
    w.SamplingParams = vllm.SamplingParams
    fallback = getattr(nrl_worker, "ROUTED_EXPERTS_FALLBACK_DTYPE", None)
    if fallback is not None:  # main's _init_config sets it (its _apply_vllm_patches edits vLLM: not run here)
        w.routed_experts_dtype = fallback
    w._specdec_setup(w.cfg)
    created = {}
    monkeypatch.setattr(VllmGenerationWorkerImpl, "_create_engine",
                        lambda self, kw: (created.update(kw), setattr(self, "llm", StubLLM()))[-1])
    llm_kwargs = {"worker_extension_cls": "nemo_rl.models.generation.vllm.vllm_backend.VllmInternalWorkerExtension"}
    w._create_engine(llm_kwargs)
    assert created["worker_extension_cls"] == translate.OUR_EXTENSION
    return w


def grpo_batch(prompts: int = PROMPTS, group: int = GROUP, seed: int = 0):
    """A GRPO generation batch as NeMo-RL builds it: each prompt repeated `group` times, right-padded."""
    import torch
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    rng = np.random.default_rng(seed)
    rows = []
    for _p in range(prompts):
        toks = rng.integers(10, 1000, size=int(rng.integers(4, 17))).tolist()
        rows += [toks] * group
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
    return BatchedDataDict({"input_ids": ids, "input_lengths": torch.tensor([len(r) for r in rows]),
                            "stop_strings": [None] * len(rows)}), rows


def make_generation(gen_cfg, workers):
    """Our SpecDecVllmGeneration (real VllmGeneration underneath) built with `__new__` and the attributes
    `generate` reads; NamedSharding is NeMo-RL's real class."""
    from nemo_rl.distributed.named_sharding import NamedSharding

    from nemo_rl_specdec.adapter import generation

    g = object.__new__(generation.SpecDecVllmGeneration)
    g.cfg = copy.deepcopy(gen_cfg)
    g._specdec_setup(g.cfg)
    g.dp_size = len(workers)
    g.sharding_annotations = NamedSharding(layout=np.arange(len(workers)).reshape(len(workers), 1, 1),
                                           names=["data_parallel", "pipeline_parallel", "tensor_parallel"])
    g.worker_group = LocalWorkerGroup(workers)
    g.weight_synchronizer = None  # read by main's shutdown() (from __del__)
    return g


@pytest.fixture()
def setup(gen_cfg, monkeypatch, no_nvtx):
    workers = [make_worker(gen_cfg, monkeypatch) for _ in range(ENGINES)]
    return make_generation(gen_cfg, workers), workers


def test_worker_output_has_nemo_rl_s_shape_and_problem_ids_reach_sampling_params(setup):
    _, workers = setup
    w = workers[0]
    data, rows = grpo_batch(prompts=2, group=2)
    out = w.generate(data)
    width = data["input_ids"].shape[1]
    for i, r in enumerate(rows):
        resp = StubLLM.response(r)
        n, g = len(r), int(out["generation_lengths"][i])
        assert g == len(resp) and int(out["unpadded_sequence_lengths"][i]) == n + g
        assert out["output_ids"][i, :n].tolist() == r and out["output_ids"][i, n:n + g].tolist() == resp
        assert set(out["output_ids"][i, n + g:].tolist()) <= {PAD}
        assert out["output_ids"].shape[1] >= width
        assert out["logprobs"][i, n:n + g].tolist() == [-0.25] * g
    (prompts, sps), = w.llm.calls
    assert [sp.extra_args["problem_id"] for sp in sps] == payload.problem_ids(data["input_ids"], data["input_lengths"])
    assert len({sp.extra_args["problem_id"] for sp in sps}) == 2


def test_generate_places_groups_across_engines_and_restores_input_order(setup, gen_cfg):
    from nemo_rl.models.generation.vllm.vllm_generation import VllmGeneration

    g, workers = setup
    data, rows = grpo_batch()
    pids = payload.problem_ids(data["input_ids"], data["input_lengths"])
    ours = g.generate(data)
    # NeMo-RL's own contiguous path on the same engines gives the reference, row for row
    ref_g = make_generation(gen_cfg, workers)
    ref = VllmGeneration.generate(ref_g, grpo_batch()[0])
    for key in ("generation_lengths", "unpadded_sequence_lengths"):
        assert ours[key].tolist() == ref[key].tolist(), key
    w = min(ours["output_ids"].shape[1], ref["output_ids"].shape[1])
    assert ours["output_ids"][:, :w].tolist() == ref["output_ids"][:, :w].tolist()
    assert set(ours["output_ids"][:, w:].flatten().tolist()) <= {PAD}
    # placement spread the GRPO groups: shards were not NeMo-RL's contiguous cut
    sent = g.worker_group.sent[0]
    per_engine = [set(payload.problem_ids(s["input_ids"], s["input_lengths"])) for s in sent]
    spread = sum(1 for pid in set(pids) if sum(pid in e for e in per_engine) > 1)
    assert spread > 0, per_engine
    # every request carried its problem id (and, budget=length_aware, its budget) into SamplingParams
    seen = [sp.extra_args for wk in workers for _, sps in wk.llm.calls[:1] for sp in sps]
    assert sorted(e["problem_id"] for e in seen) == sorted(pids)
    assert all("specdec_budget" in e for e in seen)
    assert g._specdec_placement_stats["predicted_imbalance"] >= 0


def test_fewer_requests_than_engines_still_marks_and_returns_in_order(setup):
    g, workers = setup
    data, rows = grpo_batch(prompts=1, group=1)
    out = g.generate(data)
    assert out["output_ids"][0, :len(rows[0])].tolist() == rows[0]
    assert bool(data[payload.NO_RECORD_KEY].any()) is False


def _step_rollouts(workers) -> RolloutBatch:
    """The whole step's rollouts, as the exchange hands them to every engine (all engines' stashes)."""
    return RolloutBatch.concat([w._specdec_stash.drain() for w in workers])


def test_rollouts_from_the_real_batches_rebuild_the_real_das_store_over_three_refits(setup, gen_cfg):
    from nemo_rl_specdec.drafters.suffix import DASProposer

    g, workers = setup
    spec = translate.enabled_spec(gen_cfg)
    proposer = DASProposer(SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=spec.num_speculative_tokens),
        model_config=SimpleNamespace(max_model_len=4096)))
    proposer.specdec_attach(None, translate.engine_init_payload(gen_cfg))
    for step in range(3):
        data, rows = grpo_batch(seed=step)
        g.generate(data)
        batch = _step_rollouts(workers)
        assert len(batch) == PROMPTS * GROUP
        recs = list(batch)
        for r in recs:
            assert r.policy_version == step  # workers' version before this step's refit
        by_pid = {}
        for r in recs:
            by_pid.setdefault(r.problem_id, []).append(r)
        assert {pid for pid in by_pid} == {problem_id(r) for r in rows}
        for r in recs:
            full = next(row for row in rows if problem_id(row) == r.problem_id)
            assert r.token_ids.tolist() == StubLLM.response(full)
            assert r.prompt_token_ids.tolist() == full[-len(r.prompt_token_ids):]
        added = proposer.specdec_rebuild(recs, step + 1)
        assert added == PROMPTS * GROUP
        for w in workers:
            # what a successful refit to step + 1 records: the store rebuilt from this step's rollouts
            w._specdec_lockstep = LockstepState(policy_version=step + 1, drafter_version=step + 1,
                                                drafter_built_from=step + 1)
        # the per-problem tree holds every sibling of every problem of this step
        for pid in by_pid:
            assert len(proposer.store.entries(problem_id=pid, version=step)) == GROUP
    assert proposer.store.stats()["versions"] == [0, 1, 2]


def test_validation_rollouts_never_reach_the_stash(setup):
    from nemo_rl_specdec.adapter.generation import validating

    g, workers = setup
    with validating(g):
        data, _ = grpo_batch(seed=7)
        g.generate(data)
    assert bool(data[payload.NO_RECORD_KEY].all())
    assert all(len(w._specdec_stash) == 0 for w in workers)
    assert sum(w._specdec_skipped_validation for w in workers) == PROMPTS * GROUP
    data, _ = grpo_batch(seed=8)
    g.generate(data)
    assert sum(len(w._specdec_stash) for w in workers) == PROMPTS * GROUP


def test_rollouts_travel_by_reference_through_ray(setup, ray_local):
    g, workers = setup
    data, rows = grpo_batch(seed=3)
    g.generate(data)
    refs = [ray_local.put(w._specdec_stash.drain()) for w in workers]
    staged = payload.stage_payload(1, refs)
    batch = payload.resolve_staged(staged).rollouts
    assert len(batch) == PROMPTS * GROUP
    assert sorted(r.problem_id for r in batch) == sorted(problem_id(r) for r in rows)


def test_sharding_restore_with_real_select_indices_and_from_batches(nemo_rl_src):
    """Planner's assignment/restore applied with NeMo-RL's own select_indices and from_batches (padding
    by its pad_value_dict) gives back the input order, for several placements."""
    import torch
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    from nemo_rl_specdec.adapter import sharding

    data, rows = grpo_batch()
    pids = payload.problem_ids(data["input_ids"], data["input_lengths"])
    for policy in ("length_aware", "round_robin", "contiguous"):
        planner = sharding.planner_for(None, max_new_tokens=64, placement=policy)
        planner.observe(pids, [float(len(StubLLM.response(r))) for r in rows])
        plan = sharding.shard(planner, pids, 3)
        if plan is None:
            assert policy == "contiguous"
            continue
        shards = [data.select_indices(ix) for ix in plan.assignment]
        # engines return different widths, as real shards do
        outs = []
        for k, s in enumerate(shards):
            w = s["input_ids"].shape[1] + 2 + k
            o = torch.full((len(s["input_ids"]), w), PAD, dtype=torch.long)
            o[:, :s["input_ids"].shape[1]] = s["input_ids"]
            outs.append(BatchedDataDict({"output_ids": o, "input_lengths": s["input_lengths"]}))
        combined = BatchedDataDict.from_batches(outs, pad_value_dict={"output_ids": PAD}).select_indices(plan.restore)
        assert combined["input_lengths"].tolist() == data["input_lengths"].tolist(), policy
        for i, r in enumerate(rows):
            assert combined["output_ids"][i, :len(r)].tolist() == r, (policy, i)
