"""bench/onetext.py: drafters compared on one recorded text, priced with the host time measured in the replay.
Planted rollouts whose drafts are known exactly; the run file's DAS and vLLM's built-ins as the bench builds them."""
import pytest

pytest.importorskip("arctic_inference.suffix_decoding._C")

from nemo_rl_specdec.bench import onetext  # noqa: E402
from nemo_rl_specdec.config import ConfigError, load_run_config  # noqa: E402
from nemo_rl_specdec.cost.price import HOST_SPEEDS, step_costs  # noqa: E402
from nemo_rl_specdec.cost.profile import load_profile  # noqa: E402

PROMPT = [5, 6, 7, 8, 9, 10]
RESPONSE = list(range(40, 57))  # 17 distinct tokens
TINY = "configs/tiny_cpu.yaml"


def _batches(n=2, samples=2):
    return [[{"problem_id": "A", "prompt_token_ids": PROMPT, "token_ids": RESPONSE} for _ in range(samples)]
            for _ in range(n)]


def test_a_model_drafter_is_no_row_and_says_why():
    cfg = load_run_config(TINY, ["policy.generation.speculative_decoding.drafter=draft_model"])
    assert "draft_model" in onetext.replayable(cfg.spec) and "teacher-forced" in onetext.replayable(cfg.spec)
    assert onetext.replayable(load_run_config(TINY, []).spec) is None
    assert onetext.LoopPricer()(cfg, _batches()) == {"hardware": "h100_qwen3_8b",
                                                      "unavailable": onetext.replayable(cfg.spec)}


def test_the_forwards_are_the_cost_functions_and_the_host_term_is_the_measured_time_over_the_host_speed():
    cfg = load_run_config(TINY, [])
    h100 = load_profile("h100_qwen3_8b")
    row = onetext.replay_row("das", cfg.spec, _batches(), cfg, h100, measure_from=1)
    (trace,) = row["traces"]
    p = row["priced"]
    assert p["forwards_s"] == pytest.approx(sum(c.target_s + c.draft_s for c in step_costs(trace, h100)))
    assert p["baseline_s"] == pytest.approx(sum(c.total_s for c in step_costs(trace.without_drafts(), h100)))
    host = sum(s.proposer_s or 0.0 for s in trace.steps)
    assert host > 0 and p["measured_host_s"] == pytest.approx(host)
    assert [b["host_speed"] for b in p["by_host_speed"]] == list(HOST_SPEEDS)
    for b in p["by_host_speed"]:
        assert b["rollout_s"] == pytest.approx(p["forwards_s"] + host / b["host_speed"])
        assert b["speedup"] == pytest.approx(p["baseline_s"] / b["rollout_s"])
    # the second batch repeats the first: DAS, rebuilt from it, drafts all of it; the first only fed its history
    assert row["tokens_per_target_forward"] > 3.0
    assert row["per_batch"][0]["priced"]["baseline_s"] == pytest.approx(p["baseline_s"])


def test_the_target_side_repeats_exactly_on_the_same_text():
    cfg = load_run_config(TINY, [])
    h100 = load_profile("h100_qwen3_8b")
    a, b = (onetext.compare(cfg, _batches(), h100, measure_from=1) for _ in range(2))
    assert set(a["rows"]) == {onetext.OURS, "vllm_suffix", "vllm_suffix_default", "ngram", "ngram_default"}
    for name in a["rows"]:
        assert a["rows"][name]["priced"]["forwards_s"] == b["rows"][name]["priced"]["forwards_s"]
        assert a["rows"][name]["priced"]["baseline_s"] == b["rows"][name]["priced"]["baseline_s"]
    # one baseline for every row: the same text without drafts
    assert len({r["priced"]["baseline_s"] for r in a["rows"].values()}) == 1
    v = a["verdict"]
    assert [x["host_speed"] for x in v] == list(HOST_SPEEDS)
    for x in v:
        rows = {n: next(b["rollout_s"] for b in r["priced"]["by_host_speed"] if b["host_speed"] == x["host_speed"])
                for n, r in a["rows"].items()}
        best = min((n for n in rows if n != onetext.OURS), key=rows.get)
        assert x["best_builtin"] == best and x["ratio"] == pytest.approx(rows[best] / rows[onetext.OURS])


def test_the_loop_pricer_gives_each_step_and_the_run():
    cfg = load_run_config(TINY, [])
    res = onetext.LoopPricer()(cfg, _batches(n=3))
    assert res["hardware"] == "h100_qwen3_8b" and res["drafter"] == "suffix"
    assert len(res["per_step"]) == 3
    # step 0 has no history: nothing to draft from but the siblings in flight; later steps repeat it
    assert res["per_step"][2][0]["speedup"] > res["per_step"][0][0]["speedup"]
    assert {v["host_speed"] for v in res["vs_best_builtin"]} == set(HOST_SPEEDS)


@pytest.mark.parametrize("bad", ["tpu", "''"])
def test_a_bad_profile_is_refused_before_any_engine_by_its_key(bad):
    cfg = load_run_config(TINY, [f"+demo.hardware={bad}"])
    with pytest.raises(ConfigError, match=r"demo\.hardware"):
        onetext.LoopPricer().check(cfg)
