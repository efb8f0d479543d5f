"""The demo's summary: acceptance per pass over the problem pool is tokens / forwards over the pass."""
import pytest

from nemo_rl_specdec.demo.run import per_pass, summarize


def _row(step, acc, tokens, **kw):
    return {"step": step, "mode": "sync", "drafter": "suffix", "acceptance_length": acc, "tokens": tokens,
            "rollout_s": 1.0, "rollout_s_baseline": 2.0, "drafter_refreshed": True, "rewards": [1.0, 0.0],
            "rewards_baseline": [0.0, 1.0], **kw}


def test_per_pass_weights_steps_by_their_forwards():
    rows = [_row(0, 2.0, 100), _row(1, 5.0, 100), _row(2, 4.0, 40), _row(3, 4.0, 40), _row(4, 3.0, 30)]
    # pass 0: 200 tokens over 50 + 20 forwards; pass 1: 80 over 20; pass 2 (partial): 30 over 10
    assert per_pass(rows, 2) == pytest.approx([200 / 70, 4.0, 3.0])
    assert per_pass(rows, 1) == pytest.approx([2.0, 5.0, 4.0, 4.0, 3.0])


def test_summary_reports_per_pass_alongside_per_step():
    rows = [_row(0, 2.0, 100), _row(1, 6.0, 120), _row(2, 3.0, 90), _row(3, 6.0, 120)]
    s = summarize(rows, steps_per_pass=2)
    assert s["last_over_peak"] == pytest.approx(1.0)
    assert s["acceptance_length_per_pass"] == pytest.approx([220 / 70, 210 / 50])
    assert s["last_pass_over_peak_pass"] == pytest.approx(1.0)
    assert s["wall_clock_ratio"] == pytest.approx(2.0)
