"""Online drafter distillation in a NeMo-RL-shaped loop: policy workers distil, the driver publishes,
engines built by NeMo-RL's real vLLM worker apply the drafter in the refit that carries the policy.

Per drafter (draft_model, eagle3), STEPS policy steps on the bundled task, greedy:
- two engines built by NeMo-RL's real `VllmGenerationWorkerImpl` with our actor and extension
  (test_live_refit.py; its CPU stand-ins apply): online (`refresh.mode: online`) and frozen. (No
  no-speculation engine here: vLLM mixes the worker extension into its CPUWorker class for the whole
  process, so an engine with NeMo-RL's plain extension cannot start beside ours; exactness against
  no speculation is tested on the CPU engine, tests/engine/test_online_*.py);
- two policy worker ranks, Ray actors: our `SpecDecDistillMixin` over a stand-in for NeMo-RL's
  DTensor policy worker (that one needs CUDA; test_contract.py checks its `train` contract). The
  stand-in's `train` is the policy step: every rank moves its replica of the HF policy by the same
  seeded drift. Like NeMo-RL's FSDP policy (`MixedPrecisionPolicy(param_dtype=bfloat16)`), it stores
  fp32 parameters and computes every forward in bf16, so the distiller's teacher is a bf16 model.
  The ranks form a gloo group, so the drafter replicas sync as in FSDP;
- the driver is our `wrap_policy` over a stand-in `Policy` whose `train` shards the batch over the
  ranks as NeMo-RL's does, and the drafter board is the real named Ray actor.
Each step: generate with the online engine (NeMo-RL's `generate`), build NeMo-RL's training batch
from the output, `Policy.train` (step + distillation + publication), then every engine refits the
new policy through NeMo-RL's collective refit; the online engine's worker actor stages the
published drafter into that refit.
"""
from __future__ import annotations

import math
import sys

import pytest
from test_live_refit import _on_engine, _refit, _worker, cpu_host  # noqa: F401  (cpu_host: fixture)

from nemo_rl_specdec.resources import asset_path

pytestmark = pytest.mark.nemo_rl

STEPS = 5
DRIFT = 0.8 / math.sqrt(STEPS)  # per step; seeded noise adds up to the drift test_online_refresh.py uses at once
MAX_NEW = 96
TRAIN, HELD = 24, 16
BLOCKS = {
    "draft_model": {"drafter": "draft_model", "num_speculative_tokens": 4,
                    "draft_model": {"model": str(asset_path("tiny", "draft"))}},
    "eagle3": {"drafter": "eagle3", "num_speculative_tokens": 3,
               "eagle3": {"model": str(asset_path("tiny", "eagle3"))}},
}
DISTILL = {"lr": 1e-3, "epochs": 3}


class StandInPolicyWorker:
    """Stand-in for NeMo-RL's DTensor policy worker (needs CUDA): the HF policy as `self.model`,
    a torch.distributed group, and `train` as the policy step (a seeded drift, the same on every rank)."""

    def __init__(self, rank: int, world: int, init: str, policy: str):
        import torch
        import torch.distributed as dist
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
        self.model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
        self.model.register_forward_pre_hook(self._compute_in_bf16)
        self.model.register_forward_hook(self._store_in_fp32)
        self._fp32: dict = {}
        self.steps = 0

    def _compute_in_bf16(self, module, args):
        import torch

        for p in module.parameters():
            self._fp32[p] = p.data
            p.data = p.data.to(torch.bfloat16)

    def _store_in_fp32(self, module, args, out):
        for p, data in self._fp32.items():
            p.data = data
        self._fp32.clear()

    def train(self, data, loss_fn, eval_mode=False, gbs=None, mbs=None, check_dim_skip_keys=None):
        import torch

        self.steps += 1
        g = torch.Generator().manual_seed(1000 + self.steps)
        with torch.no_grad():
            for p in self.model.parameters():
                if p.dim() > 1:
                    p.add_(torch.randn(p.shape, generator=g) * p.std() * DRIFT)
        return {"global_loss": torch.tensor(0.0), "grad_norm": torch.tensor(0.0), "all_mb_metrics": {}}

    def policy_state(self) -> dict:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}


class _WorkerGroup:
    def __init__(self, workers):
        self.workers = workers

    def run_all_workers_single_data(self, method, **kwargs):
        return [getattr(w, method).remote(**kwargs) for w in self.workers]


class StandInPolicy:
    """Stand-in for NeMo-RL's driver-side `Policy`: `train` shards the batch over the data-parallel ranks."""

    def __init__(self, workers):
        self.worker_group = _WorkerGroup(workers)

    def train(self, data, loss_fn=None, eval_mode=False):
        import ray

        n = len(self.worker_group.workers)
        shards = [{k: v[i::n] for k, v in data.items()} for i in range(n)]
        return ray.get([w.train.remote(s, loss_fn, eval_mode)
                        for w, s in zip(self.worker_group.workers, shards, strict=True)])


def _train_batch(out) -> dict:
    """NeMo-RL's training batch from a generation output: prompt then generated tokens per row,
    right-padded, `token_mask` on the generated ones."""
    import torch

    lengths = out["unpadded_sequence_lengths"]
    gen = out["generation_lengths"]
    width = int(lengths.max())
    ids = torch.zeros((len(lengths), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (n, g) in enumerate(zip(lengths.tolist(), gen.tolist(), strict=True)):
        ids[i, :n] = out["output_ids"][i, :n]
        mask[i, n - g: n] = 1
    return {"input_ids": ids, "input_lengths": lengths.clone(), "token_mask": mask}


def _batch(problems, tok):
    import torch
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

    from nemo_rl_specdec.demo.task import prompt_token_ids

    rows = [prompt_token_ids(tok, p) for p in problems]
    ids = torch.zeros((len(rows), max(map(len, rows))), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
    return BatchedDataDict({"input_ids": ids, "input_lengths": torch.tensor([len(r) for r in rows])})


def _generate(w, batch) -> tuple:
    """NeMo-RL's generate; returns (output, (drafts, accepted) of this call) from the engine's own counters."""
    from nemo_rl_specdec.metrics import engine_counters

    before = engine_counters(w.llm) or {}
    out = w.generate(batch, greedy=True)
    after = engine_counters(w.llm) or {}
    return out, tuple(after.get(k, 0) - before.get(k, 0) for k in ("drafts", "draft_tokens", "accepted_tokens"))


@pytest.fixture(scope="module", params=sorted(BLOCKS))
def loop(request, cpu_host, tmp_path_factory):  # noqa: F811
    import ray
    from ray import cloudpickle
    from test_live_refit import POLICY
    from transformers import AutoTokenizer

    from nemo_rl_specdec.adapter.exchange import drafter_board
    from nemo_rl_specdec.adapter.policy_workers import SpecDecDistillMixin, wrap_policy
    from nemo_rl_specdec.config.run import SpecDecConfig
    from nemo_rl_specdec.demo.task import make_problems

    drafter = request.param
    block = {**BLOCKS[drafter], "refresh": {"mode": "online", "distill": DISTILL}}
    frozen_block = {**BLOCKS[drafter], "refresh": {"mode": "frozen"}}
    engines = {"online": _worker(block, None, temperature=0.0, max_new_tokens=MAX_NEW),
               "frozen": _worker(frozen_block, None, temperature=0.0, max_new_tokens=MAX_NEW)}
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import this test module
    actor = ray.remote(num_cpus=0)(type("PolicyWorker", (SpecDecDistillMixin, StandInPolicyWorker), {}))
    init = f"file://{tmp_path_factory.mktemp('pg')}/pg"
    workers = [actor.remote(r, 2, init, str(POLICY)) for r in range(2)]
    policy_cls = type("Policy", (StandInPolicy,), {})
    spec = SpecDecConfig.model_validate({"enabled": True, **block})
    for name, fn in wrap_policy(policy_cls, spec, temperature=0.0).items():
        setattr(policy_cls, name, fn)
    try:
        policy = policy_cls(workers)
        tok = AutoTokenizer.from_pretrained(str(POLICY))
        train, held = make_problems(TRAIN, seed=5), make_problems(HELD, seed=77)
        feed, reports = cpu_host, []
        # NeMo-RL's first refit comes before any policy step: it carries drafter 0, the checkpoint
        first = ray.get(workers[0].policy_state.remote())
        for name in ("online", "frozen"):
            assert _refit(engines[name], feed, first)
        initial = engines["online"].specdec_report()
        for _step in range(1, STEPS + 1):
            out, _ = _generate(engines["online"], _batch(train, tok))
            policy.train(_train_batch(out))
            sd = ray.get(workers[0].policy_state.remote())
            for name in ("online", "frozen"):
                assert _refit(engines[name], feed, sd)
            reports.append(engines["online"].specdec_report())
        results = {name: _generate(w, _batch(held, tok)) for name, w in engines.items()}
        yield {"drafter": drafter, "reports": reports, "initial": initial, "results": results, "engines": engines,
               "board": drafter_board(), "workers": workers}
    finally:
        for w in workers:
            ray.kill(w)
        ray.kill(drafter_board())
        for w in engines.values():
            w.shutdown()


def test_every_refit_carries_the_drafter_distilled_after_that_policy_step(loop):
    first = loop["initial"]  # refit 1, before any policy step: drafter 0, verified, no tensors sent
    assert first["state"]["policy_version"] == 1 and first["state"]["drafter_version"] == 1
    assert first["last_update"]["drafter_refreshed"] and first["last_update"]["drafter_tensors_applied"] == 0
    assert first["distill"]["drafter_seq"] == 0
    for step, rep in enumerate(loop["reports"], start=1):
        state, last = rep["state"], rep["last_update"]
        assert state["policy_version"] == step + 1 and state["drafter_version"] == step + 1, rep
        assert last["drafter_refreshed"] and last["drafter_tensors_applied"] > 0
        assert rep["distill"]["drafter_seq"] == step and rep["distill"]["policy_step"] == step
        assert rep["distill"]["drafter_train_s"] > 0 and rep["distill"]["kl_last"] < rep["distill"]["kl_first"]
    share = [rep["distill"].get("drafter_train_share") for rep in loop["reports"]]
    print(f"\n{loop['drafter']}: drafter_train_s per step "
          f"{[round(rep['distill']['drafter_train_s'], 2) for rep in loop['reports']]}, share of the step period "
          f"{[None if x is None else round(x, 3) for x in share]}")
    # the first step has no period yet; the share itself is a wall-clock ratio of this machine (under load
    # a distillation can outlast the step period), so only its presence is checked
    assert share[0] is None and all(x is not None and x > 0 for x in share[1:])


def test_online_beats_frozen_by_010_with_identical_greedy_outputs(loop):
    """Two different drafters accepted at different rates, the same tokens: the policy's greedy outputs."""
    res = loop["results"]
    assert res["online"][0]["output_ids"].tolist() == res["frozen"][0]["output_ids"].tolist()
    rate = {name: res[name][1][2] / res[name][1][1] for name in ("online", "frozen")}
    print(f"\n{loop['drafter']}: acceptance rate after {STEPS} NeMo-RL-shaped steps: online {rate['online']:.3f}, "
          f"frozen {rate['frozen']:.3f}")
    assert res["online"][1][0] > 50 and res["frozen"][1][0] > 50
    assert rate["online"] >= rate["frozen"] + 0.10, rate


def test_a_checkpoint_claim_is_refused_once_the_drafter_was_distilled(loop):
    """Drafter 0 travels as a claim, checked against the drafter the engine loaded: after distilled
    drafters have been applied, the same claim is refused (this runs last: it leaves the engine failed)."""
    from nemo_rl_specdec.lockstep import DrafterRefreshError

    def claim(vllm_worker):
        from nemo_rl_specdec.update import PolicyUpdate

        try:
            vllm_worker.specdec_after_policy_weights(PolicyUpdate(version=99, drafter_checkpoint=True), loaded_names=[])
        except DrafterRefreshError as e:
            return str(e)
        return None

    assert "no longer holds the checkpoint's weights" in (_on_engine(loop["engines"]["online"], claim) or "")
