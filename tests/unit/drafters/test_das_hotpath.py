"""DAS proposer hot path without an engine: bounded tail matching, calibrated choice between the
problem and global trees, feedback from accepted lengths, the no-problem-id fallback, and the
store rebuild staged off the critical path (fenced until installed at exactly its version), and the
adaptive budget (drafts cut per step from the online step-cost fit)."""
import logging
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("arctic_inference.suffix_decoding._C")

from nemo_rl_specdec.drafters.machinery.calibration import BINS, SOURCES, AcceptanceCalibration  # noqa: E402
from nemo_rl_specdec.drafters.machinery.store import RolloutStore  # noqa: E402
from nemo_rl_specdec.lockstep import DrafterRefreshError  # noqa: E402

PROMPT = [5, 6, 7, 8]
P, G, L = (SOURCES.index(s) for s in SOURCES)


def rollout(tokens, version, pid="p0", prompt=PROMPT):
    return {"problem_id": pid, "prompt_token_ids": list(prompt), "token_ids": list(tokens), "policy_version": version}


class _Runner:
    """input_batch.req_ids and requests[id] (extra_args, prompt) for the proposer; rows of tokens."""

    def __init__(self, rows, width=128):
        self.input_batch = SimpleNamespace(req_ids=[r[0] for r in rows])
        self.requests = {rid: SimpleNamespace(sampling_params=SimpleNamespace(extra_args=extra),
                                              prompt_token_ids=PROMPT) for rid, extra, _ in rows}
        self.tokens = np.zeros((len(rows), width), dtype=np.int32)
        self.n = np.zeros(len(rows), dtype=np.int64)
        for i, (_, _, toks) in enumerate(rows):
            self.tokens[i, :len(toks)] = toks
            self.n[i] = len(toks)


def _proposer(k=4, scope="both", **settings):
    from nemo_rl_specdec.drafters.suffix import DASProposer

    vc = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                         model_config=SimpleNamespace(max_model_len=128))
    p = DASProposer(vc)
    p.configure({"suffix": {"window_steps": 4, "scope": scope, "max_tree_depth": 32, "min_token_prob": 0.0,
                            "max_spec_factor": 100.0, **settings}})
    return p


# ---------------------------------------------------------------------- bounded tail matching

def test_bounded_match_gives_the_same_drafts_whenever_the_match_fits_the_bound():
    """Matching only the last `max_match_len` tokens changes nothing while the longest match is
    shorter than the bound; the proposer's draft is the store's draft for exactly that tail."""
    rng = np.random.default_rng(3)
    seqs = [rng.integers(0, 12, 80).tolist() for _ in range(6)]
    s = RolloutStore(window_steps=4, scope="global", max_tree_depth=32, max_memory_bytes=None)
    for q in seqs:
        s.add(q, version=0, problem_id=None)
    same = 0
    for _ in range(300):
        q = seqs[int(rng.integers(0, 6))]
        cut = int(rng.integers(8, 80))
        ctx = np.array([int(rng.integers(0, 12))] * 3 + q[:cut], dtype=np.int32)  # unseen start: bounded match
        full = s.speculate(ctx, None, 8, 100.0, 0.0)
        if full.match_len + 1 < 16:
            assert s.speculate(ctx[-16:], None, 8, 100.0, 0.0).token_ids == full.token_ids
            same += 1
    assert same > 20
    p = _proposer(k=4, scope="global", max_match_len=6)
    ctx = PROMPT + list(range(40, 50))
    r = _Runner([("m-1", None, ctx)])
    p.specdec_attach(r, {"suffix": p.settings})
    p.use_local = False
    p.specdec_rebuild([rollout(list(range(40, 60)), 0, pid=None)], 1)
    out = p.propose([[1]], r.n, r.tokens)
    want = p.store.speculate(np.array(ctx[-6:], dtype=np.int32), None, 4, 100.0, 0.0).token_ids
    assert out == [want] and want == [50, 51, 52, 53]


# ---------------------------------------------------------------------- calibration

def test_rate_matrix_is_token_rates_of_every_draft_padded_with_nan():
    c = AcceptanceCalibration(prior=10.0, flush_every=4)
    for _ in range(50):
        c.record(P, [1.0, 0.55], 1)
        c.record(L, [0.25, 0.15, 0.05], 3)
    c.flush()
    drafts = [(P, [1.0, 0.55]), (L, [0.25, 0.15, 0.05]), (G, [])]
    m = c.rate_matrix([s for s, _ in drafts], [p for _, p in drafts], 4)
    assert m.shape == (3, 4)
    for row, (src, probs) in zip(m, drafts, strict=True):
        assert row[:len(probs)].tolist() == c.token_rates(src, probs)
        assert np.isnan(row[len(probs):]).all()


def test_calibration_starts_as_arctic_score_and_learns_measured_acceptance():
    c = AcceptanceCalibration(prior=10.0, flush_every=4)
    probs = [1.0, 1.0, 0.55, 0.15]
    assert c.expected(P, probs) == pytest.approx(1.0 + 1.0 + 0.55 + 0.15)  # bin centres: the score
    for _ in range(200):  # problem drafts: only the first token is ever accepted
        c.record(P, [1.0, 1.0], 1)
    c.flush()
    rate_p1 = c.rates[P][BINS]
    assert rate_p1 == pytest.approx((10.0 + 200) / (10.0 + 400), rel=1e-6)
    assert c.rates[G][BINS] == 1.0  # other sources untouched
    assert c.observed_drafts == 200
    # an accepted count larger than the draft (the bonus token) counts the draft as fully accepted
    c.record(G, [0.35], 5)
    c.flush()
    assert c.rates[G][3] == pytest.approx((10.0 * 0.35 + 1) / 11.0)


def test_both_scope_keeps_the_draft_with_more_calibrated_expected_tokens():
    """The problem tree holds one rollout (p = 1 everywhere), the global tree many rollouts of another
    problem that agree on a different continuation. Uncalibrated, the problem tree's draft wins on
    score; once problem drafts are measured to be rejected, the global tree's draft is kept."""
    s = RolloutStore(window_steps=4, scope="both", max_tree_depth=16, max_memory_bytes=None)
    rows = [rollout([10, 11, 12, 13, 14], 0, pid="A")] + [rollout([10, 21, 22, 23, 24], 0, pid="B")] * 9
    s.rebuild(rows, version=1)
    ctx = np.array([3] + PROMPT + [10], dtype=np.int32)
    c = AcceptanceCalibration(prior=5.0, flush_every=1)
    assert s.speculate(ctx, "A", 4, 100.0, 0.0).source == "problem"
    assert s.speculate(ctx, "A", 4, 100.0, 0.0, c).token_ids == [11, 12, 13, 14]
    for _ in range(100):
        c.record(P, [1.0, 1.0, 1.0, 1.0], 0)  # measured: problem drafts are rejected at once
        c.record(G, [0.9, 0.9, 0.9, 0.9], 4)
    d = s.speculate(ctx, "A", 4, 100.0, 0.0, c)
    assert d.source == "global" and d.token_ids == [21, 22, 23, 24]
    assert d.score == pytest.approx(c.expected(G, d.probs))


def test_global_tree_skipped_only_when_it_cannot_win():
    s = RolloutStore(window_steps=4, scope="both", max_tree_depth=16, max_memory_bytes=None)
    s.rebuild([rollout([10, 11, 12, 13, 14], 0, pid="A"), rollout([10, 11, 12, 13, 99], 0, pid="B")], version=1)
    ctx = np.array([3] + PROMPT + [10], dtype=np.int32)
    calls = []
    real = s._global_tree

    class Spy:
        def speculate_ndarray(self, *a):
            calls.append(a)
            return real.speculate_ndarray(*a)

    s._global_tree = Spy()
    c = AcceptanceCalibration()
    assert s.speculate(ctx, "A", 4, 100.0, 0.0, c).token_ids == [11, 12, 13, 14]
    assert calls == []  # 4 tokens at p = 1 (rate 1.0): the global tree's bound is 4 x 1.0, no better
    for _ in range(300):
        c.record(P, [1.0, 1.0, 1.0, 1.0], 2)
    c.flush()
    s.speculate(ctx, "A", 4, 100.0, 0.0, c)
    assert len(calls) == 1  # measured below 1.0: the global tree might win, so it is asked


def test_proposer_feeds_accepted_lengths_back_into_the_calibration():
    p = _proposer(k=4, scope="problem")
    resp = list(range(40, 52))
    r = _Runner([("f-1", {"problem_id": "A"}, PROMPT + resp[:1])])
    p.specdec_attach(r, {"suffix": p.settings})
    p.use_local = False
    p.specdec_rebuild([rollout(resp, 0, pid="A")], 1)
    assert p.propose([[1]], r.n, r.tokens) == [resp[1:5]]
    r.tokens[0, len(PROMPT) + 1:len(PROMPT) + 4] = resp[1:4]
    r.n[0] += 3  # two drafts accepted + one token of the target's own
    p.propose([[1, 1, 1]], r.n, r.tokens)
    p.calibration.flush()
    t = p.calibration.table()["problem"]
    prior = p.calibration.prior
    assert t["tokens"][BINS] == prior + 4 and t["rates"][BINS] == pytest.approx((prior + 2) / (prior + 4), abs=1e-4)


# ---------------------------------------------------------------------- bad input

def test_request_without_problem_id_uses_the_global_tree_and_is_counted():
    p = _proposer(k=4, scope="both")
    resp = list(range(40, 52))
    r = _Runner([("n-1", None, PROMPT + [40]), ("n-2", {"problem_id": "A"}, PROMPT + [40]),
                 ("n-3", {"other": 1}, PROMPT + [40])])
    p.specdec_attach(r, {"suffix": p.settings})
    p.use_local = False
    p.specdec_rebuild([rollout(resp, 0, pid="A")], 1)
    out = p.propose([[1]] * 3, r.n, r.tokens)
    assert out == [resp[1:5]] * 3
    c = p.specdec_stats()["counters"]
    assert c["no_problem_id"] == 2 and c["from_global"] == 2 and c["from_problem"] == 1
    p.propose([[1]] * 3, r.n, r.tokens)  # counted once per request, not per step
    assert p.specdec_stats()["counters"]["no_problem_id"] == 2


# ---------------------------------------------------------------------- staged rebuild

def test_staged_rebuild_is_fenced_until_installed_at_exactly_its_version():
    p = _proposer(k=4, scope="problem")
    resp = list(range(40, 52))
    r = _Runner([("s-1", {"problem_id": "A"}, PROMPT + [40])])
    p.specdec_attach(r, {"suffix": p.settings})
    p.use_local = False
    p.specdec_rebuild([rollout(resp, 0, pid="A")], 1)
    assert p.propose([[1]], r.n, r.tokens) == [resp[1:5]]
    new = [50, 60, 61, 62, 63]  # version 1's rollout continues 40 differently
    info = p.specdec_stage([rollout([40] + new, 1, pid="A")], 2)
    assert info == {"staged_version": 2, "rollouts": 1, "appended": False}
    assert p.specdec_wait_staged(timeout=30.0)
    # staged and finished, but not installed: the store is not read (nor written)
    assert p.propose([[1]], r.n, r.tokens) == [[]]
    assert p.specdec_stats()["counters"]["fenced_rows"] == 1
    with pytest.raises(DrafterRefreshError, match="staged rollouts are for policy version 2.*installs version 3"):
        p.specdec_install_staged(3)
    with pytest.raises(DrafterRefreshError, match="already staged"):
        p.specdec_stage([], 3)
    with pytest.raises(DrafterRefreshError, match="rebuild for version 2 is staged"):
        p.specdec_rebuild([], 3)
    assert p.propose([[1]], r.n, r.tokens) == [[]]  # still fenced after the refused install
    assert p.specdec_install_staged(2) == 1
    assert p.version == 2
    d = p.propose([[1]], r.n, r.tokens)[0]
    assert d and set(d) <= set(resp + new)  # both versions in the window: the store is read again
    c = p.specdec_stats()["counters"]
    assert c["staged"] == 1 and c["rebuilds"] == 2 and c["rebuild_bg_s"] > 0
    with pytest.raises(DrafterRefreshError, match="none were staged"):
        p.specdec_install_staged(3)
    with pytest.raises(DrafterRefreshError, match="versions only move forward"):
        p.specdec_stage([], 2)


def test_rollouts_staged_twice_for_one_version_are_installed_together_or_not_at_all():
    """A step whose generation ends twice before its update (NeMo-RL's dynamic sampling): the second
    staging is appended to the first, the store stays fenced, and the update installs both; a bad first
    batch fails the install of both, and nothing changes."""
    p = _proposer(k=4, scope="problem")
    p.specdec_rebuild([rollout([1, 2, 3], 0, pid="A")], 1)
    assert p.specdec_stage([rollout([4, 5], 1, pid="A")], 2)["appended"] is False
    assert p.specdec_stage([rollout([6, 7], 1, pid="B")], 2)["appended"] is True
    with pytest.raises(DrafterRefreshError, match="already staged"):
        p.specdec_stage([], 3)
    assert p.specdec_install_staged(2) == 2
    assert p.store._problem_entries == {"A": 2, "B": 1} and p.version == 2
    assert p.last_install["version"] == 2 and p.last_install["rebuild_s"] > 0
    before = p.store.stats()
    p.specdec_stage([rollout([8, 9], 9, pid="A")], 3)   # from a future policy: fails on its thread
    p.specdec_stage([rollout([8, 9], 2, pid="A")], 3)
    with pytest.raises(DrafterRefreshError, match="policy_version=9 is newer"):
        p.specdec_install_staged(3)
    assert p.store.stats() == before and p.version == 2


def test_staged_rollout_of_an_unknown_version_is_rejected_naming_it():
    p = _proposer(k=4, scope="problem")
    p.specdec_rebuild([rollout([1, 2, 3], 0)], 1)
    before = p.store.stats()
    p.specdec_stage([rollout([4, 5], 1), rollout([6, 7], 9)], 2)
    with pytest.raises(DrafterRefreshError, match=r"version 2 .*rollouts\[1\]\.policy_version=9 is newer"):
        p.specdec_install_staged(2)
    assert p.store.stats() == before and p.version == 1  # nothing changed, versions did not move
    assert p.specdec_rebuild([rollout([4, 5], 1)], 2) == 1  # a correct update brings it back


def test_drafts_not_proposed_are_scored_on_the_tokens_the_target_produced():
    """The losing tree's draft is calibrated too (else a source is only measured where it won): its
    accepted length is its common prefix with the produced tokens, waiting for more when it matched
    all of them."""
    from nemo_rl_specdec.drafters.machinery.calibration import resolve_withheld

    c = AcceptanceCalibration(prior=1.0, flush_every=1_000)
    others = [(G, [1.0, 1.0, 1.0], [7, 8, 9], 0),      # mismatch at position 1: 1 accepted
              (P, [1.0, 1.0, 1.0, 1.0], [7, 3, 4, 5], 0),  # matches all 2 produced tokens: waits
              (L, [1.0], [7], 0)]                           # matched in full: 1 accepted
    left = resolve_withheld(c, others, [7, 3])
    assert left == [(P, [1.0, 1.0, 1.0, 1.0], [4, 5], 2)]
    assert resolve_withheld(c, left, [4, 6, 1]) == []         # then 4 matches, 6 != 5: 3 accepted
    c.flush()
    t = c.table()
    assert t["global"]["tokens"][BINS] == 1.0 + 3 and t["global"]["rates"][BINS] == pytest.approx(2 / 4)
    assert t["problem"]["tokens"][BINS] == 1.0 + 4 and t["problem"]["rates"][BINS] == pytest.approx(4 / 5)
    assert t["local"]["rates"][BINS] == pytest.approx(1.0)


# ---------------------------------------------------------------------- scheduling.budget: adaptive
# drafts are cut per step from the online step-cost fit, speculation turns off (and says so) where no
# draft token pays, and nothing is cut during the fit's warm-up

ADAPTIVE_RESPONSE = list(range(40, 80))


def _adaptive_proposer(runner, budget="adaptive", k=4, auto_disable=True):
    from nemo_rl_specdec.drafters.suffix import DASProposer

    vc = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                         model_config=SimpleNamespace(max_model_len=256))
    p = DASProposer(vc)
    p.specdec_attach(runner, {"suffix": {"scope": "problem", "max_tree_depth": 32, "min_token_prob": 0.0},
                              "scheduling": {"budget": budget}, "auto_disable": auto_disable})
    p.use_local = False
    p.specdec_rebuild([{"problem_id": "p", "prompt_token_ids": PROMPT, "token_ids": ADAPTIVE_RESPONSE,
                        "policy_version": 0}], 1)
    return p


def _plant_step_cost(p, c_base, c_tok, n=64):
    """Steps of a planted linear cost, with varying draft tokens (what the fit learns from)."""
    for i in range(n):
        req, drafts = 1 + i % 4, i % 5
        p.judge.fit.add(req, req + drafts, 100 * req, c_base + c_tok * (req + drafts))


def _adaptive_rows(gen=10, extra=None):
    return [("a", {"problem_id": "p", **(extra or {})}, PROMPT + ADAPTIVE_RESPONSE[:gen])]


def test_no_cut_during_the_warm_up():
    r = _Runner(_adaptive_rows())
    p = _adaptive_proposer(r)
    assert p.judge.fit.split(1, 14) is None
    assert p.propose([[1]], r.n, r.tokens) == [ADAPTIVE_RESPONSE[10:14]]
    assert p.counters["adaptive_steps"] == 0


def test_expensive_drafts_turn_speculation_off_and_it_is_logged(caplog):
    r = _Runner(_adaptive_rows())
    p = _adaptive_proposer(r)
    _plant_step_cost(p, c_base=1e-3, c_tok=1e-3)  # a draft token costs as much as the request's own token
    for _ in range(200):  # this tree's drafts were rarely accepted so far
        p.calibration.record(0, [1.0] * 4, 0)
    p.calibration.flush()
    with caplog.at_level(logging.INFO, logger="nemo_rl_specdec"):
        assert p.propose([[1]], r.n, r.tokens) == [[]]
    assert p.counters["adaptive_off_steps"] == 1 and p.counters["adaptive_cut_tokens"] == 4
    assert p.counters["drafts"] == 0
    assert any("speculation off at 1 requests" in m for m in caplog.messages)
    # the draft it withheld is still scored against what the target produces (calibration stays unbiased)
    assert p._reqs["a"].others and p._reqs["a"].others[0][2] == ADAPTIVE_RESPONSE[10:14]


def test_cheap_drafts_are_all_kept():
    r = _Runner(_adaptive_rows())
    p = _adaptive_proposer(r)
    _plant_step_cost(p, c_base=1e-2, c_tok=1e-6)
    assert p.propose([[1]], r.n, r.tokens) == [ADAPTIVE_RESPONSE[10:14]]
    assert p.counters["adaptive_steps"] == 1 and p.counters["adaptive_cut_tokens"] == 0
    st = p.specdec_stats()
    assert st["adaptive"] is True and st["step_cost"]["samples"] == 64 and st["step_cost"]["c_tok_s"] > 0


def _losing_drafts(p):
    _plant_step_cost(p, c_base=1e-3, c_tok=1e-3)  # a draft token costs as much as the request's own token
    for _ in range(200):  # this tree's drafts were rarely accepted so far
        p.calibration.record(0, [1.0] * 4, 0)
    p.calibration.flush()


def test_auto_disable_turns_speculation_off_under_a_uniform_budget_and_logs_it(caplog):
    r = _Runner(_adaptive_rows())
    p = _adaptive_proposer(r, budget="uniform")
    _losing_drafts(p)
    with caplog.at_level(logging.INFO, logger="nemo_rl_specdec"):
        assert p.propose([[1]], r.n, r.tokens) == [[]]
    c = p.counters
    assert c["auto_disable_steps"] == 1 and c["auto_disable_off_steps"] == 1 and c["auto_disable_cut_tokens"] == 4
    assert c["drafts"] == 0 and c["draft_tokens"] == 0 and c["adaptive_steps"] == 0
    st = p.specdec_stats()
    assert st["auto_disable"] is True and st["off_by_batch"] == {"1": 1}
    m = p.specdec_metrics()  # what the trainer logs (NeMo-RL: specdec/engine/das/*)
    assert m["das/auto_disable_off_steps"] == 1.0 and m["das/step_cost/samples"] == 64.0
    assert m["das/acceptance/problem/bin10"] < 0.1  # the planted rejections, per match confidence
    assert all(isinstance(v, float) for v in m.values())
    msg = [m for m in caplog.messages if "DAS auto_disable: speculation off at 1 requests" in m]
    assert msg and "tokens per ms" in msg[0] and "fit on 64 steps" in msg[0]
    assert p._reqs["a"].others[0][2] == ADAPTIVE_RESPONSE[10:14]  # still scored against the target's tokens


def test_auto_disable_keeps_every_draft_that_pays_and_logs_the_switch_back(caplog):
    r = _Runner(_adaptive_rows())
    p = _adaptive_proposer(r, budget="uniform")
    _losing_drafts(p)
    assert p.propose([[1]], r.n, r.tokens) == [[]]
    _plant_step_cost(p, c_base=1e-2, c_tok=1e-6, n=2048)  # drafts became cheap: the fit follows
    with caplog.at_level(logging.INFO, logger="nemo_rl_specdec"):
        assert p.propose([[1]], r.n, r.tokens) == [ADAPTIVE_RESPONSE[10:14]]  # all of it, not a cut
    assert p.counters["auto_disable_steps"] == 2 and p.counters["auto_disable_off_steps"] == 1
    assert any("DAS auto_disable: speculation on at 1 requests" in m for m in caplog.messages)


def test_auto_disable_false_never_judges_a_step():
    r = _Runner(_adaptive_rows())
    p = _adaptive_proposer(r, budget="uniform", auto_disable=False)
    _losing_drafts(p)
    assert p.propose([[1]], r.n, r.tokens) == [ADAPTIVE_RESPONSE[10:14]]
    assert p.counters["auto_disable_steps"] == 0 and p.specdec_stats()["auto_disable"] is False


def test_a_fit_that_never_becomes_ready_is_reported_once(caplog, monkeypatch):
    from nemo_rl_specdec.drafters.machinery import step_judge
    monkeypatch.setattr(step_judge, "UNFIT_WARN_STEPS", 40)
    r = _Runner(_adaptive_rows(gen=4))
    p = _adaptive_proposer(r, budget="uniform")
    p.use_local = True
    with caplog.at_level(logging.WARNING, logger="nemo_rl_specdec"):
        for _ in range(60):  # the same request, the same draft length: c_tok cannot be fitted
            p.propose([[1]], r.n, r.tokens)
    assert p.judge.fit.coef is None and p.judge.fit.samples == 59 > p.judge.fit.min_samples
    assert sum("step-cost fit is not ready after 40 decode steps" in m for m in caplog.messages) == 1


def test_step_times_are_sampled_between_calls_of_the_same_requests():
    r = _Runner(_adaptive_rows())
    p = _adaptive_proposer(r, budget="uniform")
    for _ in range(5):
        p.propose([[1]], r.n, r.tokens)
    assert p.judge.fit.samples == 4  # the first call's step prefilled the request: not a decode sample
    assert p.counters["adaptive_steps"] == 0  # uniform: measured, never cut


# ---------------------------------------------------------------------- k by batch size

def test_k_by_batch_size_caps_every_draft_at_the_steps_batch_size():
    """vLLM applies `num_speculative_tokens_per_batch_size` to its own proposers only: DAS caps its
    drafts by `scheduling.k_by_batch_size` itself, at the step's batch size (gaps and batches past the
    last range keep the previous k, as vLLM reads the schedule)."""
    p = _proposer(k=8, scope="global")
    seq = list(range(40, 80))
    table = [[1, 1, 8], [2, 3, 3], [5, 6, 0]]
    want = {1: 8, 2: 3, 3: 3, 4: 3, 5: 0, 7: 0}
    for batch, k in want.items():
        rows = [(f"r{batch}-{i}", {}, PROMPT + seq[:10]) for i in range(batch)]
        r = _Runner(rows)
        p.specdec_attach(r, {"suffix": p.settings, "auto_disable": False, "scheduling": {"k_by_batch_size": table}})
        p.use_local = False
        p.specdec_rebuild([rollout(seq, 0, pid=None)], 1)
        out = p.propose([[1]] * batch, r.n, r.tokens)
        assert [len(d) for d in out] == [k] * batch, batch
    p.specdec_attach(r, {"suffix": p.settings, "auto_disable": False})
    p.use_local = False
    p.specdec_rebuild([rollout(seq, 0, pid=None)], 1)
    assert [len(d) for d in p.propose([[1]] * 7, r.n, r.tokens)] == [8] * 7  # no table: k everywhere


def test_trees_are_as_deep_as_a_draft_can_reach():
    """A draft is at most min(k, max_spec_factor x match) tokens after a match of at most
    max_match_len - 1: the trees are built that deep and no deeper (insertion cost grows with depth)."""
    deep = {"max_tree_depth": 64, "max_match_len": 16}
    assert _proposer(k=24, max_spec_factor=1.0, **deep).depth == 15 + 16   # the factor binds
    assert _proposer(k=8, max_spec_factor=1.0, **deep).depth == 15 + 8     # k binds
    assert _proposer(k=24, max_spec_factor=2.0, **deep).depth == 15 + 24
    assert _proposer(k=24, max_spec_factor=2.0, max_tree_depth=20, max_match_len=16).depth == 20


def test_the_dense_k_table_is_the_schedules_lookup_at_every_batch_size():
    """DAS reads `scheduling.k_by_batch_size` as a dense table built from `schema.schedule_lookup`
    (the one lookup, also the simulator's); on valid tables (from batch 1, ranges in order, gaps
    allowed) it equals the scan it replaced: the last range holding the batch size, a gap or what
    lies past the last range keeping the previous k, capped at k."""
    from nemo_rl_specdec.drafters.suffix import _k_lookup

    def scan(table, k):
        out, last = [0] * (max(hi for _, hi, _ in table) + 1), 0
        for b in range(1, len(out)):
            for lo, hi, kk in table:
                if lo <= b <= hi:
                    last = kk
            out[b] = min(last, k)
        return out

    rng = np.random.default_rng(0)
    for _ in range(200):
        table, lo = [], 1
        for _ in range(int(rng.integers(1, 5))):
            hi = lo + int(rng.integers(0, 9))
            table.append((lo, hi, int(rng.integers(0, 12))))
            lo = hi + 1 + int(rng.integers(0, 3))  # a gap, sometimes
        k = int(rng.integers(1, 12))
        assert _k_lookup(table, k) == scan(table, k)
    assert _k_lookup(None, 4) is None and _k_lookup([], 4) is None
