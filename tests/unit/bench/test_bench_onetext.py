"""bench/onetext.py: drafters compared on one recorded text, priced with the host time measured in the replay.
Planted rollouts whose drafts are known exactly; the run file's DAS and vLLM's built-ins as the bench builds them."""
import pytest

pytest.importorskip("arctic_inference.suffix_decoding._C")

from nemo_rl_specdec.bench import onetext  # noqa: E402
from nemo_rl_specdec.config.run import ConfigError, load_run_config  # noqa: E402
from nemo_rl_specdec.cost.price import HOST_SPEEDS, step_costs  # noqa: E402
from nemo_rl_specdec.cost.profile import load_profile  # noqa: E402

PROMPT = [5, 6, 7, 8, 9, 10]
RESPONSE = list(range(40, 57))  # 17 distinct tokens
TINY = "configs/tiny_cpu.yaml"


def _batches(n=2, samples=2):
    return [[{"problem_id": "A", "prompt_token_ids": PROMPT, "token_ids": RESPONSE} for _ in range(samples)]
            for _ in range(n)]


def test_a_model_drafter_is_no_row_of_the_loop_and_says_why():
    cfg = load_run_config(TINY, ["policy.generation.speculative_decoding.drafter=draft_model"])
    assert "draft_model" in onetext.replayable(cfg.spec) and "teacher-forced" in onetext.replayable(cfg.spec)
    assert onetext.replayable(load_run_config(TINY, []).spec) is None
    assert onetext.LoopPricer()(cfg, _batches()) == {"hardware": "h100_qwen3_8b",
                                                      "unavailable": onetext.replayable(cfg.spec)}


def _spec(*over):
    return load_run_config(TINY, [f"policy.generation.speculative_decoding.{o}" for o in over])


def test_every_bench_row_has_a_one_text_figure_and_a_drafter_without_a_mirror_says_why():
    from nemo_rl_specdec.bench.drafters import cpu_drafters

    for name, over in cpu_drafters(load_run_config(TINY, []).spec).items():
        assert onetext.one_text_why(load_run_config(TINY, over).spec) is None, name
    mtp = load_run_config("configs/tiny_mtp_cpu.yaml", [])
    assert mtp.spec.drafter == "mtp"
    why = onetext.one_text_why(mtp.spec)
    assert "'mtp'" in why and "teacher-forced" in why
    with pytest.raises(ValueError, match="one-text row 'm'.*'mtp'"):
        onetext.replay_row("m", mtp.spec, _batches(), mtp, load_profile("h100_qwen3_8b"))


def _own_text(cfg, n: int = 23):
    """The bundled draft model's own greedy continuation of PROMPT: the text its greedy drafts reproduce."""
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(cfg.spec.draft_model.model, dtype=torch.float32).eval()
    seq = list(PROMPT)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(m(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(PROMPT):]


def test_a_model_drafter_drafting_its_own_text_is_accepted_everywhere_and_priced_by_the_cost_function():
    cfg = _spec("drafter=draft_model", "num_speculative_tokens=4", "refresh.mode=frozen")
    h100 = load_profile("h100_qwen3_8b")
    text = _own_text(cfg)
    batches = [[{"problem_id": "A", "prompt_token_ids": PROMPT, "token_ids": text}] * 2]
    row = onetext.replay_row("draft_model", cfg.spec, batches, cfg, h100)
    (trace,) = row["traces"]
    assert row["kind"] == trace.kind == "model" and row["draft_source"] == "greedy, teacher-forced"
    # every draft accepted: the prefill, then k + 1 tokens per forward until the text ends
    per_request = 1 + -(-(len(text) - 1) // 5)
    assert row["tokens_per_target_forward"] == pytest.approx(len(text) / per_request)
    assert row["accepted_per_position"][0] == 1.0
    # priced as every row: the target and the draft's k forwards per step from the profile, no host term
    p = row["priced"]
    assert p["measured_host_s"] == 0.0
    costs = step_costs(trace, h100)
    assert p["forwards_s"] == pytest.approx(sum(c.target_s + c.draft_s for c in costs))
    assert all(c.draft_s > 0 for c, s in zip(costs, trace.steps, strict=True) if s.rids)
    assert p["baseline_s"] == pytest.approx(sum(c.total_s for c in step_costs(trace.without_drafts(), h100)))
    assert all(b["rollout_s"] == pytest.approx(p["forwards_s"]) for b in p["by_host_speed"])
    # a text the draft does not write: fewer tokens per forward, the same baseline
    other = onetext.replay_row("draft_model", cfg.spec, _batches(1), cfg, h100)
    assert other["tokens_per_target_forward"] < row["tokens_per_target_forward"]


def test_dflash_and_the_hybrid_are_rows_priced_from_their_traces():
    from nemo_rl_specdec.config.run import cost_parts

    h100 = load_profile("h100_qwen3_8b")
    base = load_run_config(TINY, [])
    policy = onetext.load_policy(base)
    block = _spec("drafter=dflash", "num_speculative_tokens=4", "refresh.mode=frozen")
    row = onetext.replay_row("dflash", block.spec, _batches(), block, h100, measure_from=1, policy=policy)
    assert row["traces"][0].kind == "block" and row["priced"]["measured_host_s"] == 0.0
    assert all(d == 4 for s in row["traces"][0].steps if s.rids for d in s.drafts)

    hyb = _spec("drafter=hybrid", "hybrid.model=eagle3", "num_speculative_tokens=4", "refresh.mode=online")
    a, b = (onetext.replay_row("hybrid", hyb.spec, _batches(), hyb, h100, measure_from=1, policy=policy)
            for _ in range(2))
    (trace,) = a["traces"]
    assert trace.kind == "hybrid" and trace.parts == cost_parts(hyb.spec)
    # the history half rebuilt from the first batch drafts the repeat; its proposer's host time is measured
    assert a["tokens_per_target_forward"] > 3.0 and a["priced"]["measured_host_s"] > 0
    costs = step_costs(trace, h100)
    assert a["priced"]["forwards_s"] == pytest.approx(sum(c.target_s + c.draft_s for c in costs))
    # the same text: the target side repeats exactly
    assert a["priced"]["forwards_s"] == b["priced"]["forwards_s"]
    assert a["priced"]["baseline_s"] == b["priced"]["baseline_s"] == row["priced"]["baseline_s"]


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
