"""`bench --suite das`'s tail diagnosis: per batch-size bin, where the default DAS's drafts come from
and the top-N oracle at the node it matched, read from the real proposer's lookups in a replay; the
per-bin shape of traces; the built-in rows' own profile entries."""
from __future__ import annotations

import random

import numpy as np
import pytest

from nemo_rl_specdec.bench import das
from nemo_rl_specdec.bench.ceilings import bin_of, bin_shape
from nemo_rl_specdec.cost.trace import Trace, TraceStep

pytest.importorskip("arctic_inference.suffix_decoding._C")


def _cfg(*extra):
    from nemo_rl_specdec.config.run import load_run_config
    from nemo_rl_specdec.resources import config_path

    return load_run_config(config_path("tiny_cpu.yaml"), ["bench.das.windows=[4]", "bench.das.scopes=[both]",
                                                          "policy.generation.speculative_decoding.num_speculative_tokens=4",
                                                          *extra])


def _batches(rng: random.Random, steps: int, problems: int = 2, samples: int = 3, vocab: int = 4):
    return [[{"problem_id": f"p{p}", "prompt_token_ids": [100 + p, 101 + p, 102],
              "token_ids": [rng.randrange(vocab) for _ in range(rng.randrange(8, 40))]}
             for p in range(problems) for _ in range(samples)] for _ in range(steps)]


def test_the_node_children_are_the_matched_nodes_most_frequent_first():
    from arctic_inference.suffix_decoding._C import SuffixTree

    t = SuffixTree(16)
    for i, s in enumerate([[1, 2, 3, 4, 5], [1, 2, 3, 7, 8], [1, 2, 3, 7, 9], [6, 3, 11], [6, 3, 11], [6, 3, 11]]):
        t.extend_ndarray(i, np.asarray(s, dtype=np.int32))
    ctx = np.asarray([9, 2, 3], dtype=np.int32)
    assert das.node_children(t, ctx, 2) == [7, 4]            # after "2 3": 7 twice, 4 once
    assert das.node_children(t, ctx, 1) == [11, 7, 4]        # after "3": 11 three times
    assert das.node_children(t, np.asarray([5, 4], dtype=np.int32), 1) == [5]
    assert das.node_children(t, np.asarray([4, 9], dtype=np.int32), 1) == []   # 9 is a leaf


def test_the_diagnosis_counts_every_request_step_once_and_reads_the_real_lookups():
    cfg = _cfg()
    c = next(x for x in das.configurations(cfg, das._options(cfg)) if x["name"] == "das_w4_both")
    batches = _batches(random.Random(3), 3)
    tail = das.diagnose_tail(c["cfg"].spec, batches, 256, 1.0, None)
    from nemo_rl_specdec.bench.replay import replay

    rows = replay(c["cfg"].spec, batches, 256, 1.0)
    shape = bin_shape([r["trace"] for r in rows])
    assert set(tail) == set(shape)
    for b, t in tail.items():
        assert t["request_steps"] == shape[b]["request_steps"]   # the same replay, step for step
        assert t["none"] + sum(t["sources"].values()) == pytest.approx(1.0)
        assert 1 - t["none"] == pytest.approx(shape[b]["drafted"])
        tops = [t[f"top{n}"] for n in das.ORACLE_N] + [t["child"]]
        assert tops == sorted(tops) and t["nodes"] > 0
        # a draft whose first token the target took drafted one of the node's children: the oracle sees it
        assert t["child"] * t["nodes"] >= shape[b]["coverage"] * shape[b]["request_steps"] - 1e-9
    assert sum(t["sources"]["problem"] for t in tail.values()) > 0   # later batches draft from stored rollouts


def test_before_any_stored_rollout_the_problem_trees_hold_only_the_siblings_in_flight_tokens():
    cfg = _cfg()
    c = next(x for x in das.configurations(cfg, das._options(cfg)) if x["name"] == "das_w4_both")
    tail = das.diagnose_tail(c["cfg"].spec, _batches(random.Random(4), 1, samples=4), 256, 1.0, None)
    assert sum(t["sources"]["problem"] for t in tail.values()) == 0
    assert sum(t["sources"]["in-flight"] for t in tail.values()) > 0
    off = _cfg("policy.generation.speculative_decoding.suffix.share_in_flight=off")
    c = next(x for x in das.configurations(off, das._options(off)) if x["name"] == "das_w4_both")
    tail = das.diagnose_tail(c["cfg"].spec, _batches(random.Random(4), 1, samples=4), 256, 1.0, None)
    assert sum(t["sources"]["in-flight"] + t["sources"]["problem"] for t in tail.values()) == 0


def test_the_bin_shape_counts_request_steps_by_the_steps_batch_size():
    steps = [TraceStep([], [], [], [], 30, None, 3),
             TraceStep([0, 1, 2], [5, 5, 5], [4, 0, 2], [4, 0, 0], 0, 1e-4),
             TraceStep([0], [10], [4], [1], 0, 1e-4), TraceStep([0], [12], [0], [0], 0, 1e-4)]
    s = bin_shape([Trace("list", 4, steps, "das")])
    assert set(s) == {bin_of(1), bin_of(3)} == {"1-1", "2-4"}
    three = s["2-4"]
    assert (three["request_steps"], three["tokens_per_request_step"]) == (3, 7 / 3)
    assert (three["drafted"], three["coverage"], three["acceptance"]) == (2 / 3, 1 / 3, 4 / 6)
    one = s["1-1"]
    assert (one["steps"], one["tokens_per_request_step"], one["coverage"], one["model_steps"]) == (2, 1.5, 0.5, None)
    hybrid = Trace("hybrid", 4, [TraceStep([0], [10], [4], [1], 0, 1e-4, 0, 3), TraceStep([0], [12], [2], [0], 0,
                                                                                          1e-4, 0, 1)],
                   "hybrid", parts={"history": "das", "model": "eagle3"})
    assert bin_shape([hybrid])["1-1"]["model_steps"] == 0.5


def test_the_tail_table_shows_sources_the_oracle_and_the_ceiling(capsys):
    rows = [{"name": "das_w4_both", "k": 4, "by_batch": [
                {"batch": "1-1", "request_steps": 10, "tokens_per_request_step": 2.5, "drafted": 1.0, "coverage": 0.5,
                 "acceptance": 0.4, "model_steps": None},
                {"batch": "2-4", "request_steps": 30, "tokens_per_request_step": 2.0, "drafted": 0.5, "coverage": 0.3,
                 "acceptance": 0.3, "model_steps": None}],
             "tail": {"1-1": {"sources": {"problem": 0.6, "in-flight": 0.0, "global": 0.4, "local": 0.0},
                              "top1": 0.5, "top2": 0.6, "top4": 0.7, "top8": 0.8, "child": 0.9, "nodes": 10}}},
            {"name": "hybrid", "k": 4, "by_batch": [
                {"batch": "1-1", "request_steps": 10, "tokens_per_request_step": 3.0, "drafted": 1.0, "coverage": 0.7,
                 "acceptance": 0.6, "model_steps": 0.8}]}]
    ceiling = {"1-1": {"tokens_per_request_step": 5.0, "coverage": 0.9, "request_steps": 8},
               "2-4": {"tokens_per_request_step": 4.0, "coverage": 0.8, "request_steps": 24}}
    table = das.tail_table(rows, ceiling)
    assert [(t["config"], t["batch"]) for t in table] == [("das_w4_both", "1-1"), ("das_w4_both", "2-4"),
                                                          ("hybrid", "1-1")]
    assert table[0]["from %"] == "prob 60 glob 40" and table[0][das.TOPS] == "50/60/70/80/90"
    assert das.TOPS == "top1/2/4/8/child %"
    assert table[1][das.TOPS] is None and table[2]["from %"] == "model 80% of steps"
    assert table[2]["ceiling tok/req-step"] == 5.0 and table[1]["covered %"] == "30"
    das.print_tail(rows, ceiling, "das_w4_both")
    out = capsys.readouterr().out
    # <= 4 requests: (2.5 x 10 + 2.0 x 30) / 40 = 2.125 against the ceiling's (5 x 8 + 4 x 24) / 32 = 4.25
    assert "das_w4_both at <= 4 requests: 2.12 tokens per request-step; the history ceiling" in out
    assert "target >=" not in out and "MISSED" not in out
    assert "the history ceiling there 4.25 (50% of it)" in out


def test_the_built_in_rows_are_priced_by_their_own_entry_where_the_profile_has_one():
    from nemo_rl_specdec.cost.profile import load_profile

    cfg = _cfg()
    confs = {c["name"]: c for c in das.configurations(cfg, das._options(cfg))}
    h100 = load_profile("h100_qwen3_8b")
    assert das.profile_key(confs["vllm_suffix_default"], h100) == "vllm_suffix_default"
    assert das.profile_key(confs["vllm_suffix_default"]) == "vllm_suffix"   # no profile: the drafter's entry
    assert das.profile_key(confs["ngram_default"], h100) == "ngram"         # the profile has no entry of its own
    assert das.profile_key(confs["das_w4_both"], h100) == "das"
    assert confs["vllm_suffix_default"]["cfg"].spec.suffix.max_tree_depth == 24
