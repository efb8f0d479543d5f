"""The CPU demo's per-step TensorBoard scalars and plots: acceptance length and
rate, acceptance per draft position, policy age, drafter version, refresh time, drafts."""
from __future__ import annotations

import math

import pytest

from nemo_rl_specdec.demo.plots import plot_run
from nemo_rl_specdec.demo.run import tensorboard_scalars

PNG = b"\x89PNG\r\n\x1a\n"


def _row(step, per_pos, refresh_s=0.25, **kw):
    return {"step": step, "mode": "sync", "drafter": "eagle3", "policy_version": step, "drafter_version": step,
            "policy_age": 0, "acceptance_length": 2.5, "acceptance_rate": 0.5, "accepted_per_position": per_pos,
            "drafts": 40, "refresh_s": refresh_s, "drafter_refreshed": True, "rollout_policy_versions": [step],
            "rollout_s": 1.0, "rollout_s_baseline": 2.0, "reward_mean": 0.5, "reward_mean_baseline": 0.5, **kw}


def test_tensorboard_scalars_name_every_step_metric_and_each_draft_position():
    got = tensorboard_scalars(_row(3, [0.75, 0.5, 0.125], distill_s=1.5))
    assert got["specdec/acceptance_rate_by_position/1"] == 0.75
    assert got["specdec/acceptance_rate_by_position/2"] == 0.5
    assert got["specdec/acceptance_rate_by_position/3"] == 0.125
    assert "specdec/acceptance_rate_by_position/4" not in got and "specdec/acceptance_rate_by_position/0" not in got
    assert (got["specdec/acceptance_length"], got["specdec/acceptance_rate"]) == (2.5, 0.5)
    assert (got["specdec/drafts"], got["specdec/drafter_version"], got["specdec/policy_age"]) == (40.0, 3.0, 0.0)
    assert (got["specdec/refresh_s"], got["specdec/distill_s"]) == (0.25, 1.5)
    # lists, strings, booleans and missing values are not scalars
    for key in ("specdec/accepted_per_position", "specdec/mode", "specdec/drafter_refreshed",
                "specdec/rollout_policy_versions"):
        assert key not in got
    assert "specdec/refresh_s" not in tensorboard_scalars(_row(0, [], refresh_s=None))
    assert not any("by_position" in k for k in tensorboard_scalars(_row(0, [])))


@pytest.mark.parametrize("with_distill", [False, True])
def test_plot_run_writes_the_per_position_version_and_refresh_figures(tmp_path, with_distill):
    extra = {"distill_s": 0.5} if with_distill else {}
    # step 1 made no drafts (empty per-position list) and step 2 drafted only 2 positions: gaps, not errors
    rows = [_row(0, [0.8, 0.6, 0.3], **extra), _row(1, [], refresh_s=None, **extra), _row(2, [0.9, 0.7], **extra)]
    files = plot_run(rows, tmp_path)
    names = [p.rsplit("/", 1)[-1] for p in files]
    assert names == ["acceptance_vs_step.png", "acceptance_vs_policy_age.png", "acceptance_by_position.png",
                     "versions.png", "refresh_time.png", "rollout_time.png", "reward.png"]
    for name in names:
        assert (tmp_path / name).read_bytes()[:8] == PNG, name


def test_figures_draw_one_line_per_position_and_only_the_refresh_times_present():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from nemo_rl_specdec.demo import plots

    rows = [_row(0, [0.8, 0.6, 0.3]), _row(1, [], refresh_s=None), _row(2, [0.9, 0.7])]
    fig, ax = plt.subplots()
    plots._acceptance_by_position(ax, rows, "eagle3")
    ys = [list(line.get_ydata()) for line in ax.get_lines()]
    assert [line.get_label() for line in ax.get_lines()] == ["position 1", "position 2", "position 3"]
    assert ys[0][0] == 0.8 and math.isnan(ys[0][1]) and ys[0][2] == 0.9
    assert ys[2][0] == 0.3 and math.isnan(ys[2][1]) and math.isnan(ys[2][2])
    ax.clear()
    plots._refresh_time(ax, rows, "eagle3")
    (line,) = ax.get_lines()  # no distill_s in these rows: refresh only
    assert line.get_ydata()[0] == 0.25 and math.isnan(line.get_ydata()[1])
    ax.clear()
    plots._refresh_time(ax, [_row(0, [], distill_s=2.0)], "eagle3")
    assert [ln.get_ydata()[0] for ln in ax.get_lines()] == [0.25, 2.0]
    plt.close(fig)
