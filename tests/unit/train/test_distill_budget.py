"""refresh.distill.max_transient_gb: a step's transient memory estimated at the policy's shapes
before the first step (fake tensors), and a budget it cannot meet refused naming the setting."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from nemo_rl_specdec.bench.distill import random_rollouts
from nemo_rl_specdec.drafters.eagle3 import Eagle3Distiller
from nemo_rl_specdec.resources import asset_path
from nemo_rl_specdec.train.distill import DistillInputError


@pytest.fixture(scope="module")
def policy():
    return AutoModelForCausalLM.from_pretrained(str(asset_path("tiny", "policy")), dtype=torch.float32)


def _distiller(**kw):
    return Eagle3Distiller(str(asset_path("tiny", "eagle3")), epochs=1, micro_batch_tokens=64, max_tokens=None, **kw)


def test_a_budget_the_step_cannot_meet_is_refused_before_the_first_step(policy):
    rollouts = random_rollouts([(8, 24)] * 4, policy.config.vocab_size, seed=0)
    d = _distiller(max_transient_gb=1e-6)
    before = {k: v.clone() for k, v in d.module.state_dict().items()}
    with pytest.raises(DistillInputError, match=r"refresh\.distill\.max_transient_gb: got 1e-06.*estimated at"):
        d.step(policy, rollouts)
    assert d.steps == 0 and all(torch.equal(before[k], v) for k, v in d.module.state_dict().items())


def test_a_budget_that_fits_lets_the_step_run_and_keeps_the_estimate(policy):
    rollouts = random_rollouts([(8, 24)] * 4, policy.config.vocab_size, seed=0)
    d = _distiller(max_transient_gb=10.0)
    stats = d.step(policy, rollouts)
    est = d.budget_checked
    assert stats["distill_step"] == 1 and est["transient"] > 0
    assert est["state"] == sum(p.numel() for p in d.module.parameters()) * 4 * 4
    assert est["transient"] == est["peak"] - est["teacher"] - est["state"]
    # the estimate left the real run's random stream alone: same result as without a budget
    plain = _distiller()
    assert plain.step(policy, rollouts)["kl_last"] == pytest.approx(stats["kl_last"], rel=1e-6)


def test_a_budget_must_be_positive():
    with pytest.raises(ValueError, match="refresh.distill.max_transient_gb"):
        _distiller(max_transient_gb=0)
