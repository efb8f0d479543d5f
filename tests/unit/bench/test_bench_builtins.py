"""vLLM's built-ins as baselines (`bench/builtins.py`): the rows at vLLM's own defaults, read from the
installed vLLM's SpeculativeConfig, and the best of them."""
import pydantic
import pytest
from vllm.config.speculative import SpeculativeConfig

from nemo_rl_specdec.bench import builtins, das
from nemo_rl_specdec.config.run import load_run_config, to_vllm_speculative_config
from nemo_rl_specdec.resources import config_path


def _das_rows() -> dict:
    cfg = load_run_config(config_path("tiny_cpu.yaml"))
    return {c["name"]: c for c in das.configurations(cfg, das._options(cfg))}


def test_the_default_rows_are_what_vllm_gives_method_suffix_and_ngram_alone():
    rows = _das_rows()
    assert set(builtins.BUILTINS) <= set(rows)
    s = SpeculativeConfig(method="suffix")   # nothing but the method: vLLM fills in the rest
    assert to_vllm_speculative_config(rows["vllm_suffix_default"]["cfg"].spec) == {
        "method": "suffix", "num_speculative_tokens": s.num_speculative_tokens,
        "suffix_decoding_max_tree_depth": s.suffix_decoding_max_tree_depth,
        "suffix_decoding_max_cached_requests": s.suffix_decoding_max_cached_requests,
        "suffix_decoding_max_spec_factor": s.suffix_decoding_max_spec_factor,
        "suffix_decoding_min_token_prob": s.suffix_decoding_min_token_prob}
    # k follows the tree depth, the draft length the match
    assert rows["vllm_suffix_default"]["k"] == s.suffix_decoding_max_tree_depth == s.num_speculative_tokens
    n = SpeculativeConfig(method="ngram", num_speculative_tokens=builtins.NGRAM_DOCS_K)
    assert to_vllm_speculative_config(rows["ngram_default"]["cfg"].spec) == {
        "method": "ngram", "num_speculative_tokens": builtins.NGRAM_DOCS_K,
        "prompt_lookup_min": n.prompt_lookup_min, "prompt_lookup_max": n.prompt_lookup_max}
    for name in ("vllm_suffix_default", "ngram_default"):   # vLLM's proposer as it comes: no rule of ours
        spec = rows[name]["cfg"].spec
        assert spec.auto_disable is False and spec.scheduling.budget == "uniform"
        assert spec.scheduling.k_by_batch_size is None and spec.refresh.mode == "frozen"


def test_vllm_has_no_default_k_for_ngram():
    """The n-gram row's k is the documentation's because vLLM has none: if vLLM grows one, use it."""
    with pytest.raises(pydantic.ValidationError, match="num_speculative_tokens must be provided"):
        SpeculativeConfig(method="ngram")


def test_the_matched_k_rows_keep_the_run_files_k_and_blocks():
    rows = _das_rows()
    cfg = load_run_config(config_path("tiny_cpu.yaml"))
    k = cfg.spec.num_speculative_tokens
    suffix = to_vllm_speculative_config(rows["vllm_suffix"]["cfg"].spec)
    assert suffix["method"] == "suffix" and suffix["num_speculative_tokens"] == k
    assert suffix["suffix_decoding_max_tree_depth"] == cfg.spec.suffix.max_tree_depth
    assert to_vllm_speculative_config(rows["ngram"]["cfg"].spec) == {
        "method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": cfg.spec.ngram.prompt_lookup_min,
        "prompt_lookup_max": cfg.spec.ngram.prompt_lookup_max}


def test_the_best_built_in_is_the_fastest_of_them_priced_and_ours_is_left_out():
    times = {"das_w4_both": 1.0, "vllm_suffix": 3.0, "vllm_suffix_default": 2.5, "ngram": 4.0, "ngram_default": None}
    assert builtins.best(times) == ("vllm_suffix_default", 2.5)
    # a priced throughput ratio: the largest
    assert builtins.best({"suffix (DAS)": 9.0, "vllm_suffix": 1.2, "ngram": 1.4}, higher=True) == ("ngram", 1.4)
    with pytest.raises(ValueError, match="none of"):
        builtins.best({"das_w4_both": 1.0})


def test_the_verdict_is_taken_at_each_host_speed_where_the_best_may_differ():
    by_host = {1.0: {"das": 2.0, "vllm_suffix": 3.0, "ngram": 2.8}, 2.0: {"das": 1.5, "vllm_suffix": 2.4, "ngram": 2.7}}
    v = builtins.verdict(by_host, "das")
    assert [(r["host_speed"], r["best_builtin"], r["ratio"]) for r in v] == [(1.0, "ngram", 2.8 / 2.0),
                                                                             (2.0, "vllm_suffix", 2.4 / 1.5)]
    line = builtins.verdict_lines(v, "priced rollout time", {"ngram": 5})[0]
    assert line == "das vs the best vLLM built-in (ngram, k=5), priced rollout time, host 1x: 1.400x"


def test_the_das_suite_prints_the_default_das_against_the_best_built_in_at_both_host_speeds(capsys):
    """The verdict reads every row's rollout time priced with its measured proposer time; the same with the
    profile's constants is printed beside it, as a comparison."""
    from nemo_rl_specdec.cost.profile import load_profile

    cfg = load_run_config(config_path("tiny_cpu.yaml"))
    main = f"das_w{cfg.spec.suffix.window_steps}_{cfg.spec.suffix.scope}"
    measured = {main: (2.0, 1.5), "vllm_suffix": (3.0, 2.4), "vllm_suffix_default": (2.6, 2.0), "ngram": (2.8, 2.7)}
    constants = {main: (2.0, 1.5), "vllm_suffix": (1.9, 1.4), "vllm_suffix_default": (2.6, 2.0), "ngram": (2.8, 2.7)}

    def bands(t):
        return [{"host_speed": 1.0, "rollout_s": t[0], "proposer_s": 0.1}, {"host_speed": 2.0, "rollout_s": t[1],
                                                                             "proposer_s": 0.05}]

    results = [{"name": n, "k": 24 if n == "vllm_suffix_default" else 8, "priced_speedup": 1.0,
                "priced_speedup_after_3": 1.0, "priced_rollout_s": constants[n][0], "priced_proposer_s": 0.0,
                "priced_baseline_s": 4.0, "proposer_by_batch": [], "priced_by_host_speed": bands(constants[n]),
                "measured_by_host_speed": bands(t)} for n, t in measured.items()]
    das._print_priced(results, cfg, load_profile("h100_qwen3_8b"))
    out = capsys.readouterr().out
    what = "priced rollout time, proposer time measured in this run"
    assert f"{main} vs the best vLLM built-in (vllm_suffix_default, k=24), {what}, host 1x: 1.300x" in out
    assert f"{main} vs the best vLLM built-in (vllm_suffix_default, k=24), {what}, host 2x: 1.333x" in out
    assert [r["best_builtin"] for r in results[0]["vs_best_builtin"]] == ["vllm_suffix_default"] * 2
    # with the constants vLLM's suffix at matched k would be the best built-in, and faster than DAS
    assert "host 1x 0.950x against vllm_suffix; host 2x 0.933x against vllm_suffix" in out
    assert f"default DAS ({main}) vs vLLM suffix at matched k, {what}, host 1x: 1.500x\n" in out
    assert "target >=" not in out and "MISSED" not in out
