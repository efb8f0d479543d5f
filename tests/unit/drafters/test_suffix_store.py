"""The DAS rollout store without an engine: placement by scope, exact window eviction, memory cap,
input validation, and the proposer's per-request logic against a fake runner."""
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("arctic_inference.suffix_decoding._C")

from nemo_rl_specdec.drafters.machinery.store import RolloutStore, StoreInputError  # noqa: E402
from nemo_rl_specdec.rollouts import Rollout  # noqa: E402

PROMPT = [5, 6, 7, 8]


def ctx(*tokens):
    return np.array(tokens, dtype=np.int32)


def rollout(tokens, version, pid="p0", prompt=PROMPT):
    return {"problem_id": pid, "prompt_token_ids": list(prompt), "token_ids": list(tokens), "policy_version": version}


def all_drafts(store, contexts, pid, k=8):
    """Every draft the store proposes for the given contexts (factor large, no prob threshold)."""
    out = []
    for c in contexts:
        out.append(tuple(store.speculate(ctx(*c), pid, k, max_spec_factor=100.0, min_token_prob=0.0).token_ids))
    return out


def test_prompt_tail_lets_a_new_request_draft_its_first_tokens():
    s = RolloutStore(window_steps=2, scope="problem", max_tree_depth=16)
    assert s.rebuild([rollout([40, 41, 42, 43], 0)], version=1) == 1
    # arctic matches at most len(context) - 1 tokens; a real context has more before the prompt tail
    d = s.speculate(ctx(3, *PROMPT), "p0", 8, max_spec_factor=1.0, min_token_prob=0.1)
    assert d.token_ids == [40, 41, 42, 43] and d.source == "problem" and d.match_len == 4
    # only the last max_tree_depth-1 prompt tokens are stored
    s2 = RolloutStore(window_steps=1, scope="problem", max_tree_depth=4)
    s2.add([9, 9], version=0, problem_id="x", prompt_token_ids=list(range(100, 200)))
    assert s2.entries()[0].num_tokens == 3 + 2


def test_draft_length_follows_match_length_and_probability():
    s = RolloutStore(window_steps=4, scope="problem", max_tree_depth=32)
    s.add([1, 2, 3, 4, 5, 6, 7, 8, 9], version=0, problem_id="p", prompt_token_ids=[])
    # arctic matches at most len(context) - 1 trailing tokens: ctx (0, 1) matches "1"
    d = s.speculate(ctx(0, 1), "p", 8, max_spec_factor=2.0, min_token_prob=0.0)
    assert d.token_ids == [2, 3] and d.match_len == 1  # factor 2 x match 1
    d = s.speculate(ctx(0, 1, 2, 3), "p", 8, max_spec_factor=1.0, min_token_prob=0.0)
    assert d.token_ids == [4, 5, 6] and d.match_len == 3
    # cap by max_spec_tokens
    assert s.speculate(ctx(0, 1, 2, 3), "p", 2, max_spec_factor=10.0, min_token_prob=0.0).token_ids == [4, 5]
    # a split continuation (two rollouts disagree after 1 2) has p = 0.5 per branch
    s.add([1, 2, 30, 31, 32], version=0, problem_id="p")
    assert s.speculate(ctx(0, 1, 2), "p", 8, max_spec_factor=10.0, min_token_prob=0.6).token_ids == []
    d = s.speculate(ctx(0, 1, 2), "p", 8, max_spec_factor=10.0, min_token_prob=0.4)
    assert len(d.token_ids) >= 1 and d.probs[0] == pytest.approx(0.5)
    assert s.speculate(ctx(0, 1, 2), "p", 0).token_ids == []


def test_window_eviction_is_exact_sentinel_never_proposed():
    sentinel = [90, 91, 92, 93, 94, 95, 96, 97]
    s = RolloutStore(window_steps=2, scope="both", max_tree_depth=16)
    s.rebuild([rollout(sentinel, 0), rollout([10, 11, 12], 0, pid="q")], version=1)
    # contexts that end in the prompt or anywhere inside the sentinel (arctic needs >= 2 tokens)
    probe = [[3] + PROMPT] + [[0] + sentinel[:j] for j in range(1, len(sentinel))] \
        + [[0, t] for t in sentinel[:-1]]
    present = all_drafts(s, probe, "p0")
    assert all(d and set(d) <= set(sentinel) for d in present), present  # proposed while in the window
    assert all(all_drafts(s, probe, None))  # from the global tree too (scope both)
    s.rebuild([rollout([20, 21, 22], 1)], version=2)
    assert s.versions() == [0, 1]
    s.rebuild([rollout([30, 31, 32], 2)], version=3)  # window {1, 2}: version 0 must be gone
    assert s.versions() == [1, 2]
    assert s.stats()["evicted_window"] == 2
    drafts = all_drafts(s, probe, "p0") + all_drafts(s, probe, None) + all_drafts(s, probe, "q")
    assert not any(t in sentinel for d in drafts for t in d), drafts
    assert "q" not in s._problem_trees  # an emptied problem tree is freed
    # what is left still drafts: the window's content
    assert s.speculate(ctx(3, *PROMPT), "p0", 8, 100.0, 0.0).token_ids[0] in (20, 30)


def test_window_uses_producing_version_and_never_moves_back():
    s = RolloutStore(window_steps=1, scope="problem", max_tree_depth=8)
    # update to version 5 with rollouts from version 4 (sync pipeline): they are the window
    assert s.rebuild([rollout([1, 2], 4)], version=5) == 1
    assert s.versions() == [4] and s.min_version == 4
    # a late rollout from a version older than the window is not added
    assert s.rebuild([rollout([3, 4], 3)], version=5) == 0
    assert s.stats()["rejected_old"] == 1 and len(s) == 1
    s.slide(2)  # moving back is a no-op
    assert s.newest_version == 4
    with pytest.raises(StoreInputError, match="future policy"):
        s.rebuild([rollout([1], 7)], version=6)


def test_problem_isolation_with_problem_scope():
    s = RolloutStore(window_steps=4, scope="problem", max_tree_depth=16)
    s.rebuild([rollout([10, 11, 12, 13], 0, pid="A"), rollout([20, 21, 22, 23], 0, pid="B"),
               rollout([30, 31, 32, 33], 0, pid=None)], version=1)
    probe = [PROMPT, [10], [20], [30], [10, 11], [20, 21], [30, 31]]
    a = {t for d in all_drafts(s, probe, "A") for t in d}
    b = {t for d in all_drafts(s, probe, "B") for t in d}
    none = {t for d in all_drafts(s, probe, None) for t in d}
    assert a and a <= {10, 11, 12, 13}
    assert b and b <= {20, 21, 22, 23}
    assert none and none <= {30, 31, 32, 33}  # requests without id: the global tree of id-less rollouts
    assert all_drafts(s, probe, "C") == [()] * len(probe)  # unknown problem: nothing
    # scope=global shares across problems; scope=both picks the better of the two
    g = RolloutStore(window_steps=4, scope="global", max_tree_depth=16)
    g.rebuild([rollout([10, 11, 12, 13], 0, pid="A")], version=1)
    assert g.speculate(ctx(10, 11), "B", 8, 10.0, 0.0).token_ids == [12, 13]
    assert g.stats()["problems"] == 0 and g.stats()["global_entries"] == 1
    both = RolloutStore(window_steps=4, scope="both", max_tree_depth=16)
    both.rebuild([rollout([10, 11, 12, 13], 0, pid="A")], version=1)
    assert both.speculate(ctx(10, 11), "B", 8, 10.0, 0.0).source == "global"
    assert both.speculate(ctx(10, 11), "A", 8, 10.0, 0.0).token_ids == [12, 13]


def test_memory_cap_evicts_oldest_versions_first():
    rng = np.random.default_rng(0)
    free = RolloutStore(window_steps=10, scope="both", max_tree_depth=16, max_memory_bytes=None)
    for v in range(4):
        for j in range(3):
            free.add(rng.integers(0, 50, 60).tolist(), version=v, problem_id=f"p{j}")
    full = free.bytes()
    cap = full // 2
    s = RolloutStore(window_steps=10, scope="both", max_tree_depth=16, max_memory_bytes=cap)
    rng = np.random.default_rng(0)
    for v in range(4):
        rows = [{"problem_id": f"p{j}", "prompt_token_ids": [], "token_ids": rng.integers(0, 50, 60).tolist(),
                 "policy_version": v} for j in range(3)]
        s.rebuild(rows, version=v + 1)
        assert s.bytes() <= cap
    st = s.stats()
    assert st["evicted_memory"] > 0 and 0 < st["entries"] < 12
    # the survivors are the newest: every evicted version is older than every kept one
    kept = s.versions()
    assert kept[-1] == 3 and set(range(kept[0], 4)) == set(kept)
    # a cap below one entry leaves an empty store (never a store over its cap)
    tiny = RolloutStore(window_steps=2, scope="problem", max_tree_depth=16, max_memory_bytes=10)
    tiny.rebuild([rollout(list(range(40)), 0)], version=1)
    assert len(tiny) == 0 and tiny.bytes() <= 10


def _continuations(tree, context, n=100):
    """Every continuation the tree knows for `context` with its probability (arctic tree speculation),
    or None when the candidate tree was truncated at `n` nodes."""
    d = tree.speculate(list(context), n, 100.0, 0.0, 0.0, True)
    if len(d.token_ids) >= n:
        return None
    paths = set()
    for i in range(len(d.token_ids)):
        p, j = [], i
        while j != -1:
            p.append(d.token_ids[j])
            j = d.parents[j]
        paths.add((tuple(reversed(p)), round(d.probs[i], 5)))
    return d.match_len, paths


def test_remove_is_exact_against_a_fresh_tree():
    """After removing entries, every context sees exactly the continuations (and probabilities) of a
    store that never had them. (Greedy single drafts may differ on ties: arctic's child order
    after removals is not insertion order; the content is the same.)"""
    rng = np.random.default_rng(1)
    seqs = [rng.integers(0, 6, 40).tolist() for _ in range(8)]
    a = RolloutStore(window_steps=10, scope="problem", max_tree_depth=12, max_memory_bytes=None)
    ids = [a.add(q, version=i, problem_id="p") for i, q in enumerate(seqs)]
    full = a.bytes()
    for sid in ids[:4]:
        a.remove(sid)
    assert a.bytes() < full
    b = RolloutStore(window_steps=10, scope="problem", max_tree_depth=12, max_memory_bytes=None)
    for i, q in enumerate(seqs[4:], start=4):
        b.add(q, version=i, problem_id="p")
    compared = 0
    for _ in range(600):
        c = rng.integers(0, 6, int(rng.integers(2, 12))).tolist()
        ca, cb = _continuations(a._problem_trees["p"], c), _continuations(b._problem_trees["p"], c)
        if ca is None or cb is None:
            continue
        assert ca == cb, c
        compared += 1
    assert compared > 300


@pytest.mark.parametrize("bad, match", [
    ("not a list", "expected a list"),
    ([{"token_ids": [1]}], "missing key"),
    ([{"token_ids": [1], "policy_version": "3"}], "policy version"),
    ([{"token_ids": "abc", "policy_version": 0}], "sequence of token ids"),
    ([{"token_ids": [1, 2.5], "policy_version": 0}], "must be ints"),
    ([{"token_ids": [1, -2], "policy_version": 0}], r"\[0, 2\^31\)"),
    ([{"token_ids": [1], "policy_version": 0, "problem_id": 7}], "problem_id"),
    ([[1, 2, 3]], "expected a dict"),
])
def test_malformed_rollouts_are_rejected_atomically(bad, match):
    s = RolloutStore(window_steps=2, scope="both", max_tree_depth=8)
    s.rebuild([rollout([1, 2, 3], 0)], version=1)
    before = s.stats()
    rows = bad if isinstance(bad, str) else [rollout([4, 5], 1)] + bad
    with pytest.raises(StoreInputError, match=match):
        s.rebuild(rows, version=2)
    assert s.stats() == before  # nothing was added, nothing slid


def test_bad_construction_arguments():
    with pytest.raises(ValueError, match="scope"):
        RolloutStore(scope="everything")
    with pytest.raises(ValueError, match="window_steps"):
        RolloutStore(window_steps=0)
    with pytest.raises(ValueError, match="max_memory_bytes"):
        RolloutStore(max_memory_bytes=0)


# ---------------------------------------------------------------------- proposer without an engine

def _fake_vllm_config(k=4, max_model_len=64):
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(max_model_len=max_model_len))


class _FakeRunner:
    """Just the attributes DASProposer reads: input_batch.req_ids and requests[id].sampling_params."""

    def __init__(self, rows, max_model_len=64):
        self.input_batch = SimpleNamespace(req_ids=[r[0] for r in rows])
        self.requests = {rid: SimpleNamespace(sampling_params=SimpleNamespace(extra_args=extra))
                         for rid, extra, _ in rows}
        self.tokens = np.zeros((len(rows), max_model_len), dtype=np.int32)
        self.n = np.zeros(len(rows), dtype=np.int64)
        for i, (_, _, toks) in enumerate(rows):
            self.tokens[i, :len(toks)] = toks
            self.n[i] = len(toks)


def _proposer(k=4, window=2, scope="both", max_model_len=64):
    from nemo_rl_specdec.drafters.suffix import DASProposer

    p = DASProposer(_fake_vllm_config(k, max_model_len))
    p.configure({"suffix": {"window_steps": window, "scope": scope, "max_tree_depth": 16, "min_token_prob": 0.0,
                            "max_spec_factor": 100.0}})
    return p


def test_proposer_budget_clamp_and_problem_lookup():
    p = _proposer(k=4)
    resp = list(range(40, 52))
    assert p.specdec_rebuild([rollout(resp, 0, pid="A")], 1) == 1
    rows = [("r0-aaaa", {"problem_id": "A"}, PROMPT),                            # full k
            ("r1-bbbb", {"problem_id": "A", "specdec_budget": 2}, PROMPT),       # budget 2
            ("r2-cccc", {"problem_id": "A", "specdec_budget": 0}, PROMPT),       # budget 0: nothing
            ("r3-dddd", {"problem_id": "B"}, PROMPT),                            # scope both: global tree
            ("r4-eeee", None, PROMPT),                                           # no extra_args: global
            ("r5-ffff", {"problem_id": "A"}, PROMPT)]                            # partial prefill
    r = _FakeRunner(rows)
    p.specdec_attach(r, {"suffix": p.settings})  # attach re-configures: store rebuilt empty
    p.specdec_rebuild([rollout(resp, 0, pid="A")], 1)
    sampled = [[1], [1], [1], [1], [1], []]
    out = p.propose(sampled, r.n, r.tokens)
    assert out[0] == resp[:4]  # clamped to k even though the match allows more
    assert out[1] == resp[:2]
    assert out[2] == [] and out[5] == []
    assert out[3] == resp[:4] and out[4] == resp[:4]
    assert all(len(d) <= 4 for d in out)
    c = p.specdec_stats()["counters"]
    assert c["budget_zero"] == 1 and c["from_problem"] == 2 and c["from_global"] == 2
    # finished requests are forgotten at the next call
    r.input_batch.req_ids = ["r0-aaaa"]
    p.propose([[1]], r.n[:1], r.tokens[:1])
    assert p.specdec_stats()["active_requests"] == 1


def test_proposer_never_exceeds_model_len_or_k_and_uses_own_tokens():
    p = _proposer(k=8, max_model_len=10)
    r = _FakeRunner([("x-1", {"problem_id": "A"}, [3, 1, 2, 3, 1, 2, 3])], max_model_len=10)
    # only the per-request tree may see the request's own tokens here
    p.specdec_attach(r, {"suffix": {**p.settings, "share_in_flight": "off"}})
    # empty store: the request's own tokens (local tree) give the draft, cut at max_model_len - n - 1 = 2
    out = p.propose([[3]], r.n, r.tokens)
    assert out == [[1, 2]]
    assert p.specdec_stats()["counters"]["from_local"] == 1


def test_proposer_rebuild_errors_are_refresh_errors():
    from nemo_rl_specdec.lockstep import DrafterRefreshError

    p = _proposer()
    with pytest.raises(DrafterRefreshError, match="version 3.*missing key"):
        p.specdec_rebuild([{"token_ids": [1]}], 3)
    with pytest.raises(DrafterRefreshError, match="expected a list"):
        p.specdec_rebuild(None, 3)
    # engine Rollout objects are accepted
    d = rollout([1, 2, 3], 2)
    obj = Rollout(0, d["problem_id"], d["prompt_token_ids"], d["token_ids"], [], "stop", d["policy_version"], 0, 0)
    assert p.specdec_rebuild([obj], 3) == 1
    with pytest.raises(DrafterRefreshError, match=r"rollouts\[0\]: expected a dict .*a Rollout"):
        p.specdec_rebuild([SimpleNamespace(token_ids=[1], policy_version=0)], 3)


def test_in_flight_siblings_share_tokens_and_the_rebuild_settles_them():
    """A request drafts from a sibling's in-flight tokens; the next rebuild keeps in-flight entries
    the update carries (no re-insertion) and removes the others, so the store is exactly the window."""
    p = _proposer(k=4, scope="problem")
    ahead = PROMPT + [40, 41, 42, 43, 44, 45, 46]
    behind = PROMPT + [40]
    r = _FakeRunner([("a-1", {"problem_id": "A"}, ahead), ("b-1", {"problem_id": "A"}, behind),
                     ("c-1", {"problem_id": "C"}, PROMPT + [40])])
    p.specdec_attach(r, {"suffix": p.settings})
    p.use_local = False
    out = p.propose([[1], [1], [1]], r.n, r.tokens)
    assert out[1] == [41, 42, 43, 44]  # from sibling a-1, still generating
    assert out[2] == []  # another problem sees nothing
    st = p.specdec_stats()["store"]
    assert st["live_entries"] == 3 and st["entries"] == 3
    # grow a-1 by two tokens: the entry follows
    r.tokens[0, len(ahead):len(ahead) + 2] = [47, 48]
    r.n[0] += 2
    p.propose([[1], [1], [1]], r.n, r.tokens)
    # the update carries a-1 exactly as generated and b-1 with a different ending; c-1 is not in it
    a_final = ahead[len(PROMPT):] + [47, 48]
    rows = [rollout(a_final, 0, pid="A"), rollout([40, 99], 0, pid="A")]
    assert p.specdec_rebuild(rows, 1) == 2
    st = p.specdec_stats()["store"]
    assert st["live_entries"] == 0 and st["entries"] == 2 and st["live_settled"] == 1
    assert p.store.speculate(np.array([3] + PROMPT + [40, 99][:1], dtype=np.int32), "C", 4, 100.0, 0.0).token_ids == []
    # the store now equals a fresh one built from the update's rollouts
    fresh = RolloutStore(window_steps=2, scope="problem", max_tree_depth=16)
    fresh.rebuild(rows, 1)
    for c in ([3] + PROMPT, [3] + PROMPT + [40], [0, 40, 41], [0, 45, 46]):
        got = _continuations(p.store._problem_trees["A"], c)
        assert got == _continuations(fresh._problem_trees["A"], c), c
    # problem A now has stored rollouts: its requests draft from them and open no in-flight entry
    r2 = _FakeRunner([("d-1", {"problem_id": "A"}, PROMPT + [40])])
    p.runner = r2
    assert p.propose([[1]], r2.n, r2.tokens) == [[41, 42, 43, 44]]
    assert p.specdec_stats()["store"]["live_entries"] == 0


def test_proposer_promotes_a_request_that_outlives_its_predicted_length():
    """A budget-0 request predicted to be short gets no drafts while within its prediction, and
    the full k once its output is longer than predicted (it is the tail now)."""
    p = _proposer(k=4)
    resp = list(range(40, 60))
    rows = [("r0-aaaa", {"problem_id": "A", "specdec_budget": 0, "specdec_predicted_len": 3}, PROMPT + resp[:3]),
            ("r1-bbbb", {"problem_id": "A", "specdec_budget": 0, "specdec_predicted_len": 3}, PROMPT + resp[:4]),
            ("r2-cccc", {"problem_id": "A", "specdec_budget": 0, "specdec_predicted_len": "x"}, PROMPT + resp[:8]),
            ("r3-dddd", {"problem_id": "A", "specdec_budget": 1, "specdec_predicted_len": 2}, PROMPT + resp[:5])]
    r = _FakeRunner(rows)
    for req in r.requests.values():
        req.prompt_token_ids = PROMPT      # output length = context - prompt
    p.specdec_attach(r, {"suffix": p.settings})
    p.specdec_rebuild([rollout(resp, 0, pid="A")], 1)
    out = p.propose([[1]] * 4, r.n, r.tokens)
    assert out[0] == []                    # 3 tokens out of a predicted 3: still within, budget 0
    assert out[1] == resp[4:8]             # 4 > 3: promoted to k = 4
    assert out[2] == []                    # an unusable prediction is ignored: the budget stands
    assert out[3] == resp[5:9]             # budget 1 promoted to k
    c = p.specdec_stats()["counters"]
    assert c["budget_promoted"] == 2 and c["budget_zero"] == 2
