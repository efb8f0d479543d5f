"""The store's capped admission (newest first, stop at the cap) keeps the memory-cap semantics:
within the cap after every rebuild, the survivors are the newest entries (no evicted entry is
newer than a kept one), and the trees hold exactly the survivors, whichever path admitted them
(chunks into the stored trees, or new trees that replace stored ones wholesale)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("arctic_inference.suffix_decoding._C")

from test_suffix_store import _continuations as continuations  # noqa: E402  (pytest puts this folder on the path)

from nemo_rl_specdec.drafters.machinery.store import RolloutStore, StoreInputError  # noqa: E402
from nemo_rl_specdec.rollouts import RolloutBatch  # noqa: E402

DEPTH = 12


def step_rows(rng, step, problems=4, samples=3, n=80, versions=None):
    """A step's rollouts: siblings share a per-problem template with random edits."""
    rows = []
    for p in range(problems):
        template = rng.integers(0, 30, n)
        for s in range(samples):
            toks = template.copy()
            hit = rng.random(n) < 0.2
            toks[hit] = rng.integers(0, 30, int(hit.sum()))
            v = step - 1 if versions is None else versions[(p * samples + s) % len(versions)]
            rows.append({"problem_id": f"s{step % 2}p{p}", "prompt_token_ids": rng.integers(0, 30, 20).tolist(),
                         "token_ids": toks.tolist(), "policy_version": v})
    return rows


def stored_seq(store, r):
    return np.concatenate([np.asarray(r["prompt_token_ids"][-(store.max_tree_depth - 1):], np.int32),
                           np.asarray(r["token_ids"], np.int32)])


def assert_trees_hold_exactly(store, seq_of, rng):
    """Every tree of `store` equals a tree built from only its surviving entries' sequences."""
    ref = RolloutStore(window_steps=100, scope=store.scope, max_tree_depth=store.max_tree_depth,
                       max_memory_bytes=None)
    for e in sorted(store.entries(), key=lambda e: e.seq_id):
        ref._insert(seq_of[e.seq_id], e.problem_id, e.version, live=False, seq_id=e.seq_id)
    assert set(store._problem_trees) == set(ref._problem_trees)
    assert (store._global_tree is None) == (ref._global_tree is None)
    pairs = [(store._problem_trees[k], ref._problem_trees[k]) for k in ref._problem_trees]
    if ref._global_tree is not None:
        pairs.append((store._global_tree, ref._global_tree))
    compared = 0
    for a, b in pairs:
        assert a.num_seqs() == b.num_seqs()
        for _ in range(60):
            c = rng.integers(0, 30, int(rng.integers(1, 6))).tolist()
            ca, cb = continuations(a, c), continuations(b, c)
            if ca is not None and cb is not None:
                assert ca == cb, c
                compared += 1
    assert compared > 0 or not pairs


def run_steps(store, rng, steps, as_batch=False, versions_of=lambda step: None):
    """Rebuild `steps` times; returns {seq id: stored sequence} for every rollout given (ids are taken
    in input order, consecutively, when no in-flight entries exist)."""
    seq_of, next_id = {}, 0
    for step in range(1, steps + 1):
        rows = step_rows(rng, step, versions=versions_of(step))
        for r in rows:
            seq_of[next_id] = stored_seq(store, r)
            next_id += 1
        store.rebuild(RolloutBatch.pack(rows, prompt_tail=store.prompt_tail) if as_batch else rows, step)
        yield rows, seq_of


def kept_is_newest(store, seq_of, versions):
    """No entry evicted by the cap is newer (version, seq id) than a kept one, within the window."""
    keys = sorted((versions[sid], sid) for sid in seq_of if store.min_version is None
                  or versions[sid] >= store.min_version)
    kept = sorted((e.version, e.seq_id) for e in store.entries())
    return kept == keys[len(keys) - len(kept):]


@pytest.mark.parametrize("scope", ["both", "problem", "global"])
@pytest.mark.parametrize("cap_share", [0.3, 0.8, 1.6, None])
@pytest.mark.parametrize("as_batch", [False, True])
def test_capped_admission_keeps_the_newest_within_the_cap_and_trees_exact(scope, cap_share, as_batch):
    rng = np.random.default_rng(3)
    probe = RolloutStore(window_steps=3, scope=scope, max_tree_depth=DEPTH, max_memory_bytes=None)
    probe.rebuild(step_rows(np.random.default_rng(99), 1), 1)
    cap = None if cap_share is None else int(probe.bytes() * cap_share)  # a step is ~1/cap_share caps
    s = RolloutStore(window_steps=3, scope=scope, max_tree_depth=DEPTH, max_memory_bytes=cap)
    versions = {}
    for rows, seq_of in run_steps(s, rng, 5, as_batch):
        for sid in seq_of:
            versions.setdefault(sid, None)
        base = len(versions) - len(rows)
        for i, r in enumerate(rows):
            versions[base + i] = r["policy_version"]
        if cap is not None:
            assert s.bytes() <= cap
        assert kept_is_newest(s, seq_of, versions)
        assert len(s) > 0
        assert_trees_hold_exactly(s, seq_of, rng)
    if cap_share == 0.3:
        assert s.evicted_memory > 0 and len(s) < 12
    if cap_share is None:
        assert len(s) == 36 and s.evicted_window == 24  # window 3 of 5 steps of 12


def test_batch_and_dicts_build_the_same_store():
    a = RolloutStore(window_steps=2, scope="both", max_tree_depth=DEPTH, max_memory_bytes=40_000)
    b = RolloutStore(window_steps=2, scope="both", max_tree_depth=DEPTH, max_memory_bytes=40_000)
    for _ in run_steps(a, np.random.default_rng(5), 4):
        pass
    for _ in run_steps(b, np.random.default_rng(5), 4, as_batch=True):
        pass
    st_a, st_b = a.stats(), b.stats()
    assert st_a == st_b and st_a["evicted_memory"] > 0


def test_mixed_versions_in_one_update_are_admitted_in_version_order():
    """Async: one update carries rollouts of two versions, interleaved; the cap keeps the newest
    version's rollouts first, whatever their position in the update."""
    rng = np.random.default_rng(7)
    probe = RolloutStore(window_steps=5, scope="both", max_tree_depth=DEPTH, max_memory_bytes=None)
    probe.rebuild(step_rows(np.random.default_rng(1), 1), 1)
    cap = int(probe.bytes() * 0.5)
    s = RolloutStore(window_steps=5, scope="both", max_tree_depth=DEPTH, max_memory_bytes=cap)
    versions = {}
    for rows, seq_of in run_steps(s, rng, 3, versions_of=lambda step: [step - 1, step - 2] if step > 1 else None):
        base = len(seq_of) - len(rows)
        for i, r in enumerate(rows):
            versions[base + i] = r["policy_version"]
        assert s.bytes() <= cap and kept_is_newest(s, seq_of, versions)
        assert_trees_hold_exactly(s, seq_of, rng)
    assert s.versions()[-1] == 2 and s.evicted_memory > 0


def test_a_wrong_size_prediction_falls_back_to_the_stored_trees():
    """Replacing the stored trees is chosen on a predicted size; when the update fits after all,
    the older entries that fit stay (oldest evicted first), as without the prediction."""
    rng = np.random.default_rng(11)
    probe = RolloutStore(window_steps=5, scope="both", max_tree_depth=DEPTH, max_memory_bytes=None)
    probe.rebuild(step_rows(np.random.default_rng(2), 1), 1)
    cap = int(probe.bytes() * 1.5)
    s = RolloutStore(window_steps=5, scope="both", max_tree_depth=DEPTH, max_memory_bytes=cap)
    gen = run_steps(s, rng, 2)
    rows, seq_of = next(gen)
    s._measured = (s._measured[0] * 10, s._measured[1])  # predict 10x the real bytes per token
    rows, seq_of = next(gen)
    versions = {sid: (0 if sid < 12 else 1) for sid in seq_of}
    assert s.bytes() <= cap and kept_is_newest(s, seq_of, versions)
    assert len(s.entries(version=1)) == 12 and 0 < len(s.entries(version=0)) < 12
    assert_trees_hold_exactly(s, seq_of, rng)


def test_batch_input_errors_name_the_rollout():
    s = RolloutStore(window_steps=2, scope="both", max_tree_depth=DEPTH)
    rows = step_rows(np.random.default_rng(0), 1)
    bad = RolloutBatch.pack(rows)
    bad.tokens[int(bad.starts[5]) + 3] = -1
    with pytest.raises(StoreInputError, match=r"rollouts\[5\]"):
        s.rebuild(bad, 1)
    future = RolloutBatch.pack([{**r, "policy_version": 3} if i == 7 else r for i, r in enumerate(rows)])
    with pytest.raises(StoreInputError, match=r"rollouts\[7\]\.policy_version=3 is newer"):
        s.rebuild(future, 1)
    assert len(s) == 0  # nothing changed on bad input


def test_read_only_arrays_as_ray_returns_them_are_accepted():
    """ray.get hands numpy arrays back read-only (zero copy); arctic refuses read-only arrays."""
    rows = step_rows(np.random.default_rng(0), 1)
    b = RolloutBatch.pack(rows)
    for a in (b.tokens, b.starts, b.prompt_lens, b.versions):
        a.setflags(write=False)
    s = RolloutStore(window_steps=2, scope="both", max_tree_depth=DEPTH)
    assert s.rebuild(b, 1) == 12
    resp = np.asarray(rows[0]["token_ids"], np.int32)
    resp.setflags(write=False)
    assert s.rebuild([{**rows[0], "prompt_token_ids": [], "token_ids": resp, "policy_version": 1}], 2) == 1


def test_proposer_takes_a_batch_as_is():
    """DASProposer.specdec_rebuild hands a RolloutBatch to the store unconverted (read in place)."""
    from test_suffix_store import _proposer

    rows = step_rows(np.random.default_rng(4), 1)
    p, q = _proposer(window=2), _proposer(window=2)
    assert p.specdec_rebuild(RolloutBatch.pack(rows), 1) == q.specdec_rebuild(rows, 1) == 12
    assert p.store.stats() == q.store.stats()
