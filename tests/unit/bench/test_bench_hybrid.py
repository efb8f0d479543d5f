"""`bench --suite hybrid` on planted rollouts and model drafts: the replays, their shares and prices."""
import math

import numpy as np
import pytest

pytest.importorskip("arctic_inference.suffix_decoding._C")

from nemo_rl_specdec.bench import hybrid  # noqa: E402
from nemo_rl_specdec.bench.builtins import BUILTINS, vllm_defaults  # noqa: E402
from nemo_rl_specdec.config.run import load_run_config  # noqa: E402
from nemo_rl_specdec.cost.profile import load_profile  # noqa: E402
from nemo_rl_specdec.cost.trace import Trace  # noqa: E402
from nemo_rl_specdec.resources import config_path  # noqa: E402

K = 4
PROMPT_A, PROMPT_B = [5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]
WRONG = 127   # a token no response contains


def _recorded(steps=3):
    """Problem A answers the same every step (history drafts it in full from step 1); problem B
    answers something new every step (no history), which the planted model drafts know."""
    a = list(range(40, 64))
    return [[{"problem_id": "A", "prompt_token_ids": PROMPT_A, "token_ids": a},
             {"problem_id": "B", "prompt_token_ids": PROMPT_B,
              "token_ids": [70 + (7 * v + 3 * j) % 50 for j in range(24)]}]
            for v in range(steps)]


def _tables(recorded):
    """Model drafts for text index prompt+1 ...: wrong everywhere for A, the true continuation for B."""
    out = {}
    for v, rs in enumerate(recorded):
        for i, r in enumerate(rs):
            text = r["prompt_token_ids"] + r["token_ids"]
            first = len(r["prompt_token_ids"]) + 1
            rows = []
            for n in range(first, len(text)):
                true = (text[n:n + K] + [WRONG] * K)[:K]
                rows.append(true if r["problem_id"] == "B" else [WRONG] * K)
            out[(v, i)] = np.asarray(rows)
    return out


@pytest.fixture(scope="module")
def results():
    cfg = load_run_config(config_path("tiny_cpu.yaml"), [
        f"policy.generation.speculative_decoding.num_speculative_tokens={K}", "bench.hybrid.repeats=2"])
    # the tail: one request (problem A's history drafts end it first; B decodes alone after)
    opts = {"profile": load_profile("h100_qwen3_8b"), "repeats": 2, "model_k": K, "tail_requests": 1}
    recorded = _recorded()
    return {r["name"]: r for r in hybrid.replay_all(cfg, opts, recorded, _tables(recorded), cfg.spec.eagle3.model)}


def _beside(cfg, recorded, tables, profile, history=True):
    """The engine's HybridProposer on the replayed steps, as `replay_all` builds it."""
    from nemo_rl_specdec.bench.replay import BesideReplay
    from nemo_rl_specdec.cost.price import PricedHybridCost

    spec = hybrid.hybrid_spec(cfg, cfg.spec.eagle3.model, K, history=history)
    beside = BesideReplay(spec, 256, hybrid.table_drafts(tables, recorded, K),
                          cost=PricedHybridCost(profile, "das" if history else "eagle3", "eagle3", K))
    if not history:
        beside.proposer.history.use_local = False
    return spec, beside


def test_every_configuration_is_replayed_shared_and_priced(results):
    assert set(results) == {"das", "das_all", "eagle3", "eagle3_rule", "hybrid", "hybrid_tail", "reference",
                            *BUILTINS}
    for r in results.values():
        assert r["share_history"] + r["share_model"] + r["share_none"] == pytest.approx(1.0)
        for key in ("priced_speedup", "priced_rollout_s", "priced_baseline_s", "tokens_per_target_forward"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["name"], key)
        assert r["repeats"] == 2 and len(r["per_step"]) == 3
        if r["name"] in BUILTINS:   # vLLM's proposers at their own k (below)
            continue
        # the simulator's input: the share of request-steps with a draft, acceptance by position of those
        assert 0 < r["coverage"] <= 1 and len(r["accepted_per_position"]) == K
        assert r["accepted_per_position"] == sorted(r["accepted_per_position"], reverse=True)
    assert results["das"]["share_model"] == 0 and results["eagle3"]["share_history"] == 0
    assert results["eagle3"]["share_model"] == 1.0 and results["das"]["priced_draft_s"] == 0
    assert results["eagle3"]["priced_proposer_s"] == 0 and results["das"]["priced_proposer_s"] > 0
    assert results["eagle3"]["coverage"] == 1.0 and results["das_all"]["coverage"] >= results["das"]["coverage"]


def test_the_hybrid_takes_each_half_where_it_drafts_and_beats_both(results):
    h = results["hybrid"]
    # A from its history, B from the model: more tokens per forward than either half alone
    assert h["share_history"] > 0 and h["share_model"] > 0
    for half in hybrid.HALVES:
        assert h["tokens_per_target_forward"] > results[half]["tokens_per_target_forward"], half
    # the model's forwards are charged on the steps that ran them, DAS's proposer on every step
    assert 0 < h["model_forward_steps"] <= h["decode_steps"] and h["priced_draft_s"] > 0
    assert h["priced_proposer_s"] > 0
    verdict = hybrid.judge(list(results.values()))
    assert verdict["hybrid_vs_better_half_tokens_per_forward"] > 1.0
    assert verdict["reference_vs_better_half_priced"] >= verdict["hybrid_vs_better_half_priced"] * 0.999


def test_no_row_beats_the_per_request_hindsight_bound(results):
    """The bound (bench/ceilings.py) is at least every row drafting at most k history tokens or the
    model half's drafts: the halves, the hybrid, the reference and vLLM's built-ins at the same k."""
    recorded = _recorded()
    bound = hybrid.hindsight_bound(recorded, _tables(recorded), K, K)
    rows = [r for r in results.values() if r.get("k", K) <= K]
    assert {"das", "das_all", "eagle3", "eagle3_rule", "hybrid", "reference"} <= {r["name"] for r in rows}
    for r in rows:
        assert r["tokens_per_target_forward"] <= bound["tokens_per_target_forward"] + 1e-12, r["name"]
    verdict = hybrid.judge(list(results.values()), bound)
    assert 0 < verdict["hybrid_share_of_hindsight_bound"] <= 1.0
    assert verdict["hindsight_bound_tokens_per_forward"] == bound["tokens_per_target_forward"]


def test_the_rule_skips_the_model_forward_where_no_model_draft_pays():
    """Every planted model draft is wrong: once the model half's acceptance has been measured on the
    drafts verified, its forwards stop (the engine's proposer, alone: no history drafts)."""
    from nemo_rl_specdec.bench.replay import replay

    cfg = load_run_config(config_path("tiny_cpu.yaml"),
                          [f"policy.generation.speculative_decoding.num_speculative_tokens={K}"])
    recorded = _recorded(steps=10)
    tables = {key: np.full_like(t, WRONG) for key, t in _tables(recorded).items()}
    spec, beside = _beside(cfg, recorded, tables, load_profile("h100_qwen3_8b"), history=False)
    replay(spec, recorded, 256, drafter=beside.drafter("model"), label="eagle3")
    c = beside.proposer.counters
    assert 0 < c["model_runs"] < c["steps"] and c["from_history"] == 0 and c["model_accepted"] == 0
    assert beside.proposer.model.rates()[0] < 0.5   # learnt from the drafts verified so far


def test_the_replay_runs_only_a_proposer_the_engine_runs_beside_a_model():
    from nemo_rl_specdec.bench.replay import BesideReplay
    from nemo_rl_specdec.drafters.suffix import DASProposer

    cfg = load_run_config(config_path("tiny_cpu.yaml"))
    with pytest.raises(ValueError, match="runs no proposer beside its model"):
        BesideReplay(hybrid.das_spec(cfg), 256, lambda batch: [])
    with pytest.raises(ValueError, match="DASProposer is not a HybridProposer"):
        BesideReplay(hybrid.hybrid_spec(cfg, cfg.spec.eagle3.model, 2), 256, lambda batch: [],
                     proposer_class=DASProposer)


def test_a_step_that_skips_the_model_half_is_charged_its_first_forward():
    """As in the engine: the model half's first forward runs at every decode step (it writes the
    head's KV of the verified tokens), its model_k forwards where the rule runs it; the priced draft
    time is those forwards and nothing else."""
    from nemo_rl_specdec.bench.replay import replay
    from nemo_rl_specdec.config.run import cost_parts
    from nemo_rl_specdec.cost.price import model_forward_s, price

    cfg = load_run_config(config_path("tiny_cpu.yaml"),
                          [f"policy.generation.speculative_decoding.num_speculative_tokens={K}"])
    recorded = _recorded(steps=10)
    tables = {key: np.full_like(t, WRONG) for key, t in _tables(recorded).items()}
    profile = load_profile("h100_qwen3_8b")
    spec, beside = _beside(cfg, recorded, tables, profile)
    rows = replay(spec, recorded, 256, drafter=beside.drafter("hybrid", cost_parts(spec)), label="hybrid")
    decode = [s for r in rows for s in r["trace"].steps if s.rids]
    c = beside.proposer.counters
    assert len(decode) == c["steps"]
    forwards = [s.model_forwards for s in decode]
    assert set(forwards) <= {1, K} and forwards.count(K) == c["model_runs"]
    assert forwards.count(1) > 0   # the model drafts are all wrong: the rule skips the model half
    for r in rows:
        expected = sum(model_forward_s(profile, hybrid.MODEL_KEY, s.model_forwards, s.ctx) for s in r["trace"].steps)
        assert price(r["trace"], profile).draft_s == pytest.approx(expected)


def test_the_default_das_and_the_hybrid_are_judged_against_the_best_built_in_at_each_host_speed(results):
    assert results["vllm_suffix"]["k"] == K and results["ngram"]["k"] == K
    assert results["vllm_suffix_default"]["k"] == vllm_defaults()["suffix"]["num_speculative_tokens"]
    assert results["ngram_default"]["k"] == vllm_defaults()["ngram"]["num_speculative_tokens"]
    verdict = hybrid.judge(list(results.values()))
    for ours in ("das", "hybrid"):
        rows = verdict[f"{ours}_vs_best_builtin"]
        assert [r["host_speed"] for r in rows] == [1.0, 2.0]
        for bands, suffix in (("measured_by_host_speed", ""), ("priced_by_host_speed", "_profile_constants")):
            for i, r in enumerate(verdict[f"{ours}_vs_best_builtin{suffix}"]):
                at = {n: results[n][bands][i]["rollout_s"] for n in BUILTINS}
                assert r["best_builtin_figure"] == min(at.values()) == at[r["best_builtin"]]
                assert r["ratio"] == pytest.approx(min(at.values()) / results[ours][bands][i]["rollout_s"])
    # the verdict's host term is each row's measured proposer time: a built-in's, summed over its own traces
    for name in BUILTINS:
        measured = sum(s.proposer_s or 0.0 for x in results[name]["per_step"] for s in
                       Trace.from_dict(x["trace"]).steps if s.rids)
        assert results[name]["measured_by_host_speed"][0]["proposer_s"] == pytest.approx(measured)
        assert results[name]["measured_by_host_speed"][1]["proposer_s"] == pytest.approx(measured / 2)
    assert results["vllm_suffix_default"]["per_step"][0]["trace"]["drafter"] == "vllm_suffix_default"


def test_the_hybrid_prints_the_das_suites_tail_table_with_its_model_steps(results, capsys):
    from nemo_rl_specdec.bench.das import print_tail, tail_table

    rows = [results[n] for n in ("das", "eagle3", "hybrid")]
    for r in rows:
        assert sum(b["request_steps"] for b in r["by_batch"]) == sum(
            len(s["rids"]) for x in r["per_step"] for s in x["trace"]["steps"])
    assert all(b["model_steps"] is None for b in results["das"]["by_batch"])
    assert all(b["model_steps"] == 1.0 for b in results["eagle3"]["by_batch"])   # drafts on every step
    assert any(b["model_steps"] for b in results["hybrid"]["by_batch"])
    table = {(t["config"], t["batch"]): t for t in tail_table(rows, None)}
    assert all(t["from %"].startswith("model ") for (name, _), t in table.items() if name != "das")
    print_tail(rows, None, "das", "hybrid")
    out = capsys.readouterr().out
    assert "hybrid at <= 4 requests:" in out and "das at <= 4 requests:" in out


def test_the_hybrid_suite_diagnoses_its_das_row_and_bins_the_ceiling_as_the_das_suite_does():
    cfg = load_run_config(config_path("tiny_cpu.yaml"),
                          [f"policy.generation.speculative_decoding.num_speculative_tokens={K}"])
    recorded = _recorded()
    tail = hybrid.tail_figures(cfg, {"profile": load_profile("h100_qwen3_8b")}, recorded)
    # two requests at once, then one: every decode request-step in one of two bins, counted once
    steps = sum(len(r["token_ids"]) - 1 for b in recorded for r in b)
    assert set(tail["das"]) <= {"1-1", "2-4"} and set(tail["ceiling"]) <= {"1-1", "2-4"}
    assert sum(b["request_steps"] for b in tail["das"].values()) <= steps
    assert all(b["tokens_per_request_step"] >= 1.0 for b in tail["ceiling"].values())
    assert sum(t["sources"]["problem"] for t in tail["das"].values()) > 0   # problem A repeats: stored rollouts


def test_the_tail_row_drafts_with_its_model_half_only_at_the_tail_and_keeps_its_kv_forward(results):
    """`hybrid_tail` is the engine's proposer with `hybrid.tail_requests` 1: on every step of two
    requests the model half offers no draft and runs its KV forward alone; at one request it drafts."""
    t = results["hybrid_tail"]
    steps = [s for x in t["per_step"] for s in Trace.from_dict(x["trace"]).steps if s.rids]
    assert steps and all(s.model_forwards == 1 for s in steps if len(s.rids) > 1)
    assert any(s.model_forwards == K for s in steps if len(s.rids) == 1)
    assert t["share_model"] > 0 and t["kv_forward_s"] > 0
    assert any(len(s.rids) > 1 for s in steps)


def test_the_catch_up_projection_replaces_the_kv_forwards_above_the_tail_by_one_forward_at_its_start(results):
    from nemo_rl_specdec.cost.model import Step
    from nemo_rl_specdec.cost.price import step_costs

    profile = load_profile("h100_qwen3_8b")
    t = results["hybrid_tail"]
    cu = t["catch_up"]
    above, catch, events = 0.0, 0.0, 0
    for x in t["per_step"]:
        tr = Trace.from_dict(x["trace"])
        decode = [(s, c) for s, c in zip(tr.steps, step_costs(tr, profile), strict=True) if s.rids]
        above += sum(c.draft_s for s, c in decode if len(s.rids) > 1)
        first = next((s for s, _ in decode if len(s.rids) == 1), None)   # the tail begins: all its context
        if first is not None:   # (a batch whose two requests end on the same step has no tail)
            catch += profile.cost_model("eagle3").cost(Step.of(np.zeros(0), np.zeros(0), float(sum(first.ctx)),
                                                               1)).draft_s
            events += 1
    assert cu["catch_ups"] == events > 0 and cu["above_tail_kv_s"] == pytest.approx(above)
    assert cu["catch_up_s"] == pytest.approx(catch) and 0 < catch < above
    for b, m in zip(cu["measured_by_host_speed"], t["measured_by_host_speed"], strict=True):
        assert b["rollout_s"] == pytest.approx(m["rollout_s"] - above + catch)
    verdict = hybrid.judge(list(results.values()))
    for r, b in zip(verdict["hybrid_tail_catch_up_vs_best_builtin"], cu["measured_by_host_speed"], strict=True):
        assert r["ratio"] == pytest.approx(r["best_builtin_figure"] / b["rollout_s"])
    assert verdict["hybrid_tail_vs_best_builtin"]
