"""The CPU RL demo end to end for 2 steps, sync and async, into a folder a former run wrote: artifacts exist
(the former ones replaced), speculation ran,
versions advanced and the drafter was refreshed every step; the sync run also rolls out one
sample per problem with a frozen draft model, whose drafter does not move."""
from __future__ import annotations

import json

import pytest

from nemo_rl_specdec.cli import main

# auto_disable off: DAS's per-step rule reads the measured step time, and on a busy CPU it may rightly
# turn a whole step's drafting off; this test asks that the loop speculates and refreshes every step
SMALL = ["grpo.max_num_steps=2", "grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=2",
         "demo.problem_pool=4", "policy.generation.max_new_tokens=96",
         "policy.generation.speculative_decoding.auto_disable=false"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_demo_runs_two_steps_and_writes_artifacts(tmp_path, mode, tiny_cfg_fn):
    out = tmp_path / mode
    frozen = mode == "sync"  # the frozen draft-model comparison, once
    (out / "tb").mkdir(parents=True)  # a former run's artifacts: replaced; another file: left alone
    (out / "tb" / "events.out.tfevents.former").write_text("stale")
    (out / "metrics.jsonl").write_text('{"step": 7}\n' * 5)
    (out / "notes.txt").write_text("mine")
    assert main(["demo", tiny_cfg_fn().source, f"grpo.mode={mode}", *SMALL, f"demo.compare_frozen_drafter={frozen}",
                 "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    for key in ("step", "mode", "policy_version", "drafter_version", "reward_mean", "reward_mean_baseline",
                "acceptance_length", "rollout_s", "rollout_s_baseline", "drafts"):
        assert all(key in r for r in rows), key
    assert all(r["mode"] == mode for r in rows)
    assert all(r["drafts"] > 0 for r in rows), "speculation did not run"
    assert all(r["drafter_refreshed"] for r in rows), "drafter not refreshed every step"
    assert [r["new_policy_version"] for r in rows] == [1, 2]
    assert [r["new_drafter_version"] for r in rows] == [1, 2]
    if frozen:  # one sample of each of the batch's 4 problems; its drafter never refreshed
        assert [r["frozen_rollouts"] for r in rows] == [4, 4]
        assert [r["frozen_policy_age"] for r in rows] == [0, 1]
        assert all(r["frozen_tokens"] > 0 and r["frozen_acceptance_length"] > 1.0 for r in rows)
    if mode == "sync":  # the second batch is generated after the first update
        assert rows[1]["rollout_policy_versions"] == [1]
    else:  # it overlaps the first update: tokens from version 0 and/or 1, never older (lag <= 1)
        assert set(rows[1]["rollout_policy_versions"]) <= {0, 1}
    for png in ("acceptance_vs_step.png", "acceptance_vs_policy_age.png", "acceptance_by_position.png",
                "versions.png", "refresh_time.png", "rollout_time.png", "reward.png"):
        assert (out / png).stat().st_size > 1000
    assert any((out / "tb").iterdir()) and not (out / "tb" / "events.out.tfevents.former").exists()
    assert (out / "notes.txt").read_text() == "mine"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["drafter_refreshed_every_step"]
    assert summary["steps_per_pass"] == 1 and len(summary["acceptance_length_per_pass"]) == 2  # pool 4 / 4 prompts
