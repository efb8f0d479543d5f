"""The simulator's hybrid drafter: hybrid_choice.choose per event over a history half read from a
bench result and the scenario's model half."""
from __future__ import annotations

import json

import pytest
from sim_scenarios import SMALL, build

from nemo_rl_specdec.config.run import ConfigError
from nemo_rl_specdec.sim.report import simulate


def _bench(tmp_path, coverage, curve, name="das_all"):
    path = tmp_path / f"hybrid_{coverage}.json"
    path.write_text(json.dumps({"suite": "hybrid", "results": [
        {"name": name, "coverage": coverage, "accepted_per_position": curve}]}))
    return str(path)


def scenario(**overrides):
    """The small scenario with an Eagle3 model half (the hybrid's, when `hybrid` is given)."""
    model_half = {"drafter": {"name": "eagle3", "fwd_base_s": 1e-3}, "acceptance": {"alpha": 0.6},
                  "rl.num_steps": 2}
    return build(SMALL, {**model_half, **overrides})


def test_a_history_half_that_always_drafts_right_skips_the_model_forwards(tmp_path):
    eagle = simulate(scenario())
    hybrid = simulate(scenario(hybrid={"bench_json": _bench(tmp_path, 1.0, [1.0] * 4), "per_request_s": 1e-6}))
    assert hybrid["hybrid_model_forward_share"] < 0.05
    assert hybrid["hybrid_share_by_source"]["history"] > 0.95
    assert hybrid["rollout_s_spec"] < eagle["rollout_s_spec"]
    assert hybrid["mean_accepted_length"] > eagle["mean_accepted_length"]


def test_a_history_half_that_never_matches_leaves_the_model_half_to_draft(tmp_path):
    hybrid = simulate(scenario(hybrid={"bench_json": _bench(tmp_path, 0.05, [0.1, 0.0, 0.0, 0.0])}))
    assert hybrid["hybrid_model_forward_share"] > 0.95
    assert hybrid["hybrid_share_by_source"]["model"] > 0.9
    assert hybrid["rollout_speedup"] > 1.0


def test_the_history_proposers_host_time_is_paid_on_every_step(tmp_path):
    path = _bench(tmp_path, 0.5, [0.9, 0.8, 0.7, 0.6])
    cheap = simulate(scenario(hybrid={"bench_json": path}))
    dear = simulate(scenario(hybrid={"bench_json": path, "step_overhead_s": 5e-3}))
    assert dear["rollout_s_spec"] > cheap["rollout_s_spec"]
    assert dear["rollout_s_baseline"] == cheap["rollout_s_baseline"]


def test_a_hybrid_that_cannot_be_built_is_refused_naming_the_key(tmp_path):
    good = _bench(tmp_path, 0.5, [0.9, 0.8])
    with pytest.raises(ConfigError, match="drafter.name"):
        scenario(drafter={"name": "suffix"}, hybrid={"bench_json": good})
    with pytest.raises(ConfigError, match="hybrid.model_k"):
        scenario(hybrid={"bench_json": good, "model_k": 6})
    with pytest.raises(ConfigError, match="hybrid.bench_json"):
        scenario(hybrid={"bench_json": str(tmp_path / "missing.json")})
    with pytest.raises(ConfigError, match="hybrid.bench_json"):
        scenario(hybrid={"bench_json": good, "bench_result": "das"})
    with pytest.raises(ConfigError, match="hybrid.coverage"):
        scenario(hybrid={"bench_json": good, "coverage": 0.3})


def test_requests_with_their_own_acceptance_each_get_their_choice(tmp_path):
    """acceptance.spread: every request its own model-half curve (the choice over all of them)."""
    path = _bench(tmp_path, 0.5, [0.9, 0.8, 0.7, 0.6])
    alike = simulate(scenario(hybrid={"bench_json": path}))
    spread = simulate(scenario(**{"acceptance.spread": 0.1}, hybrid={"bench_json": path}))
    assert sum(spread["hybrid_share_by_source"].values()) == pytest.approx(1.0)
    assert spread["rollout_speedup"] == pytest.approx(alike["rollout_speedup"], rel=0.1)


def test_a_step_that_skips_the_model_half_still_pays_its_first_forward(tmp_path):
    """The engine runs the model half's first forward at every step (it writes the head's KV of the
    verified tokens): where the rule skips the model half at every step, each step's time grows by
    exactly one forward's cost as that cost grows."""
    path = _bench(tmp_path, 1.0, [1.0] * 4)
    runs = {}
    for fwd in (1e-3, 2e-3):
        runs[fwd] = simulate(scenario(drafter={"name": "eagle3", "fwd_base_s": fwd}, **{"cluster.num_engines": 1},
                                      hybrid={"bench_json": path, "per_request_s": 1e-6}))
        assert runs[fwd]["hybrid_model_forward_share"] == 0   # the history half drafts right: never worth the rest
    cheap, dear = runs[1e-3], runs[2e-3]
    assert dear["target_steps_spec"] == cheap["target_steps_spec"]
    per_rl_step = cheap["target_steps_spec"] / 2   # rl.num_steps; rollout_s is one RL step's rollout
    assert dear["rollout_s_spec"] - cheap["rollout_s_spec"] == pytest.approx(1e-3 * per_rl_step, rel=1e-6)
    assert dear["rollout_s_baseline"] == cheap["rollout_s_baseline"]
