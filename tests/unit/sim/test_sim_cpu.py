"""The CPU cross-check pieces: the costmodel bench suite's contract, the step fit of
sim/cpu_fit.py, the per-request term of the linear cost form, and adaptive verification per
step (sim/best_drafts.py). No engine is started and no wall-clock time is asserted."""
from __future__ import annotations

import numpy as np
import pytest
from sim_scenarios import build

from nemo_rl_specdec.cost.model import CostModel
from nemo_rl_specdec.sim.best_drafts import best_drafts
from nemo_rl_specdec.sim.report import simulate
from nemo_rl_specdec.sim.scenario import ScenarioError


def _samples(rng, n_steps, drafter_cost=None, draft_per_req=0.0):
    """Synthetic costmodel steps from known constants (c_base 5 ms, c_seq 100 us, c_tok 50 us,
    c_ctx 20 ns), with 1% multiplicative noise."""
    out = []
    for _ in range(n_steps):
        n = int(rng.integers(1, 65))
        d = int(rng.integers(0, 8 * n + 1)) if draft_per_req else 0
        ctx = int(n * rng.integers(30, 500))
        t = 5e-3 + 1e-4 * n + 5e-5 * (n + d) + 2e-8 * ctx
        if drafter_cost:
            t += drafter_cost[0] + drafter_cost[1] * n
        out.append({"requests": n, "prefill_tokens": 0, "draft_tokens": d, "drafting": n if d else 0,
                    "accepted": d // 2, "ctx_sum": ctx, "seconds": t * (1 + 0.01 * rng.standard_normal())})
    out.insert(0, {"requests": 64, "prefill_tokens": 2048, "draft_tokens": 0, "drafting": 0, "accepted": 0,
                   "ctx_sum": 2048, "seconds": 1.0})   # a prefill step: left out of the fit
    return out


def test_fit_steps_recovers_target_and_drafter_constants():
    from nemo_rl_specdec.sim.cpu_fit import fit_steps, inputs

    rng = np.random.default_rng(0)
    results = [{"name": "no-spec", "drafter": None, "k": 0, "lengths": [40] * 64, "samples": _samples(rng, 300)},
               {"name": "ngram", "drafter": "ngram", "k": 8, "coverage": 0.4, "accepted_per_position": [0.2, 0.1],
                "lengths": [40] * 64, "samples": _samples(rng, 300, (8e-3, 3e-4), 0.5)}]
    fit = fit_steps(results)
    assert fit["c_base_s"] == pytest.approx(5e-3, rel=0.1)
    assert fit["c_seq_s"] == pytest.approx(1e-4, rel=0.1)
    assert fit["c_tok_s"] == pytest.approx(5e-5, rel=0.1)
    assert fit["c_ctx_s"] == pytest.approx(2e-8, rel=0.2)
    assert fit["drafters"]["ngram"]["step_overhead_s"] == pytest.approx(8e-3, rel=0.1)
    assert fit["drafters"]["ngram"]["per_request_s"] == pytest.approx(3e-4, rel=0.1)
    assert fit["steps"] == 600 and fit["r2"] > 0.99
    inp = inputs(results)
    decode = results[1]["samples"][1:]
    assert inp["prompt_len"] == 32
    assert inp["drafters"]["ngram"]["coverage"] == sum(s["drafting"] for s in decode) / sum(
        s["requests"] for s in decode
    )


def test_coverage_counts_decode_request_steps_only():
    from nemo_rl_specdec.sim.cpu_fit import coverage

    steps = [{"requests": 64, "prefill_tokens": 2048, "drafting": 0},   # prefill: no request can draft yet
             {"requests": 64, "prefill_tokens": 0, "drafting": 64},
             {"requests": 4, "prefill_tokens": 0, "drafting": 1}]
    assert coverage(steps) == 65 / 68
    assert coverage(steps[:1]) == 0.0


def test_costmodel_suite_names_its_own_required_keys():
    from nemo_rl_specdec.bench import REQUIRED, SUITES, costmodel

    assert SUITES["costmodel"] == "nemo_rl_specdec.bench.costmodel"
    assert "samples" in costmodel.REQUIRED and "wall_clock_ratio" not in costmodel.REQUIRED
    assert "wall_clock_ratio" in REQUIRED


LINEAR = {
    "hardware": {"c_base_s": 5e-3, "c_tok_s": 5e-5, "c_seq_s": 2e-4, "max_num_seqs": 64},
    "drafter": {"name": "suffix", "per_request_s": 1e-4},
    "acceptance": {"alpha": 0.7},
    "speculation": {"num_speculative_tokens": 4},
    "workload": {"num_prompts": 8, "generations_per_prompt": 4, "prompt_len": 32,
                 "lengths": {"dist": "values", "values": [100], "max_len": 100}, "prediction": "none"},
    "rl": {"num_steps": 2},
}


def test_linear_per_request_cost():
    sc = build(LINEAR, {})
    cm = CostModel.from_scenario(sc)
    t0 = cm.mean_step_time(10, 0, 100)
    assert t0 == pytest.approx(5e-3 + 2e-4 * 10 + 5e-5 * 10)
    assert cm.mean_step_time(20, 0, 100) - t0 == pytest.approx(10 * (2e-4 + 5e-5))
    with pytest.raises(ScenarioError, match="hardware"):
        build(LINEAR, {"hardware.roofline": {"mem_bw_Bps": 1e12, "flops_per_s": 1e14}})


def test_adaptive_drafts_full_k_when_verification_is_cheap_and_none_when_it_is_dear():
    ctx = np.full(16, 200.0)
    A = np.tile(1 + np.cumsum([0.0] + [0.6 ** j for j in range(1, 5)]), (16, 1))   # A(d), d = 0..4
    cheap = CostModel(c_base=5e-3, c_tok=1e-6, draft_kind="list")
    dear = CostModel(c_base=1e-4, c_tok=1e-3, draft_kind="list")
    assert best_drafts(cheap, ctx, A, 4) == 4
    assert best_drafts(dear, ctx, A, 4) == 0
    mid = CostModel(c_base=5e-3, c_tok=2e-4, draft_kind="list")
    assert 0 < best_drafts(mid, ctx, A, 4) < 4      # the marginal draft is not worth its tokens


def test_per_step_adaptive_is_never_slower_than_fixed_k_when_verification_is_dear():
    dear = {"hardware.c_tok_s": 2e-3, "hardware.c_seq_s": 0.0}
    fixed = simulate(build(LINEAR, dear))
    adaptive = simulate(build(LINEAR, {**dear, "speculation.scheduling.k": "per_step"}))
    assert fixed["rollout_speedup"] < 1.0            # k = 4 on every step loses here
    assert adaptive["rollout_speedup"] >= 0.999      # per step it turns drafting off where it loses
    assert adaptive["rollout_speedup"] > fixed["rollout_speedup"]


def test_adaptive_budget_never_slower_where_fixed_k_loses_and_keeps_drafts_where_they_pay():
    """budget: adaptive is the engine's per-request rule (drafters/machinery/step_judge.py) run in the simulator."""
    dear = {"hardware.c_tok_s": 2e-3, "hardware.c_seq_s": 0.0}
    fixed = simulate(build(LINEAR, dear))
    adaptive = simulate(build(LINEAR, {**dear, "speculation.scheduling.budget": "adaptive"}))
    assert fixed["rollout_speedup"] < 1.0
    assert adaptive["rollout_speedup"] >= 0.999 and adaptive["rollout_speedup"] > fixed["rollout_speedup"]
    cheap_fixed = simulate(build(LINEAR, {}))
    cheap = simulate(build(LINEAR, {"speculation.scheduling.budget": "adaptive"}))
    assert cheap_fixed["rollout_speedup"] > 1.2
    assert cheap["rollout_speedup"] >= 0.98 * cheap_fixed["rollout_speedup"]


def test_adaptive_budget_refuses_a_model_drafter():
    with pytest.raises(ScenarioError, match="speculation.scheduling.budget"):
        build(LINEAR, {"drafter": {"name": "eagle3"}, "speculation.scheduling.budget": "adaptive"})


def test_auto_disable_turns_losing_batches_off_and_leaves_paying_ones_alone():
    """speculation.auto_disable is the engines' all-or-nothing rule (drafters/machinery/step_judge.drafts_pay)
    per event: where fixed k loses it stays near no speculation, with every large batch off;
    where drafts pay it changes nothing."""
    dear = {"hardware.c_tok_s": 2e-3, "hardware.c_seq_s": 0.0}
    fixed = simulate(build(LINEAR, dear))
    guarded = simulate(build(LINEAR, {**dear, "speculation.auto_disable": True}))
    assert fixed["rollout_speedup"] < 1.0
    assert guarded["rollout_speedup"] >= 0.999 and guarded["rollout_speedup"] > fixed["rollout_speedup"]
    off = guarded["auto_disable_off_share_by_batch"]
    assert off["17-32"] == 1.0  # 32 requests: verification is dear, speculation off on every step
    cheap_fixed = simulate(build(LINEAR, {}))
    cheap = simulate(build(LINEAR, {"speculation.auto_disable": True}))
    assert cheap["rollout_speedup"] == pytest.approx(cheap_fixed["rollout_speedup"])
    assert set(cheap["auto_disable_off_share_by_batch"].values()) == {0.0}
    assert "auto_disable_off_share_by_batch" not in cheap_fixed


def test_auto_disable_is_refused_for_model_drafters_and_under_the_adaptive_budget():
    with pytest.raises(ScenarioError, match="speculation.auto_disable"):
        build(LINEAR, {"drafter": {"name": "eagle3"}, "speculation.auto_disable": True})
    with pytest.raises(ScenarioError, match="auto_disable"):
        build(LINEAR, {"speculation.scheduling.budget": "adaptive", "speculation.auto_disable": True})


def test_measured_cpu_profile_loads_and_simulates():
    from nemo_rl_specdec.sim.cpu_fit import SCENARIO
    from nemo_rl_specdec.sim.scenario import load_scenario

    res = simulate(load_scenario(SCENARIO))
    assert res["cost_model"]["form"] == "linear" and res["cost_model"]["c_seq_s"] > 0
    assert np.isfinite(res["rollout_speedup"])


def _costmodel_json(path, rng, base_s):
    """A costmodel result file: no-spec and suffix (DAS) steps with a fixed cost of `base_s`."""
    import json

    def steps(drafter_cost=None, draft=0.0):
        return [{**s, "seconds": s["seconds"] + base_s - 5e-3} for s in _samples(rng, 200, drafter_cost, draft)]

    lengths = [int(x) for x in rng.integers(20, 120, 64)]
    results = [{"name": "no-spec", "drafter": None, "k": 0, "lengths": lengths, "samples": steps()},
               {"name": "suffix (DAS)", "drafter": "suffix", "k": 8, "coverage": 0.8, "lengths": lengths,
                "accepted_per_position": [0.7, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05, 0.02],
                "samples": steps((1e-3, 2e-4), 0.6)}]
    path.write_text(json.dumps({"suite": "costmodel", "results": results}))
    return path


def test_pinned_run_makes_the_scheduling_predictions(tmp_path, capsys):
    """`--pinned`: the scheduling rows come from the pinned run's fit, the drafters rows from the
    first run's; the profile is written into the output directory."""
    import json

    from nemo_rl_specdec.sim.cpu_fit import main

    rng = np.random.default_rng(1)
    free = _costmodel_json(tmp_path / "free.json", rng, 5e-3)
    pinned = _costmodel_json(tmp_path / "pinned.json", rng, 20e-3)
    assert main([str(free), str(tmp_path / "a")]) == 0
    assert main([str(free), str(tmp_path / "b"), "--pinned", str(pinned)]) == 0
    a, b = (json.loads((tmp_path / d / "cpu_predictions.json").read_text()) for d in "ab")
    assert (tmp_path / "b" / "cpu_tiny_measured.yaml").is_file() and (tmp_path / "b" / "cpu_fit_pinned.json").is_file()
    assert "--pinned" in (tmp_path / "b" / "cpu_tiny_measured.yaml").read_text()
    fits = json.loads((tmp_path / "b" / "cpu_fit_pinned.json").read_text())["fit"]
    assert fits["c_base_s"] == pytest.approx(20e-3, rel=0.1)
    for pa, pb in zip(a, b, strict=True):
        assert pa["name"] == pb["name"]
        same = pa["predicted_wall_clock_ratio"] == pytest.approx(pb["predicted_wall_clock_ratio"])
        assert same if pa["suite"] == "drafters" else not same, pa["name"]
    assert main([str(free), str(tmp_path / "c"), "--pinned"]) == 2
    err = capsys.readouterr().err
    assert "COSTMODEL_JSON OUT_DIR [--pinned PINNED_COSTMODEL_JSON]" in err and "--compare" in err


def test_acceptance_by_response_position():
    """Accepted drafts scaled per response-position segment: a factor of 1 changes nothing, a tail
    that accepts less lowers the speedup, and a bad table is refused naming its key."""
    long = {"workload.lengths.values": [40, 400], "workload.lengths.max_len": 400}
    plain = simulate(build(LINEAR, long))
    same = simulate(build(LINEAR, {**long, "acceptance.by_response_position": [[0, 1.0]]}))
    tail = simulate(build(LINEAR, {**long, "acceptance.by_response_position": [[0, 1.0], [100, 0.2]]}))
    none = simulate(build(LINEAR, {**long, "acceptance.by_response_position": [[0, 0.0]]}))
    assert same["rollout_speedup"] == pytest.approx(plain["rollout_speedup"])
    assert same["target_steps_spec"] == plain["target_steps_spec"]
    assert none["mean_accepted_length"] == pytest.approx(1.0)
    assert none["rollout_speedup"] < tail["rollout_speedup"] < plain["rollout_speedup"]
    assert tail["target_steps_spec"] > plain["target_steps_spec"]
    for bad in ([[10, 1.0]], [[0, 1.0], [0, 0.5]], [[0, -1.0]], [[0]]):
        with pytest.raises(ScenarioError, match=r"acceptance\.by_response_position"):
            build(LINEAR, {"acceptance.by_response_position": bad})


def test_response_position_factors_follow_the_samples():
    from nemo_rl_specdec.sim.cpu_fit import response_position_factors

    # 64 requests accepting 6 drafts per step early on, then a tail of 2 requests accepting 1
    early = [{"requests": 64, "prefill_tokens": 0, "accepted": 6 * 64, "ctx_sum": 64 * (32 + 7 * i),
              "draft_tokens": 8 * 64, "seconds": 0.01} for i in range(6)]
    late = [{"requests": 2, "prefill_tokens": 0, "accepted": 2, "ctx_sum": 2 * (32 + 60 + 2 * i),
             "draft_tokens": 16, "seconds": 0.01} for i in range(150)]
    f = response_position_factors(early + late, prompt_len=32)
    assert f[0][0] == 0 and f[0][1] > 1 and f[-1][1] < 0.3
    assert [p for p, _ in f] == sorted(p for p, _ in f)
    req = [64] * 6 + [2] * 150
    acc = [6 * 64] * 6 + [2] * 150
    mean = sum(acc) / sum(req)
    assert f[0][1] == pytest.approx(6 / mean, rel=1e-3)
    assert response_position_factors([], 32) == [[0, 1.0]]


def test_rule_prices_a_draft_token_at_its_own_cost_not_a_new_requests_on_a_roofline():
    """On a GPU roofline at long context, a new request costs its whole context read and the first
    draft token of a step carries the fixed cost of drafting; the tokens after it are near free.
    The engines' rule (auto_disable, budget: adaptive) is priced with the step time's secant over
    the drafts it decides about, so where every draft pays it keeps them (it used to turn half the
    large-batch steps off and lose a fifth of uniform's speedup)."""
    from nemo_rl_specdec.resources import config_path
    from nemo_rl_specdec.sim.scenario import load_scenario

    def run(*over):
        return simulate(load_scenario(str(config_path("sim/das_math_r1_distill_7b.yaml")),
                                      ["rl.num_steps=2", "workload.num_prompts=32",
                                       "speculation.num_speculative_tokens=8", *over]))

    uniform = run("speculation.scheduling.budget=uniform")
    guarded = run("speculation.scheduling.budget=uniform", "speculation.auto_disable=true")
    adaptive = run("speculation.scheduling.budget=adaptive")
    assert uniform["rollout_speedup"] > 2.0
    assert set(guarded["auto_disable_off_share_by_batch"].values()) == {0.0}
    assert guarded["rollout_speedup"] == pytest.approx(uniform["rollout_speedup"])
    assert adaptive["rollout_speedup"] >= 0.98 * uniform["rollout_speedup"]
