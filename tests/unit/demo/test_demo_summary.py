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


def _priced(steps):
    bands = [{"host_speed": 1.0, "rollout_s": 1.0, "speedup": 2.5}, {"host_speed": 2.0, "rollout_s": 0.9,
                                                                       "speedup": 2.7}]
    return {"hardware": "h100_qwen3_8b", "gpu": "H100 SXM", "drafter": "suffix", "by_host_speed": bands,
            "per_step": [[{**b, "speedup": b["speedup"] + s} for b in bands] for s in range(steps)],
            "builtins": {"vllm_suffix_default": {"k": 24}},
            "vs_best_builtin": [{"host_speed": 1.0, "best_builtin": "vllm_suffix_default", "ratio": 1.05},
                                {"host_speed": 2.0, "best_builtin": "vllm_suffix_default", "ratio": 1.04}]}


def test_each_step_gains_its_priced_speedup_and_the_summary_reads_in_order():
    from pathlib import Path

    from nemo_rl_specdec.demo.run import add_priced, summary_lines

    rows = [_row(s, 3.0, 100, policy_version=s, drafter_version=s, policy_age=0) for s in range(3)]
    add_priced(rows, _priced(3))
    assert [r["priced_speedup"] for r in rows] == [2.5, 3.5, 4.5]
    assert [r["priced_speedup_2x"] for r in rows] == [2.7, 3.7, 4.7]
    s = summarize(rows, priced=_priced(3))
    lines = summary_lines(s, Path("runs/tiny_cpu"), Path("runs/tiny_cpu/engines.log"))
    labels = [label for label, _ in lines if label]
    assert labels == ["lossless", "priced", "this CPU", "acceptance", "freshness", "artifacts", "engine log"]
    text = "\n".join(t for _, t in lines)
    assert "p = " in text and "2.50x faster than no speculation on h100_qwen3_8b" in text
    assert "1.050x the best vLLM built-in (vllm_suffix_default, k=24) on the same text, host 1x" in text
    assert "tensorboard --logdir runs/tiny_cpu/tb" in text
    # the priced figure comes before the wall clock
    assert text.index("faster than no speculation") < text.index("wall clock")


def test_a_drafter_without_a_priced_figure_says_why():
    from pathlib import Path

    from nemo_rl_specdec.demo.run import add_priced, summary_lines

    rows = [_row(0, 3.0, 100, policy_age=0)]
    add_priced(rows, {"hardware": "h100_qwen3_8b", "unavailable": "drafter 'eagle3' drafts with a model"})
    assert "priced_speedup" not in rows[0]
    s = summarize(rows, priced={"hardware": "h100_qwen3_8b", "unavailable": "drafter 'eagle3' drafts with a model"})
    assert ("priced", "no priced figure: drafter 'eagle3' drafts with a model") in summary_lines(s, Path("o"))


def test_the_report_fits_100_columns(capsys, monkeypatch):
    from pathlib import Path

    from nemo_rl_specdec.demo.run import add_priced, print_report

    monkeypatch.setenv("COLUMNS", "100")
    rows = [_row(s, 3.123456, 100, policy_version=s, drafter_version=s, policy_age=0, reward_mean=0.4567,
                 reward_mean_baseline=0.5, wall_clock_ratio=1.01, frozen_acceptance_length=3.9, frozen_tokens=90,
                 accepted_per_position=[0.91234] * 24) for s in range(6)]
    add_priced(rows, _priced(6))
    s = summarize(rows, steps_per_pass=2, priced=_priced(6))
    print_report(rows, s, Path("runs/tiny_cpu"), Path("runs/tiny_cpu/engines.log"))
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 100
    assert "0.912" not in out and "priced x" in out and "CPU wall x" in out
