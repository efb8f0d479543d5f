"""bench/ceilings.py: each ceiling checked as a bound on small instances, by brute force where the
instance allows it (every placement; every path of a request through its text) and against the
real drafters replayed on the same text."""
import itertools
import random

import numpy as np
import pytest

from nemo_rl_specdec.bench.ceilings import (
    PlacementPricer,
    RequestSteps,
    fewest_forwards,
    history_share,
    hybrid_bound,
    longest_known,
    placement_ceiling,
    request_steps,
)
from nemo_rl_specdec.cost.model import Step
from nemo_rl_specdec.cost.price import price
from nemo_rl_specdec.cost.profile import load_profile
from nemo_rl_specdec.cost.trace import Trace, TraceStep


@pytest.fixture(scope="module")
def cost():
    return load_profile("h100_qwen3_8b").cost_model("das")


def _requests(rng: random.Random, n: int) -> list:
    out = []
    for _ in range(n):
        rows = rng.choice([1, 3, 8, 20, 60, 150])
        prompt = rng.randrange(20, 400)
        ctx = tuple(prompt + 3 * j for j in range(rows))
        out.append(RequestSteps(prompt, ctx, tuple(rng.randrange(0, 9) for _ in range(rows))))
    return out


def test_the_cost_function_is_monotone_in_a_steps_rows(cost):
    """The lower bound's premise: adding a request's row (or prefill tokens) to a step never makes it cheaper."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 300))
        ctx, d = rng.integers(1, 8000, n).astype(float), rng.integers(0, 25, n).astype(float)
        for proposer in (True, False):
            whole = cost.cost(Step.of(ctx, d, proposer=proposer)).total_s
            part = cost.cost(Step.of(ctx[:-1], d[:-1], proposer=proposer and n > 1)).total_s
            assert whole >= part - 1e-15
        p = float(rng.integers(1, 4000))
        assert cost.cost(Step.of([], [], p + 50)).total_s >= cost.cost(Step.of([], [], p)).total_s


def _partitions(n: int, engines: int):
    for labels in itertools.product(range(engines), repeat=n):
        yield [[i for i in range(n) if labels[i] == e] for e in range(engines)]


@pytest.mark.parametrize("slots", [None, 2])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_placement_beats_the_lower_bound_and_the_search_is_a_placement_at_most_every_start(cost, slots, seed):
    rng = random.Random(seed)
    reqs = _requests(rng, 6)
    pricer = PlacementPricer(reqs, cost, slots)
    lb = pricer.lower_bound(2)["lower_bound_s"]
    best = math_inf = float("inf")
    for a in _partitions(len(reqs), 2):
        for order in (a, [e[::-1] for e in a]):   # the admission order too
            span = pricer.makespan(order)
            assert lb <= span + 1e-12
            best = min(best, span)
    assert best < math_inf
    starts = {"contiguous": [[0, 1, 2], [3, 4, 5]], "round_robin": [[0, 2, 4], [1, 3, 5]]}
    c = placement_ceiling(pricer, 2, starts)
    assert sorted(i for e in c["search_assignment"] for i in e) == list(range(6))
    assert c["search_s"] == pytest.approx(pricer.makespan(c["search_assignment"]))
    assert lb <= best + 1e-12 <= c["search_s"] + 1e-12
    for name, span in c["makespan_s"].items():
        assert c["search_s"] <= span + 1e-12
        assert c["share_of_bound"][name] <= c["share_of_search"][name] + 1e-12
    # a local search, not an exhaustive one: on six requests it ends within 10% of the optimum
    assert c["search_s"] <= 1.10 * best


def test_the_fixed_steps_objective_of_one_engine_is_the_priced_trace(cost):
    """One engine running every request as the replay scheduled them is the trace's priced rollout."""
    prompts = [30, 40, 50]
    steps = [TraceStep([], [], [], [], sum(prompts), None, 3),
             TraceStep([0, 1, 2], [30, 40, 50], [3, 0, 2], [3, 0, 1], 0, 1e-4),
             TraceStep([0, 1, 2], [34, 41, 52], [1, 4, 0], [0, 4, 0], 0, 1e-4),
             TraceStep([1, 2], [46, 53], [2, 2], [2, 2], 0, 1e-4)]
    trace = Trace("list", 4, steps, "das")
    reqs = request_steps(trace, prompts)
    assert [r.rows for r in reqs] == [2, 3, 3]
    pricer = PlacementPricer(reqs, cost, None)
    profile = load_profile("h100_qwen3_8b")
    assert pricer.engine_s([0, 1, 2]) == pytest.approx(price(trace, profile).rollout_s, rel=1e-12)


def test_longest_known_is_the_longest_occurring_prefix():
    from nemo_rl_specdec.bench.ceilings import _grams_ending

    text = [1, 2, 3, 4, 5, 1, 2, 9]
    g: set = set()
    _grams_ending(g, text, 0, len(text), 4)
    assert longest_known(g, [1, 2, 3, 7]) == 3
    assert longest_known(g, [2, 9, 1]) == 2
    assert longest_known(g, [7]) == 0
    assert longest_known(g, []) == 0
    assert longest_known(g, [2, 9], lead=[1]) == 2          # 1 2 9 occurs
    assert longest_known(g, [2, 3, 4], lead=[1]) == 3       # 1 2 3 4 occurs
    assert longest_known(g, [3, 4], lead=[1]) == 0          # 3 follows 1 nowhere, though 3 4 occurs
    assert longest_known(g, [1, 2], lead=[4, 5]) == 2


def _best_continuation(texts, context, future, m):
    """Brute force: over every occurrence in `texts` of every suffix of `context` at least m long,
    the longest continuation equal to a prefix of `future`."""
    best = 0
    for s in range(m, len(context) + 1):
        suffix = list(context[len(context) - s:])
        for t in texts:
            for e in range(s, len(t) + 1):
                if t[e - s:e] == suffix:
                    a = 0
                    while a < len(future) and e + a < len(t) and t[e + a] == future[a]:
                        a += 1
                    best = max(best, a)
    return best


@pytest.mark.parametrize("m", [1, 2])
def test_the_hindsight_draft_is_the_best_continuation_of_a_context_match(m):
    """HindsightHistory's draft at every step is the brute-force best: the longest run of the true
    next tokens that continues an occurrence, in the text a store could hold by then, of a suffix of
    the context at least m long. Replayed through the real replay, every step checked."""
    from nemo_rl_specdec.bench.ceilings import HindsightHistory, _texts
    from nemo_rl_specdec.bench.replay import replay

    batches = _text_batches(random.Random(11), 3, 2, 2, vocab=4)
    texts = _texts(batches)
    h = HindsightHistory(texts, 3, m)
    checked = free = 0
    inner = h.propose
    upto: dict = {}

    def propose(batch, sampled, requests):
        out = inner(batch, sampled, requests)
        nonlocal checked, free
        rids = list(batch.req_ids)
        ns = [int(x) for x in batch.num_tokens_no_spec[:len(rids)]]
        keys = [tuple(int(x) for x in r.rsplit("-", 2)[1:]) for r in rids]
        v = keys[0][0]
        for key, n in zip(keys, ns, strict=True):
            upto[key] = n
        held = [t for (w, _), t in texts.items() if w < v]   # earlier batches, whole
        # the batch's requests: their verified tokens (a finished one's, all of them), else their prompt
        held += [texts[(w, j)][:upto.get((w, j), len(batches[w][j]["prompt_token_ids"]))] for (w, j) in texts if w == v]
        for key, n, d in zip(keys, ns, out, strict=True):
            t = texts[key]
            future = t[n:n + 3]
            assert len(d) == _best_continuation(held, t[:n], future, m) and list(d) == future[:len(d)]
            free += _best_continuation(held, t[:n], future, 0) > len(d)
            checked += 1
        return out
    h.drafter.propose = propose
    replay(_spec(3), batches, max_model_len=256, drafter=h.drafter, label="brute")
    assert checked > 50 and free > 0   # many steps, and the context match does cut some drafts


def _paths(reach):
    """Every path's forward count from 0 to len(reach) (brute force)."""
    n = len(reach)
    out = []

    def walk(p, f):
        if p == n:
            out.append(f)
            return
        for q in range(p + 1, min(n, p + 1 + reach[p]) + 1):
            walk(q, f + 1)
    walk(0, 0)
    return out


def test_fewest_forwards_is_the_shortest_path():
    rng = random.Random(3)
    for _ in range(200):
        reach = [rng.randrange(0, 4) for _ in range(rng.randrange(1, 11))]
        assert fewest_forwards(reach) == min(_paths(reach))


def _text_batches(rng: random.Random, steps: int, problems: int, samples: int, vocab: int = 6):
    out = []
    for _ in range(steps):
        batch = []
        for p in range(problems):
            for _ in range(samples):
                batch.append({"problem_id": f"p{p}", "prompt_token_ids": [100 + p, 101 + p, 102],
                              "token_ids": [rng.randrange(vocab) for _ in range(rng.randrange(4, 40))]})
        out.append(batch)
    return out


def test_the_hybrid_bound_beats_every_rule_choosing_between_the_two_drafts():
    """Any rule (here random ones) committing at each step at most the better of the history
    hindsight and the model draft there, run through the text, makes no more tokens per forward."""
    from nemo_rl_specdec.bench.ceilings import _grams_ending

    rng = random.Random(5)
    k = 4
    batches = _text_batches(rng, 3, 2, 2)
    model = {}

    def model_accepted(v, i, n):
        return model.setdefault((v, i, n), rng.randrange(0, k + 1))
    bound = hybrid_bound(batches, k, model_accepted)["tokens_per_target_forward"]
    for _ in range(20):
        gen = fwd = 0
        history: set = set()
        for v, rs in enumerate(batches):
            texts = [r["prompt_token_ids"] + r["token_ids"] for r in rs]
            grams: set = set()
            for t in texts:   # a store holding at most what the bound allows: here every sibling, whole
                _grams_ending(grams, t, 0, len(t), k)
            for i, t in enumerate(texts):
                plen = len(rs[i]["prompt_token_ids"])
                n, f = plen + 1, 1
                own: set = set()
                _grams_ending(own, t, 0, n, k)
                others: set = set()
                for j, u in enumerate(texts):
                    if j != i:
                        _grams_ending(others, u, 0, len(u), k)
                while n < len(t):
                    future = t[n:n + k]
                    h = longest_known(_Either(history, others, own), future)
                    a = min(model_accepted(v, i, n), len(future))
                    take = rng.choice([h, a, rng.randrange(0, max(h, a) + 1), 0])
                    _grams_ending(own, t, n, min(len(t), n + take + 1), k)
                    n = min(len(t), n + take + 1)
                    f += 1
                gen += len(t) - plen
                fwd += f
            history |= grams
        assert gen / fwd <= bound + 1e-12


class _Either:
    def __init__(self, *sets):
        self.sets = sets

    def __contains__(self, x):
        return any(x in s for s in self.sets)


def test_a_share_names_the_property_that_limits_it():
    ceiling = {"tokens_per_target_forward": 2.0, "coverage": 0.5, "match_length": 3.0}
    low_cov = history_share(1.5, {"coverage": 0.25, "match_length": 2.9}, ceiling)
    assert low_cov["share"] == pytest.approx(0.75) and low_cov["limited_by"] == "coverage"
    short = history_share(1.5, {"coverage": 0.5, "match_length": 1.5}, ceiling)
    assert short["limited_by"] == "match length"
    near = history_share(1.9, {"coverage": 0.5, "match_length": 2.8}, ceiling)
    assert near["share"] == pytest.approx(0.95) and near["limited_by"] == "match length" and "met" not in near


# ------------------------------------------------------------------- against the real history drafters

arctic = pytest.importorskip("arctic_inference.suffix_decoding._C")


def _spec(k):
    from nemo_rl_specdec.config.run import load_run_config
    from nemo_rl_specdec.resources import config_path

    return load_run_config(config_path("tiny_cpu.yaml"),
                           [f"policy.generation.speculative_decoding.num_speculative_tokens={k}"]).spec


def _rows():
    from nemo_rl_specdec.bench import das
    from nemo_rl_specdec.config.run import load_run_config
    from nemo_rl_specdec.resources import config_path

    cfg = load_run_config(config_path("tiny_cpu.yaml"), ["bench.das.windows=[4]", "bench.das.scopes=[both]",
                                                          "policy.generation.speculative_decoding.num_speculative_tokens=4"])
    return {c["name"]: c["cfg"].spec for c in das.configurations(cfg, das._options(cfg))}


@pytest.mark.parametrize("name", ["das_w4_both", "vllm_suffix", "ngram"])
@pytest.mark.parametrize("seed", [0, 1])
def test_no_history_drafter_beats_the_hindsight_ceiling(name, seed):
    from nemo_rl_specdec.bench.ceilings import history_ceiling
    from nemo_rl_specdec.bench.replay import replay

    spec = _rows()[name]
    batches = _text_batches(random.Random(seed), 3, 2, 3, vocab=4)
    rows = replay(spec, batches, max_model_len=256)
    ceiling = history_ceiling(spec, batches, max_model_len=256)
    assert ceiling["k"] == spec.num_speculative_tokens
    gen = sum(r["generated_tokens"] for r in rows)
    fwd = sum(r["target_forwards"] for r in rows)
    assert gen / fwd <= ceiling["tokens_per_target_forward"] + 1e-12
    for r, c in zip(rows, ceiling["per_batch"], strict=True):   # batch by batch too
        assert r["tokens_per_target_forward"] <= c + 1e-12
    assert gen > fwd   # the drafters do find drafts on this text: the check is not vacuous


def test_the_das_suite_rows_get_their_share_of_the_ceiling_at_their_k():
    from nemo_rl_specdec.bench.ceilings import history_lines, judge_history
    from nemo_rl_specdec.bench.replay import replay

    specs = _rows()
    batches = _text_batches(random.Random(7), 3, 2, 3, vocab=4)
    results = []
    for name in ("das_w4_both", "vllm_suffix"):
        rows = replay(specs[name], batches, max_model_len=256)
        gen, fwd = sum(r["generated_tokens"] for r in rows), sum(r["target_forwards"] for r in rows)
        results.append({"name": name, "k": specs[name].num_speculative_tokens,
                        "replay_tokens_per_target_forward": gen / fwd,
                        "replay_per_step": [{"trace": r["trace"].to_dict()} for r in rows]})
    ceilings = judge_history(results, batches, specs["das_w4_both"], 256)
    assert list(ceilings) == [4]
    for r in results:
        h = r["history_ceiling"]
        assert 0 < h["share"] <= 1.0 and h["ceiling"] == ceilings[4] and ceilings[4]["k"] == 4
        assert h["coverage"] == pytest.approx(h["coverage_ratio"] * ceilings[4]["coverage"])
        assert h["match_length"] == pytest.approx(h["match_length_ratio"] * ceilings[4]["match_length"])
        assert h["limited_by"] in ("coverage", "match length") and "met" not in h
    lines = history_lines(results, "das_w4_both")
    assert lines[0].startswith("history hindsight ceiling at k=4")
    assert lines[1].endswith(f"its share is limited most by {results[0]['history_ceiling']['limited_by']}")
    assert not any("target >=" in line or "MISSED" in line for line in lines)
    assert f"coverage {100 * ceilings[4]['coverage']:.1f}%" in lines[0]


def test_the_scheduling_summary_counts_every_draw_and_reports_the_interval():
    from nemo_rl_specdec.bench import scheduling

    def row(draw, lo, hi):
        return {"max_num_seqs": None, "draw": draw, "cut_pct": {"length_aware": 5.0, "reference": 4.0},
                "priced_speedup": {"length_aware": 1.2, "reference": 1.1},
                "ceiling": {"share_of_bound": {"length_aware": lo, "reference": lo},
                            "share_of_search": {"length_aware": hi, "reference": hi},
                            "search_between_bound_and": {"length_aware": 0.5, "reference": 0.5},
                            "set_by": "tail length"}}
    opts = {"max_num_seqs": [None], "placements": ["contiguous", "length_aware"],
            "profile": load_profile("h100_qwen3_8b")}
    out = scheduling._priced_summary([row(d, 0.8, 0.95) for d in range(5)], opts)
    la = next(r for r in out if r["placement"] == "length_aware")
    assert la["draws"] == 5 and "verdict" not in la
    assert la["share_of_ceiling_bound"] == pytest.approx(0.8) and la["share_of_ceiling_search"] == pytest.approx(0.95)
    assert la["ceiling_set_by_per_draw"] == ["tail length"] * 5
