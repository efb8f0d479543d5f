"""bench --suite drafters: its run-file knobs are checked before any engine starts, and its judge is
the engines' traces priced on a hardware profile."""
import pytest

from nemo_rl_specdec.bench.drafters import _options, priced_ratio
from nemo_rl_specdec.config.run import ConfigError, load_run_config
from nemo_rl_specdec.cost.profile import load_profile
from nemo_rl_specdec.cost.trace import Trace, TraceStep


def test_repeats_default_and_override():
    assert _options(load_run_config("configs/tiny_cpu.yaml", []))["repeats"] == 3
    assert _options(load_run_config("configs/tiny_cpu.yaml", ["bench.drafters.repeats=5"]))["repeats"] == 5
    assert _options(load_run_config("configs/tiny_cpu.yaml", []))["profile"].name == "h100_qwen3_8b"


@pytest.mark.parametrize("bad", ["0", "true", "1.5", "three"])
def test_bad_repeats_names_the_key(bad):
    with pytest.raises(ConfigError, match=r"bench\.drafters\.repeats"):
        _options(load_run_config("configs/tiny_cpu.yaml", [f"bench.drafters.repeats={bad}"]))


def test_an_unknown_option_or_profile_is_refused():
    with pytest.raises(ConfigError, match=r"bench\.drafters\.repeatz"):
        _options(load_run_config("configs/tiny_cpu.yaml", ["bench.drafters.repeatz=3"]))
    with pytest.raises(ConfigError, match=r"bench\.drafters\.hardware"):
        _options(load_run_config("configs/tiny_cpu.yaml", ["bench.drafters.hardware=tpu"]))


def test_speculation_off_is_refused_by_its_key_before_any_engine():
    """Off, the registry's rows would run without speculation beside vLLM's built-ins with it: unequal rows."""
    with pytest.raises(ConfigError, match=r"policy\.generation\.speculative_decoding\.enabled: got false"):
        _options(load_run_config("configs/tiny_cpu.yaml", ["policy.generation.speculative_decoding.enabled=false"]))


def test_priced_ratio_is_tokens_per_priced_second():
    """Two engines on different texts: the ratio is of their priced throughputs, not their times."""
    h100 = load_profile("h100_qwen3_8b")
    base = Trace("none", 0, [TraceStep([0, 1], [100, 100], [0, 0], [0, 0], 0, None)] * 10, None, "engine")
    spec = Trace("model", 3, [TraceStep([0, 1], [100, 100], [3, 3], [2, 2], 0, None)] * 10, "eagle3", "engine")
    r = priced_ratio(h100, [spec], [base])
    from nemo_rl_specdec.cost.price import price

    assert r == pytest.approx((60 / price(spec, h100).rollout_s) / (20 / price(base, h100).rollout_s))
    assert 1.0 < r < 3.0


def test_das_is_judged_against_the_best_built_in_by_priced_rollout_time_on_one_text_at_each_host_speed():
    from nemo_rl_specdec.bench import drafters
    from nemo_rl_specdec.bench.builtins import BUILTINS

    assert set(drafters.BUILTIN_ROWS.values()) == set(BUILTINS)
    times = {drafters.OURS: (2.0, 1.8), "suffix (vLLM)": (3.0, 2.9), "suffix (vLLM defaults)": (2.5, 2.4),
             "ngram": (2.8, 2.0), "ngram (vLLM defaults)": (3.5, 3.4), "eagle3": (0.1, 0.1)}
    results = [{"name": n, "priced_by_host_speed": [{"host_speed": 1.0, "rollout_s": a},
                                                    {"host_speed": 2.0, "rollout_s": b}]}
               for n, (a, b) in times.items()]
    results.append({"name": "draft_model", "one_text_unavailable": "its drafts need the model"})
    v = drafters.judge(results)   # the model drafter is no built-in, and a row without a one-text figure is left out
    assert [(r["best_builtin"], r["ratio"]) for r in v] == [("vllm_suffix_default", 2.5 / 2.0),
                                                           ("ngram", 2.0 / 1.8)]
    assert results[0]["vs_best_builtin"] == v
    assert drafters.judge(results[1:]) == []   # no DAS row: nothing to judge


def test_the_report_fits_100_columns_and_keeps_per_position_acceptance_out(capsys, monkeypatch):
    from nemo_rl_specdec.bench import drafters

    monkeypatch.setenv("COLUMNS", "100")
    profile = load_profile("h100_qwen3_8b")
    rows = []
    for i, name in enumerate(["suffix (DAS)", "suffix (vLLM)", "suffix (vLLM defaults)", "ngram (judged)",
                              "hybrid (DAS + eagle3)", "hybrid (DAS + eagle3 at the tail)", "mtp"]):
        r = {"name": name, "k": 24, "tokens_per_target_forward": 3.5, "wall_clock_ratio": 1.1,
             "wall_clock_spread": "0.92-1.94", "accepted_per_position": [0.912345] * 24}
        if name == "mtp":
            r["one_text_unavailable"] = "no teacher-forced mirror"
        else:
            r.update(one_text_drafts="greedy, teacher-forced" if "hybrid" in name else "the proposer's",
                     one_text_tokens_per_target_forward=3.0 + i,
                     priced_by_host_speed=[{"host_speed": 1.0, "rollout_s": 1.0 + i, "speedup": 2.0 / (1 + i)},
                                           {"host_speed": 2.0, "rollout_s": 0.9 + i, "speedup": 2.1 / (1 + i)}])
        rows.append(r)
    drafters.judge(rows)
    drafters.report(rows, profile, 3, "runs/x/drafters.log")
    out = capsys.readouterr().out
    assert out and max(len(line) for line in out.splitlines()) <= 100
    assert "…" not in out   # no cell or header cut to fit
    assert any("0.92-1.94" in line and "hybrid (DAS + eagle3 at the tail)" in line for line in out.splitlines())
    assert "0.912" not in out   # per-position acceptance: the JSON's
    assert "suffix (DAS) vs the best vLLM built-in (vllm_suffix, k=24), one text, host 1x: 2.000x" in out
    hybrid = next(line for line in out.splitlines() if line.lstrip().startswith("hybrid (DAS + eagle3)"))
    assert "-" not in hybrid.split()[5:8]   # a model drafter's row is priced on the one text too
    flat = " ".join(out.split())
    assert "hybrid (DAS + eagle3), hybrid (DAS + eagle3 at the tail): greedy drafts" in flat
    assert "teacher-forced" in flat
    assert "no one-text figure" in out and out.split("no one-text figure")[1].split("\n")[0].endswith("mtp")
    assert "runs/x/drafters.log" in out
