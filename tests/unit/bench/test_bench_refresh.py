"""bench --suite refresh, tiny: every engine's store holds every rollout of the step, transport
round-trips exactly, memory is reported, the JSON carries its keys; plus the generator and settings.

The suite test starts a local Ray (about 10 s on the 2-core CI machine, once for the module)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("arctic_inference.suffix_decoding._C")

from nemo_rl_specdec.bench import refresh as R  # noqa: E402
from nemo_rl_specdec.bench.refresh import REQUIRED  # noqa: E402
from nemo_rl_specdec.config.run import ConfigError, load_run_config  # noqa: E402
from nemo_rl_specdec.rollouts import RolloutBatch  # noqa: E402

WINDOW_1 = "policy.generation.speculative_decoding.suffix.window_steps=1"  # so step 2 evicts step 1
TINY = ["bench.refresh.rollouts=16", "bench.refresh.problems=4", "bench.refresh.tokens=200",
        "bench.refresh.prompt_tokens=40", "bench.refresh.engines=2", "bench.refresh.steps=2",
        "bench.refresh.object_store_mb=256"]


def tiny_options(extra=()):
    return R.options(load_run_config("configs/tiny_cpu.yaml", TINY + list(extra)))


def test_generator_siblings_share_long_spans_and_problems_differ():
    o = tiny_options(["bench.refresh.tokens=2000"])
    recs = R.step_records(o, 1, 0, 1)
    assert len(recs) == 16 and all(len(r.token_ids) == 2000 and r.policy_version == 0 for r in recs)
    by_pid: dict = {}
    for r in recs:
        by_pid.setdefault(r.problem_id, []).append(r)
    assert len(by_pid) == 4 and all(len(v) == 4 for v in by_pid.values())

    def shared_8grams(a, b):
        grams = {tuple(a[i:i + 8]) for i in range(len(a) - 7)}
        return sum(tuple(b[i:i + 8]) in grams for i in range(len(b) - 7)) / (len(b) - 7)

    (p, q), (x, *_) = list(by_pid.values())[0][:2], list(by_pid.values())[1]
    assert not np.array_equal(p.token_ids, q.token_ids)
    assert shared_8grams(p.token_ids, q.token_ids) > 0.5  # siblings: mostly the same spans
    assert shared_8grams(p.token_ids, x.token_ids) < 0.1  # other problems: short common phrases only
    again = R.step_records(o, 1, 0, 1)  # deterministic; a new step brings new problems
    assert all(np.array_equal(a.token_ids, b.token_ids) for a, b in zip(recs, again, strict=True))
    assert not {r.problem_id for r in R.step_records(o, 2, 0, 1)} & set(by_pid)
    # sharding: every rollout exactly once over the engines, siblings spread
    shards = [R.step_records(o, 1, e, 2) for e in range(2)]
    assert sorted(r.token_ids.tobytes() for s in shards for r in s) == sorted(r.token_ids.tobytes() for r in recs)
    assert all(len({r.problem_id for r in s}) == 4 for s in shards)


@pytest.mark.parametrize("override, match", [
    ("bench.refresh.rollouts=10", "bench.refresh.rollouts"),
    ("bench.refresh.steps=1", "bench.refresh.steps"),
    ("bench.refresh.engines=0", "bench.refresh.engines"),
    ("bench.refresh.share=1.5", "bench.refresh.share"),
    ("bench.refresh.tokens=1.5", "bench.refresh.tokens"),
    ("bench.refresh.rolouts=8", r"bench.refresh.rolouts: unknown option; did you mean 'rollouts'\?"),
])
def test_bad_settings_name_the_key(override, match):
    with pytest.raises(ConfigError, match=match):
        tiny_options([override])


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """The tiny suite through the bench dispatcher (JSON written), with the engine actors kept."""
    import ray

    from nemo_rl_specdec import bench

    cfg = load_run_config("configs/tiny_cpu.yaml", TINY + [WINDOW_1])
    o = R.options(cfg)
    engines = R.start_engines(o)
    out = tmp_path_factory.mktemp("refresh") / "refresh.json"
    real_run = R.run
    R.run = lambda c, a: real_run(c, a, engines=engines)  # keep the actors alive for inspection
    try:
        bench.run(SimpleNamespace(suite="refresh", run_yaml="configs/tiny_cpu.yaml", json=str(out),
                                  overrides=TINY + [WINDOW_1]))
        yield o, engines, json.loads(out.read_text())
    finally:
        R.run = real_run
        for e in engines:
            ray.kill(e)
        ray.shutdown()


def test_every_engine_holds_every_sibling_of_every_problem(ran):
    import ray

    o, engines, _ = ran
    last = R.step_records(o, o["steps"], 0, 1)
    want: dict = {}
    for r in last:
        want[r.problem_id] = want.get(r.problem_id, 0) + 1
    for e in engines:
        cov = ray.get(e.coverage.remote(o["steps"] - 1))
        assert {pid: c[0] for pid, c in cov.items()} == want  # every sibling in its problem tree
        assert {pid: c[1] for pid, c in cov.items()} == want
        assert ray.get(e.coverage.remote(o["steps"] - 2)) == {}  # window 1: the previous step was evicted
        # a sibling's own prompt tail + first tokens draft its continuation from the problem tree
        r = last[0]
        ctx = np.concatenate([r.prompt_token_ids[-8:], r.token_ids[:24]]).tolist()
        assert ray.get(e.speculate.remote(ctx, r.problem_id, 8))


def test_transport_round_trips_exactly_and_json_has_the_keys(ran):
    o, _, js = ran
    assert js["suite"] == "refresh" and len(js["results"]) == o["steps"]
    cap = o["suffix"]["max_memory_mb"] * 2**20
    for row in js["results"]:
        assert all(k in row for k in REQUIRED)
        assert row["transport_roundtrip_ok"] is True
        assert row["rollouts"] == 16 and row["kept_fraction_min"] == 1.0
        assert len(row["store_bytes_per_engine"]) == 2 and all(0 < b <= cap for b in row["store_bytes_per_engine"])
        assert row["max_memory_bytes"] == cap and row["transport_old_s"] > 0 and row["transport_new_s"] > 0
        assert [p["entries"] for p in row["per_engine"]] == [16, 16]
    assert js["results"][1]["evicted_window"] == 16  # window 1: step 2 evicted step 1


def test_digest_sees_every_field():
    recs = R.step_records(tiny_options(), 1, 0, 1)
    b = RolloutBatch.pack(recs, prompt_tail=10)
    d = R.digest(b)
    assert R.digest(RolloutBatch.pack(recs, prompt_tail=10)) == d
    assert R.digest(RolloutBatch.pack(recs, prompt_tail=11)) != d
    rows = [r.to_dict() for r in recs]
    rows[3] = {**rows[3], "policy_version": 5}
    assert R.digest(RolloutBatch.pack(rows, prompt_tail=10)) != d
