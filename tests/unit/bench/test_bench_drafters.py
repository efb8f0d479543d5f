"""bench --suite drafters: its run-file knobs are checked before any engine starts, and its judge is
the engines' traces priced on a hardware profile."""
import pytest

from nemo_rl_specdec.bench.drafters import _options, priced_ratio
from nemo_rl_specdec.config import ConfigError, load_run_config
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


def test_priced_ratio_is_tokens_per_priced_second():
    """Two engines on different texts: the ratio is of their priced throughputs, not their times."""
    h100 = load_profile("h100_qwen3_8b")
    base = Trace("none", 0, [TraceStep([0, 1], [100, 100], [0, 0], [0, 0], 0, None)] * 10, None, "engine")
    spec = Trace("model", 3, [TraceStep([0, 1], [100, 100], [3, 3], [2, 2], 0, None)] * 10, "eagle3", "engine")
    r = priced_ratio(h100, [spec], [base])
    from nemo_rl_specdec.cost.price import price

    assert r == pytest.approx((60 / price(spec, h100).rollout_s) / (20 / price(base, h100).rollout_s))
    assert 1.0 < r < 3.0


def test_das_is_judged_against_the_best_built_in_by_priced_throughput_at_each_host_speed():
    from nemo_rl_specdec.bench import drafters
    from nemo_rl_specdec.bench.builtins import BUILTINS

    assert set(drafters.BUILTIN_ROWS.values()) == set(BUILTINS)
    ratios = {drafters.OURS: (2.0, 2.2), "suffix (vLLM)": (1.5, 1.6), "suffix (vLLM defaults)": (1.6, 1.7),
              "ngram": (1.2, 1.9), "ngram (vLLM defaults)": (1.1, 1.2), "eagle3": (9.0, 9.0)}
    results = [{"name": n, "priced_by_host_speed": [{"host_speed": 1.0, "priced_throughput_ratio": a},
                                                    {"host_speed": 2.0, "priced_throughput_ratio": b}]}
               for n, (a, b) in ratios.items()]
    v = drafters.judge(results)   # the model drafter is no built-in: left out
    assert [(r["best_builtin"], r["ratio"]) for r in v] == [("vllm_suffix_default", 2.0 / 1.6),
                                                           ("ngram", 2.2 / 1.9)]
    assert results[0]["vs_best_builtin"] == v
    assert drafters.judge(results[1:]) == []   # no DAS row: nothing to judge
