"""metrics.py: version, acceptance-by-lag and imbalance metrics in NeMo-RL's step-metric names."""
from __future__ import annotations

import pytest
from fakes import (  # noqa: E402
    nrl_step,
)

from nemo_rl_specdec.adapter import metrics


def report(pv, dv, refresh=None, applied=None, disabled=False, engine_metrics=None, ranks_agree=True, staged=0,
           dropped=0):
    last = None if refresh is None else {"refresh_s": refresh, "drafter_tensors_applied": applied}
    state = {"policy_version": pv, "drafter_version": dv, "disabled": disabled}
    if engine_metrics:
        state["metrics"] = engine_metrics
    return {"state": state, "last_update": last, "ranks_agree": ranks_agree,
            "rollouts_staged": staged, "rollouts_dropped": dropped}


def test_version_metrics():
    out = metrics.version_metrics([
        report(5, 5, 0.2, 10, engine_metrics={"das/auto_disable_off_steps": 2.0, "note": "x"}, staged=3),
        report(5, 4, 0.5, 12, engine_metrics={"das/auto_disable_off_steps": 6.0}, staged=4, dropped=1),
    ])
    assert out == {
        "specdec/policy_version": 5.0, "specdec/drafter_version": 4.0, "specdec/drafter_lag": 1.0,
        "specdec/engines_in_lockstep": 0.0, "specdec/disabled_engines": 0.0,
        "specdec/refresh_s": 0.5, "specdec/tensors_applied": 12.0,
        "specdec/rollouts_staged": 7.0, "specdec/rollouts_dropped": 1.0,
        "specdec/engine/das/auto_disable_off_steps": 4.0,
    }
    legacy = {"state": {"policy_version": 1, "drafter_version": 1}, "last_update": {"tensors_applied": 7}}
    assert metrics.version_metrics([legacy])["specdec/tensors_applied"] == 7.0
    same = metrics.version_metrics([report(3, 3), report(3, 3)])
    assert same["specdec/engines_in_lockstep"] == 1.0 and "specdec/refresh_s" not in same
    out = metrics.version_metrics([report(3, 3), report(3, 3, ranks_agree=False)])
    assert out["specdec/engines_in_lockstep"] == 0.0
    assert metrics.version_metrics([report(3, 3, disabled=True)])["specdec/disabled_engines"] == 1.0


def test_staged_refresh_metrics_show_what_is_left_on_the_critical_path():
    def das(staged, wait=None, bg=None, stage_s=None):
        last = {"refresh_s": 0.3, "mode": "rebuild", **({"staged": True, "staged_wait_s": wait,
                                                         "staged_rebuild_s": bg} if staged else {})}
        return {"state": {"policy_version": 2, "drafter_version": 2}, "last_update": last,
                "last_stage": {} if stage_s is None else {"version": 3, "stage_s": stage_s}}

    out = metrics.version_metrics([das(True, 0.01, 2.0, 0.05), das(True, 0.02, 1.5, 0.04)])
    assert out["specdec/refresh_staged"] == 1.0 and out["specdec/staged_wait_s"] == 0.02
    assert out["specdec/staged_rebuild_s"] == 2.0 and out["specdec/stage_s"] == 0.05
    mixed = metrics.version_metrics([das(True, 0.01, 2.0), das(False)])  # one engine rebuilt inside the refit
    assert mixed["specdec/refresh_staged"] == 0.0 and "specdec/stage_s" not in mixed
    assert "specdec/refresh_staged" not in metrics.version_metrics([report(1, 1, 0.1, 3)])  # not a DAS store


def test_step_metrics_acceptance_by_lag_accumulates_with_nemo_rl_definitions():
    tracker = metrics.AcceptanceByLag()
    s1 = metrics.step_metrics(nrl_step(10, 80, 30), [report(1, 1)], tracker, {"predicted_imbalance": 1.1})
    assert s1["specdec/acceptance_length_by_lag/0"] == pytest.approx(1 + 30 / 10)
    assert s1["specdec/acceptance_rate_by_lag/0"] == pytest.approx(30 / 80)
    assert s1["specdec/no_drafts"] == 0.0 and s1["specdec/placement/predicted_imbalance"] == 1.1
    s2 = metrics.step_metrics(nrl_step(30, 240, 30), [report(2, 2)], tracker)
    assert s2["specdec/acceptance_length_by_lag/0"] == pytest.approx(1 + 60 / 40)
    s3 = metrics.step_metrics(nrl_step(10, 80, 0), [report(3, 2)], tracker)
    assert s3["specdec/acceptance_length_by_lag/1"] == pytest.approx(1.0)
    assert s3["specdec/acceptance_length_by_lag/0"] == pytest.approx(2.5)  # unchanged
    zero = metrics.step_metrics(nrl_step(0, 0, 0), [report(4, 4)], tracker)
    assert zero["specdec/no_drafts"] == 1.0
    assert metrics.no_drafts_warning(nrl_step(0, 0, 0), True) == metrics.NO_DRAFTS_HINT
    assert metrics.no_drafts_warning(nrl_step(0, 0, 0), False) is None
    assert metrics.no_drafts_warning(nrl_step(3, 3, 1), True) is None


def test_window_sums_each_engines_counter_delta():
    raw = {"vllm:generation_tokens": 40.0, "vllm:spec_decode_num_drafts": 9.0,
           "vllm:spec_decode_num_draft_tokens": 72.0, "vllm:spec_decode_num_accepted_tokens": 20.0,
           "vllm:num_requests_running": 3.0}
    end = metrics.counters_of(raw)
    assert end == {"generated_tokens": 40.0, "drafts": 9.0, "draft_tokens": 72.0, "accepted_tokens": 20.0}
    start = metrics.counters_of({"vllm:generation_tokens": 10.0})   # before any draft
    assert metrics.window([start, start], [end, start]) == {"generated_tokens": 30.0, "drafts": 9.0,
                                                             "draft_tokens": 72.0, "accepted_tokens": 20.0}
    assert metrics.window([], [end]) is None and metrics.window([start], [end, end]) is None
    idle = metrics.window([end], [end])
    assert "specdec/no_drafts" not in metrics.step_metrics(nrl_step(0, 0, 0), [], None, counted=idle)
    assert metrics.no_drafts_warning(nrl_step(0, 0, 0), True, idle) is None
    busy = metrics.window([start], [metrics.counters_of({"vllm:generation_tokens": 11.0})])
    assert metrics.step_metrics(nrl_step(0, 0, 0), [], None, counted=busy)["specdec/no_drafts"] == 1.0
    assert metrics.no_drafts_warning(nrl_step(0, 0, 0), False, busy) is None


def test_imbalance():
    assert metrics.imbalance([10, 10]) == 1.0
    assert metrics.imbalance([30, 10]) == 1.5
    assert metrics.imbalance([]) == 1.0
