"""bench --suite adaptive: its knobs are checked before any engine starts, and each configuration
starts the engines it names (the suite itself runs in docs/measurements/scheduling.md)."""
import pytest

from nemo_rl_specdec.bench.adaptive import _judge, _options, configurations
from nemo_rl_specdec.config.run import ConfigError, load_run_config

RUN = "configs/tiny_cpu.yaml"
BLOCK = "policy.generation.speculative_decoding"


def test_defaults_cover_the_drafter_and_regime_matrix():
    opts = _options(load_run_config(RUN, []))
    assert opts["drafters"] == ["das", "ngram", "draft_model"]
    assert opts["regimes"] == ["seqs8", "all", "2eng_length_aware"]
    assert opts["ks"] == [2, 4, 8] and opts["repeats"] == 3
    assert opts["priced_ks"] == [1, 2, 3, 4, 6, 8] and opts["large_batch"] == 256
    assert opts["profile"].name == "h100_qwen3_8b" and opts["engines"] is True
    labels = [(d, c) for d, c, _ in configurations(opts)]
    assert labels == [(d, c) for d in ("das", "ngram", "draft_model") for c in ("k2", "k4", "k8", "auto")]


def test_every_configuration_validates_and_auto_means_what_it_says():
    opts = _options(load_run_config(RUN, []))
    for drafter, label, ov in configurations(opts):
        spec = load_run_config(RUN, [f"{BLOCK}.enabled=true"] + [f"{BLOCK}.{o}" for o in ov]).spec
        if label == "auto":
            assert spec.num_speculative_tokens == 8
            if drafter == "draft_model":
                assert spec.scheduling.k == "auto" and spec.auto_disable is True
            else:
                assert spec.scheduling.budget == "adaptive" and spec.auto_disable is True
        else:
            assert spec.num_speculative_tokens == int(label[1:])
            assert spec.scheduling.budget == "uniform" and spec.scheduling.k is None and spec.auto_disable is False


@pytest.mark.parametrize("key,bad", [("drafters", "[eagle]"), ("regimes", "[gpu]"), ("ks", "[0]"), ("ks", "[]"),
                                     ("repeats", "0"), ("problems", "true"), ("max_new_tokens", "1.5")])
def test_bad_knobs_name_the_key(key, bad):
    with pytest.raises(ConfigError, match=rf"bench\.adaptive\.{key}: got .*allowed"):
        _options(load_run_config(RUN, [f"bench.adaptive.{key}={bad}"]))


def test_auto_is_judged_against_the_best_fixed_k_of_its_drafter_and_regime():
    rows = [{"drafter": "ngram", "regime": "all", "config": c, "wall_clock_ratio": w}
            for c, w in (("k2", 0.9), ("k4", 0.8), ("auto", 0.95))]
    rows.append({"drafter": "das", "regime": "all", "config": "k2", "wall_clock_ratio": 2.0})
    _judge(rows)
    auto = rows[2]
    assert auto["best_fixed"] == "k2" and auto["vs_best_fixed"] == pytest.approx(0.95 / 0.9)
    assert "meets_targets" not in auto
    assert rows[0]["vs_best_fixed"] is None
