"""Length predictor, placement across engines, per-request budgets, k by batch size."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from nemo_rl_specdec.config.schema import schedule_lookup
from nemo_rl_specdec.scheduling.budget import (
    BUDGETS,
    acceptance_curve,
    assign_budgets,
    classify,
    das_budgets,
    engine_budgets,
    expected_accepted,
    k_by_batch_size_schedule,
    k_for_batch,
    length_aware_budgets,
)
from nemo_rl_specdec.scheduling.placement import PLACEMENTS, Request, place, restore_order
from nemo_rl_specdec.scheduling.predictor import LengthPredictor

# --------------------------------------------------------------------------- helpers

def grouped_long_tail(num_groups=16, group_size=4, seed=0):
    """GRPO-like batch: groups adjacent, per-group lengths long or short together, long tail."""
    rng = np.random.default_rng(seed)
    reqs, true_len = [], []
    for g in range(num_groups):
        mu = np.log(300) + 1.0 * rng.standard_normal()
        for _s in range(group_size):
            L = float(np.exp(mu + 0.2 * rng.standard_normal()))
            reqs.append(Request(index=len(reqs), problem_id=f"p{g}", predicted_len=math.exp(mu)))
            true_len.append(L)
    return reqs, true_len


def makespan(assignment, lengths):
    return max(sum(lengths[i] for i in eng) for eng in assignment)


# --------------------------------------------------------------------------- predictor

def test_predictor_ema_and_cold_start():
    p = LengthPredictor(alpha=0.5, cold_start="prior", prior=123.0)
    assert p.predict("new") == 123.0                    # nothing seen: the prior
    p.observe("a", 100)
    assert p.predict("a") == 100.0                      # first observation initialises the EMA
    p.observe("a", 200)
    assert p.predict("a") == pytest.approx(150.0)       # 100 + 0.5 * (200 - 100)
    p.observe("a", 50)
    assert p.predict("a") == pytest.approx(100.0)
    assert p.count("a") == 3 and p.known("a") and not p.known("b")
    assert p.predict("b") == 123.0                      # cold_start=prior ignores the global history


def test_predictor_global_mean_and_quantile_prior():
    m = LengthPredictor(cold_start="mean")
    q = LengthPredictor(cold_start="quantile", quantile=0.9)
    for i, x in enumerate([10, 20, 30, 40, 1000]):
        m.observe(f"p{i}", x)
        q.observe(f"p{i}", x)
    assert m.predict("unseen") == pytest.approx(220.0)
    assert q.predict("unseen") == pytest.approx(np.quantile([10, 20, 30, 40, 1000], 0.9))


def test_predict_remaining_conditional_and_never_negative():
    p = LengthPredictor(alpha=1.0, tail_factor=0.5, max_len=5000)
    for x in (100, 200, 1000):
        p.observe("a", x)
    assert p.predict_remaining("a", 0) == pytest.approx(1000.0)   # g = 0: the EMA (alpha=1: last)
    # outlived 100: the survivors are 200 and 1000 -> mean 600, minus 150 generated
    assert p.predict_remaining("a", 150) == pytest.approx(600 - 150)
    assert p.predict_remaining("a", 500) == pytest.approx(1000 - 500)
    # outlived every record: tail rule, grows with age
    assert p.predict_remaining("a", 2000) == pytest.approx(1000.0)
    assert p.predict_remaining("a", 3000) > p.predict_remaining("a", 2000)
    # never beyond max_len, never negative
    assert p.predict_remaining("a", 4800) == pytest.approx(200.0)
    assert p.predict_remaining("a", 6000) == 0.0
    # an unseen problem uses the global history
    assert p.predict_remaining("zzz", 150) == pytest.approx(600 - 150)
    with pytest.raises(ValueError, match="generated_so_far"):
        p.predict_remaining("a", -1)


def test_predict_remaining_without_any_observation():
    p = LengthPredictor(cold_start="prior", prior=100.0, tail_factor=0.25)
    assert p.predict_remaining("x", 40) == pytest.approx(60.0)
    assert p.predict_remaining("x", 400) == pytest.approx(100.0)


def test_predictor_state_roundtrip_through_json():
    p = LengthPredictor(alpha=0.3, cold_start="quantile", quantile=0.75, history=4, max_len=900)
    rng = np.random.default_rng(1)
    for i in range(50):
        p.observe(f"p{i % 7}", int(rng.integers(1, 800)))
    q = LengthPredictor.from_dict(json.loads(json.dumps(p.to_dict())))
    for pid in [f"p{i}" for i in range(8)]:
        assert q.predict(pid) == pytest.approx(p.predict(pid))
        for g in (0, 10, 300, 799):
            assert q.predict_remaining(pid, g) == pytest.approx(p.predict_remaining(pid, g))
    assert len(q._hist["p0"]) == 4                      # history bound preserved


def test_predictor_rejects_bad_input():
    with pytest.raises(ValueError, match="cold_start"):
        LengthPredictor(cold_start="median")
    with pytest.raises(ValueError, match="alpha"):
        LengthPredictor(alpha=0)
    with pytest.raises(ValueError, match="length"):
        LengthPredictor().observe("a", -3)
    with pytest.raises(ValueError, match="invalid LengthPredictor state"):
        LengthPredictor.from_dict({"params": {}})


# --------------------------------------------------------------------------- placement

@pytest.mark.parametrize("policy", PLACEMENTS)
@pytest.mark.parametrize("n,engines", [(0, 2), (1, 4), (3, 8), (10, 3), (64, 2), (37, 5)])
def test_every_request_exactly_once_and_order_restored(policy, n, engines):
    reqs = [Request(i, f"p{i // 4}", float((i * 37) % 11)) for i in range(n)]
    a = place(reqs, engines, policy)
    assert len(a) == engines
    flat = [i for eng in a for i in eng]
    assert sorted(flat) == list(range(n))               # each request exactly once
    outs = [[f"out{i}" for i in eng] for eng in a]      # engines return results in their order
    assert restore_order(outs, a) == [f"out{i}" for i in range(n)]
    assert place(reqs, engines, policy) == a            # deterministic


def test_contiguous_matches_nemo_rl_shards_and_round_robin_interleaves():
    reqs = [Request(i, "p", 1.0) for i in range(10)]
    assert place(reqs, 3, "contiguous") == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert place(reqs, 3, "round_robin") == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]


def test_more_engines_than_requests_leaves_engines_empty():
    reqs = [Request(i, f"p{i}", 10.0 * (i + 1)) for i in range(2)]
    for policy in PLACEMENTS:
        a = place(reqs, 5, policy)
        assert sum(len(e) for e in a) == 2 and sum(1 for e in a if not e) == 3


def test_length_aware_spreads_groups():
    reqs, _ = grouped_long_tail(num_groups=8, group_size=4)
    for engines in (2, 3, 4):
        a = place(reqs, engines, "length_aware")
        for g in range(8):
            counts = [sum(1 for i in eng if reqs[i].problem_id == f"p{g}") for eng in a]
            assert max(counts) <= math.ceil(4 / engines), (engines, g, counts)
    contiguous = place(reqs, 2, "contiguous")           # the problem being fixed: groups pile up
    assert any(sum(1 for i in contiguous[0] if reqs[i].problem_id == f"p{g}") == 4 for g in range(8))


def test_length_aware_orders_each_engine_longest_first():
    reqs = [Request(i, f"p{i}", float(v)) for i, v in enumerate([5, 50, 1, 500, 20, 7])]
    for eng in place(reqs, 2, "length_aware"):
        preds = [reqs[i].predicted_len for i in eng]
        assert preds == sorted(preds, reverse=True)


def test_lpt_balances_better_than_contiguous_on_long_tailed_groups():
    wins = 0
    for seed in range(10):
        reqs, true_len = grouped_long_tail(num_groups=16, group_size=4, seed=seed)
        la = place(reqs, 2, "length_aware")
        ct = place(reqs, 2, "contiguous")
        by_index = {r.index: r.predicted_len for r in reqs}
        loads = [sum(by_index[i] for i in eng) for eng in la]
        assert max(loads) - min(loads) <= max(r.predicted_len for r in reqs) + 1e-9  # LPT bound
        assert makespan(la, [r.predicted_len for r in reqs]) <= makespan(ct, [r.predicted_len for r in reqs])
        wins += makespan(la, true_len) < makespan(ct, true_len)
    assert wins >= 8     # with true (unpredicted) lengths too, on nearly every draw


def test_length_aware_with_zero_or_equal_predictions_spreads_by_count():
    # a cold predictor predicts 0 (or one value) for everything: LPT's load never breaks the tie,
    # the request count must, or the whole batch lands on engine 0
    for pred in (0.0, 7.0):
        reqs = [Request(i, f"p{i}", pred) for i in range(10)]
        for engines in (2, 3, 4):
            a = place(reqs, engines, "length_aware")
            sizes = [len(eng) for eng in a]
            assert max(sizes) - min(sizes) <= 1, (pred, engines, sizes)
    grouped = [Request(i, f"p{i // 4}", 0.0) for i in range(16)]
    a = place(grouped, 2, "length_aware")
    assert [len(eng) for eng in a] == [8, 8]
    for g in range(4):
        assert [sum(1 for i in eng if grouped[i].problem_id == f"p{g}") for eng in a] == [2, 2]


def test_placement_reads_request_attributes_in_any_index_order():
    reqs = [Request(1, "a", 3), Request(0, "b", 9)]
    assert place(reqs, 2, "length_aware") == [[0], [1]]
    with pytest.raises(ValueError, match="missing attribute 'index'"):
        place([{"index": 0, "problem_id": "a", "predicted_len": 1.0}], 2)


def test_placement_errors_are_clear():
    with pytest.raises(ValueError, match=r"'fastest'.*\['contiguous', 'round_robin', 'length_aware'\]"):
        place([], 2, "fastest")
    with pytest.raises(ValueError, match="num_engines"):
        place([], 0, "contiguous")
    with pytest.raises(ValueError, match="more than once"):
        place([Request(0, "a"), Request(0, "b")], 2)
    with pytest.raises(ValueError, match="predicted_len"):
        place([Request(0, "a", -1.0)], 2)
    with pytest.raises(ValueError, match="missing"):
        place([{"index": 0, "problem_id": "a"}], 2)


def test_restore_order_detects_lost_or_duplicated_results():
    a = [[0, 2], [1]]
    with pytest.raises(ValueError, match="engine 1: returned 0 outputs for 1 requests"):
        restore_order([["x", "y"], []], a)
    with pytest.raises(ValueError, match="more than once"):
        restore_order([["x", "y"], ["z"]], [[0, 1], [1]])
    with pytest.raises(ValueError, match="outputs for 1 engines"):
        restore_order([["x"]], a)


# --------------------------------------------------------------------------- budgets

def test_acceptance_curves():
    assert expected_accepted(0.5, 3) == pytest.approx([1, 1.5, 1.75, 1.875])
    assert expected_accepted(0.0, 2) == pytest.approx([1, 1, 1])
    assert expected_accepted([0.8, 0.6], 2) == pytest.approx([1, 1.8, 2.4])
    assert acceptance_curve([0.8, 0.4], 4) == pytest.approx([0.8, 0.4, 0.2, 0.1])  # last ratio carried on
    with pytest.raises(ValueError, match="can only fall"):
        acceptance_curve([0.5, 0.7], 2)
    with pytest.raises(ValueError, match="alpha"):
        acceptance_curve(1.5, 2)


def test_uniform_budget():
    assert assign_budgets([5, 500, 50], 6, "uniform") == [6, 6, 6]
    assert assign_budgets([], 6, "uniform") == []


def test_length_aware_classes_and_budgets():
    rem = [10, 20, 30, 40, 50, 60, 70, 80]
    assert classify(rem, 0.25, 0.25) == ["short", "short", "medium", "medium", "medium", "medium", "long", "long"]
    assert length_aware_budgets(rem, 8, 0.25, 0.25) == [0, 0, 4, 4, 4, 4, 8, 8]
    assert length_aware_budgets(rem, 8, 0.25, 0.25, medium_k=2) == [0, 0, 2, 2, 2, 2, 8, 8]
    assert length_aware_budgets(rem, 3, 0.5, 0.0) == [2, 2, 2, 2, 3, 3, 3, 3]   # medium ceil(3/2)
    assert assign_budgets(rem, 8, "length_aware", long_fraction=0.25, short_fraction=0.25) == [0, 0, 4, 4, 4, 4, 8, 8]


def test_length_aware_without_information_is_uniform():
    # a cold predictor gives every request the same prediction: no request may be singled out
    assert length_aware_budgets([7.0] * 6, 5) == [5] * 6
    assert classify([1.0]) == ["long"]


def test_das_gives_drafts_to_the_makespan():
    rem = [10, 100, 1000, 5000, 20000]
    d = das_budgets(rem, 8, acceptance=0.7, c_base=1.0, c_tok=1 / 64)
    assert d[-1] == 8                        # the request that sets the makespan gets the full k
    assert d[0] == 0 and d[1] == 0           # short ones would finish anyway
    assert d == sorted(d)                    # longer never gets fewer drafts
    # compute-bound step (tokens expensive): the long request gets fewer drafts
    d_cb = das_budgets(rem, 8, acceptance=0.7, c_base=1.0, c_tok=1.0)
    assert d_cb[-1] < 8 and sum(d_cb) <= sum(d)
    # zero acceptance: drafting never helps
    assert das_budgets(rem, 8, acceptance=0.0) == [0] * 5


def test_das_matches_brute_force_optimum():
    rng = np.random.default_rng(3)
    A = expected_accepted(0.6, 3)
    for _ in range(20):
        rem = list(rng.integers(1, 400, size=4).astype(float))
        c_tok = float(rng.choice([0.01, 0.1, 0.5]))
        got = das_budgets(rem, 3, 0.6, 1.0, c_tok)

        def T(d, rem=rem, c_tok=c_tok):
            return (max(r / A[x] for r, x in zip(rem, d, strict=True))
                    + sum(r * c_tok * (1 + x) / A[x] for r, x in zip(rem, d, strict=True)))

        best = min(T(d) for d in np.ndindex(4, 4, 4, 4))
        assert T(got) == pytest.approx(best, rel=1e-9)


def test_das_per_request_cost_makes_long_contexts_draft():
    rem = [1000, 1000, 4000]
    plain = das_budgets(rem, 6, 0.7, c_base=1.0, c_tok=0.05)
    assert plain[0] == 0 and plain[2] > 0
    kv = das_budgets(rem, 6, 0.7, c_base=1.0, c_tok=0.05, c_req=[0.0, 5.0, 0.0])
    assert kv[1] > 0 and kv[0] == 0          # a big KV read per step makes fewer steps worth it


def test_budget_errors():
    with pytest.raises(ValueError, match=r"'fancy'.*\['uniform', 'length_aware', 'das', 'adaptive'\]"):
        assign_budgets([1], 3, "fancy")
    with pytest.raises(ValueError, match="long_fraction"):
        classify([1, 2], 0.8, 0.5)
    with pytest.raises(ValueError, match="medium_k"):
        length_aware_budgets([1, 2], 2, medium_k=3)
    assert set(BUDGETS) == {"uniform", "length_aware", "das", "adaptive"}
    assert assign_budgets([5, 50], 3, "adaptive") == [3, 3]  # the drafter cuts per step
    assert engine_budgets([5, 50], [[0], [1]], 3, "adaptive") == [None, None]  # nothing is sent at submission


# --------------------------------------------------------------------------- k by batch size

def test_schedule_covers_all_batches_and_k_grows_as_batch_drains():
    sched = k_by_batch_size_schedule(256, 8, acceptance=0.7, c_base=1.0, c_tok=1 / 64)
    assert sched[0][0] == 1 and sched[-1][1] == 256
    for (lo, hi, k), nxt in zip(sched, sched[1:] + [None], strict=False):
        assert lo <= hi and 0 <= k <= 8
        if nxt:
            assert nxt[0] == hi + 1              # contiguous, non-overlapping
            assert nxt[2] < k                    # k falls as the batch grows
    assert sched[0][2] == 8                      # batch 1: memory-bound, full k
    assert sched[-1][2] == 0                     # large batch: speculation off
    for b in (1, 5, 40, 200):
        assert schedule_lookup(sched, b, 8) == k_for_batch(b, 8, 0.7, 1.0, 1 / 64)


def test_schedule_maps_into_the_config_schema_and_vllm_config():
    from nemo_rl_specdec.config.run import SpecDecConfig, to_vllm_speculative_config

    sched = k_by_batch_size_schedule(64, 4, acceptance=0.6)
    spec = SpecDecConfig(enabled=True, drafter="ngram", num_speculative_tokens=4,
                         scheduling={"k_by_batch_size": sched, "budget": "length_aware"})
    out = to_vllm_speculative_config(spec)
    assert out["num_speculative_tokens_per_batch_size"] == [list(t) for t in sched]


def test_schedule_lookup_carries_k_forward_like_vllm():
    sched = [(1, 4, 6), (9, 16, 2)]
    assert [schedule_lookup(sched, b, 6) for b in (1, 4, 5, 8, 9, 16, 100)] == [6, 6, 6, 6, 2, 2, 2]
    assert schedule_lookup(None, 50, 3) == 3
    assert schedule_lookup([(1, 10, 9)], 3, 4) == 4   # capped at num_speculative_tokens


def test_schedule_edge_cases():
    assert k_by_batch_size_schedule(1, 3) == [(1, 1, 3)]
    assert k_by_batch_size_schedule(10, 0) == [(1, 10, 0)]
    assert k_by_batch_size_schedule(50, 4, acceptance=0.0) == [(1, 50, 0)]   # nothing is ever accepted
    with pytest.raises(ValueError, match="max_batch"):
        k_by_batch_size_schedule(0, 3)


# --------------------------------------------------------------------------- budgets per engine (EngineGroup)

def test_engine_budgets_class_each_engine_separately_and_keep_fixed_ones():
    from nemo_rl_specdec.scheduling.budget import engine_budgets

    preds = [10, 20, 30, 40, 1000, 2000, 3000, 4000]
    a = [[0, 1, 2, 3], [4, 5, 6, 7]]
    got = engine_budgets(preds, a, 8, "length_aware", long_fraction=0.25, short_fraction=0.25)
    # each engine's own longest is "long" and its own shortest "short", whatever the other engine holds
    assert got == [0, 4, 4, 8, 0, 4, 4, 8]
    assert got == (length_aware_budgets(preds[:4], 8, 0.25, 0.25) + length_aware_budgets(preds[4:], 8, 0.25, 0.25))
    # a caller's budget is kept and its request left out of the classing
    fixed = [None, None, None, 0, None, None, 8, None]
    got = engine_budgets(preds, a, 8, "length_aware", fixed=fixed, long_fraction=0.34, short_fraction=0.34)
    assert got[3] == 0 and got[6] == 8
    assert [got[i] for i in (0, 1, 2)] == length_aware_budgets([10, 20, 30], 8, 0.34, 0.34)
    assert engine_budgets(preds, a, 8, "uniform") == [None] * 8          # None = the drafter's k
    assert engine_budgets(preds, a, 8, "uniform", fixed=fixed) == fixed
    das = engine_budgets(preds, a, 8, "das", acceptance=0.7)
    assert das[4:] == das_budgets(preds[4:], 8, 0.7) and das[:4] == das_budgets(preds[:4], 8, 0.7)


def test_engine_budgets_errors():
    from nemo_rl_specdec.scheduling.budget import engine_budgets

    with pytest.raises(ValueError, match="exactly once"):
        engine_budgets([1, 2, 3], [[0, 1], [1]], 4, "length_aware")
    with pytest.raises(ValueError, match="fixed: 1 entries for 2"):
        engine_budgets([1, 2], [[0], [1]], 4, "uniform", fixed=[None])
    with pytest.raises(ValueError, match="'fast'"):
        engine_budgets([1, 2], [[0], [1]], 4, "fast")


def _cfg(**spec):
    from nemo_rl_specdec.config.run import validate_run_dict

    return validate_run_dict({"policy": {"model_name": "/nonexistent", "generation": {
        "speculative_decoding": {"enabled": True, **spec}}}})


def test_group_config_routes_budgets_and_derives_k_by_batch_for_model_drafters():
    from nemo_rl_specdec.config.run import to_vllm_speculative_config, validate_run_dict
    from nemo_rl_specdec.driver.group import budget_route, scheduled_config

    # DAS suffix: per-request budgets, the vLLM config is untouched
    das = _cfg(drafter="suffix", suffix={"backend": "das"}, scheduling={"budget": "length_aware"})
    assert budget_route(das.spec) == "per_request"
    assert scheduled_config(das) == (das, None)
    # vLLM's own ngram / suffix cannot take per-request budgets
    assert budget_route(_cfg(drafter="ngram").spec) == "none"
    assert budget_route(_cfg(drafter="suffix", suffix={"backend": "vllm"}, refresh={"mode": "frozen"}).spec) == "none"
    assert budget_route(das.spec.model_copy(update={"enabled": False})) == "none"
    # model drafter + non-uniform budget: k by batch size, derived from the cost model
    dm = _cfg(drafter="draft_model", draft_model={"model": "/d"}, num_speculative_tokens=4,
              refresh={"mode": "frozen"}, scheduling={"budget": "length_aware", "placement": "length_aware"})
    assert budget_route(dm.spec) == "k_by_batch_size"
    new, sched = scheduled_config(dm, cost_model={"c_tok": 1 / 32})
    assert sched == k_by_batch_size_schedule(256, 4, c_tok=1 / 32)
    assert sched[0][2] == 4 and sched[-1][2] < 4                       # k rises as the batch drains
    vllm = to_vllm_speculative_config(new.spec)
    assert vllm["num_speculative_tokens_per_batch_size"] == [list(t) for t in sched]
    assert new.spec.scheduling.placement == "length_aware"             # the rest of the block is kept
    assert to_vllm_speculative_config(dm.spec).get("num_speculative_tokens_per_batch_size") is None
    # an explicit schedule is used as written; uniform budget or no-spec baseline: nothing derived
    explicit = _cfg(
        drafter="draft_model",
        draft_model={"model": "/d"},
        num_speculative_tokens=4,
        refresh={"mode": "frozen"},
        scheduling={"budget": "das", "k_by_batch_size": [[1, 8, 4], [9, 64, 0]]},
    )
    assert scheduled_config(explicit) == (explicit, None)
    uni = _cfg(drafter="draft_model", draft_model={"model": "/d"}, refresh={"mode": "frozen"})
    assert scheduled_config(uni)[1] is None
    assert scheduled_config(dm, spec_enabled=False)[1] is None
    # the schedule covers the engine's batch sizes: vllm_cfg.max_num_seqs when set
    capped = validate_run_dict({**dm.raw, "policy": {**dm.raw["policy"], "generation": {
        **dm.raw["policy"]["generation"], "vllm_cfg": {"max_num_seqs": 8}}}})
    assert scheduled_config(capped)[1] == k_by_batch_size_schedule(8, 4)


# --------------------------------------------------------------------------- bench: simulated bound

def _measured_batch(lengths, problem_ids, predicted):
    from nemo_rl_specdec.driver.group import GroupGenerateResult
    from nemo_rl_specdec.metrics import SpecMetrics
    from nemo_rl_specdec.rollouts import Rollout

    rollouts = [Rollout(i, pid, [1] * 12, [7] * int(L), [0.0] * int(L), "stop", 0, 0, 0)
                for i, (pid, L) in enumerate(zip(problem_ids, lengths, strict=True))]
    return GroupGenerateResult(rollouts, SpecMetrics(), predicted_len=list(predicted))


def test_placement_reference_replays_every_measured_batch():
    """Exact predictions make length_aware the reference placement, and on a grouped long tail
    it cuts the contiguous makespan; predictions from other batches do not beat clairvoyance."""
    from nemo_rl_specdec.bench.scheduling import placement_reference

    reqs, true_len = grouped_long_tail(seed=3)
    lengths = [round(L) for L in true_len]
    pids = [r.problem_id for r in reqs]
    exact = _measured_batch(lengths, pids, lengths)
    key = ("none", "contiguous", "uniform")
    b = placement_reference({key: [exact]}, {key: [0]}, engines=2, max_num_seqs=8)
    assert b["batches"] == 1
    assert b["length_aware_cut_pct"] == b["reference_cut_pct"]
    assert b["reference_cut_pct"]["median"] > 0
    assert b["length_aware_share_of_reference"] == 1.0
    assert b["reference_cut_pct_by_draw"] == {0: b["reference_cut_pct"]["mean"]}

    noisy = [_measured_batch(lengths, pids, [r.predicted_len for r in grouped_long_tail(seed=s)[0]])
             for s in (3, 4, 5)]
    other = ("suffix", "length_aware", "uniform")
    b = placement_reference({other: noisy, key: [exact]}, {other: [0, 1, 1], key: [0]}, engines=2, max_num_seqs=8)
    assert b["batches"] == 4 and sorted(b["reference_cut_pct_by_draw"]) == [0, 1]
    assert b["reference_cut_pct"]["mean"] >= b["length_aware_cut_pct"]["mean"] - 1.0


def test_reference_share_judges_each_draw_against_its_own_reference_cut():
    from nemo_rl_specdec.bench.scheduling import reference_share
    from nemo_rl_specdec.driver.group import GroupGenerateResult
    from nemo_rl_specdec.metrics import SpecMetrics

    def run(makespan):
        return GroupGenerateResult([], SpecMetrics(), makespan_s=makespan)

    la, co = ("suffix", "length_aware", "uniform"), ("suffix", "contiguous", "uniform")
    runs = {co: [run(10), run(10), run(8)], la: [run(9), run(8), run(7)]}   # cuts 10%, 20% (draw 0); 12.5% (draw 1)
    draws = {co: [0, 0, 1], la: [0, 0, 1]}
    out = reference_share(runs, draws, la, {0: 20.0, 1: 25.0})
    assert out["share_of_reference_cut_per_draw"] == pytest.approx([15.0 / 20.0, 12.5 / 25.0])
    assert out["share_of_reference_cut"] == pytest.approx((0.75 + 0.5) / 2)
    assert reference_share(runs, draws, co, {0: 20.0})["share_of_reference_cut"] is None
    # a draw with no placement headroom is not judged: its share would be noise over nearly nothing
    assert reference_share(runs, draws, la, {0: 1.0, 1: 25.0})["share_of_reference_cut_per_draw"] == [0.5]


def test_das_prices_a_request_through_the_cost_model_as_its_old_formula_did():
    """`das_budgets` prices a request's share of a step with `CostModel.request_s`; it gives the numbers
    of the formula das_budgets wrote itself before, bit for bit, and the same budgets."""
    from nemo_rl_specdec.cost.model import CostModel

    rng = np.random.default_rng(5)
    ds = np.arange(9)
    for c_tok, c_draft in ((1 / 64, 0.0), (1.0, 0.5), (4e-5, 1e-5), (0.0, 0.0), (0.1, 1 / 3)):
        cr = np.concatenate([[0.0, 1e-3, 5.0], rng.random(20) * rng.choice([1e-6, 1e-3, 1.0], 20)])
        old = cr[:, None] + c_tok * (1.0 + ds)[None, :] + c_draft * ds[None, :]
        new = CostModel(c_tok=c_tok, c_ctx=1.0, draft_tok=c_draft).request_s(ds[None, :], cr[:, None])
        assert np.array_equal(new, old)
    # budgets computed by the old formula's das_budgets (the commit before this test)
    cases = [
        (([10, 500, 2000], 4, 0.7, 1.0, 1 / 64, 0.01, [0.0, 1e-3, 5.0]), [0, 0, 4]),
        (([300, 300, 300, 1200, 40], 8, 1.0, 1.0, 1.0 / 64, 0.0, 0.0), [2, 2, 2, 8, 0]),
        (([300, 300, 300, 1200, 40], 8, 1.0, 1.0, 0.1, 0.0, 0.0), [3, 3, 3, 8, 0]),
        (([5, 80, 800, 3000, 3000, 0], 6, [0.9, 0.7, 0.5, 0.3], 2e-3, 4e-5, 1e-5,
          [1e-4, 0.0, 2e-3, 1e-3, 0.0, 0.0]), [2, 0, 6, 6, 6, 0]),
        (([100, 900, 1500, 2500], 5, 0.3, 1.0, 1.0, 0.5, 0.25), [0, 0, 0, 0]),
        (([1000] * 6 + [4000], 3, 0.6, 1.0, 1 / 3, 0.0, [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]), [0, 0, 0, 1, 1, 1, 2]),
    ]
    for args, want in cases:
        assert das_budgets(*args) == want
