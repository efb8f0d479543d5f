"""trace.py: the step record a rollout is priced from; its file form and its errors."""
from __future__ import annotations

import json

import pytest

from nemo_rl_specdec.cost.trace import FORMAT, VERSION, Trace, TraceError, TraceStep


def _trace(kind="list", k=3):
    steps = [TraceStep([], [], [], [], 20, None, 2),
             TraceStep(["a", "b"], [10, 10], [3, 3], [3, 0], 0, 1e-4),
             TraceStep(["a", "b"], [14, 11], [3, 1], [1, 1], 0, 2e-4),
             TraceStep(["b"], [13], [0], [0], 0, 5e-5)]
    return Trace(kind, k, steps, "das", "replay", {"note": "planted"})


def test_a_trace_round_trips_through_its_file(tmp_path):
    t = _trace()
    back = Trace.load(t.save(tmp_path / "t.json"))
    assert back.to_dict() == t.to_dict()
    assert back.generated_tokens == 2 + (2 + 3) + (2 + 2) + 1
    assert back.proposer_s == pytest.approx(3.5e-4)


def test_without_drafts_commits_one_token_per_forward_from_the_same_contexts():
    t = _trace()
    base = t.without_drafts()
    assert base.kind == "none" and base.k == 0 and base.generated_tokens == t.generated_tokens
    assert base.steps[0].prefill_tokens == 20 and base.steps[0].rids == []
    assert base.steps[1].ctx == [10, 10] and base.steps[2].ctx == [11, 11]
    per_request = {"a": 0, "b": 0}
    for s in base.steps:
        assert s.drafts == [0] * len(s.rids) and s.proposer_s is None
        for r in s.rids:
            per_request[r] += 1
    assert per_request == {"a": 4 + 2, "b": 1 + 2 + 1}  # what each committed in its decode steps


@pytest.mark.parametrize("change, field", [
    (lambda d: d.update(version=VERSION + 1), "version"),
    (lambda d: d.update(format="something else"), "format"),
    (lambda d: d["steps"][1].update(proposer_s=None), "steps[1].proposer_s"),
    (lambda d: d["steps"][1].update(accepted=[3, 4]), "steps[1]"),
    (lambda d: d["steps"][2].update(drafts=[9, 1]), "steps[2]"),
    (lambda d: d["steps"][1].update(ctx=[10]), "steps[1].ctx"),
    (lambda d: d["steps"][1].update(surprise=1), "steps[1]"),
    (lambda d: d.update(kind="tree"), "kind"),
    (lambda d: d.update(k=0), "k"),
    (lambda d: d["steps"].append({"rids": []}), "steps[4]"),
])
def test_a_bad_trace_is_refused_naming_the_field(tmp_path, change, field, make=_trace):
    d = make().to_dict()
    change(d)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    with pytest.raises(TraceError, match=__import__("re").escape(field)):
        Trace.load(path)


def test_an_engine_trace_has_no_replayed_twin():
    t = _trace()
    t.source = "engine"
    with pytest.raises(TraceError, match="only a replay trace"):
        t.without_drafts()


def test_a_file_that_is_not_a_trace_says_what_it_wants(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("{not json")
    with pytest.raises(TraceError, match="not JSON"):
        Trace.load(p)
    p.write_text(json.dumps({"format": FORMAT}))
    with pytest.raises(TraceError, match="version"):
        Trace.load(p)


def _hybrid():
    steps = [TraceStep([], [], [], [], 20, None, 2),
             TraceStep(["a", "b"], [10, 10], [3, 2], [3, 0], 0, 1e-4, 0, 3),   # the model forwards ran
             TraceStep(["a", "b"], [14, 11], [3, 0], [1, 0], 0, 2e-4, 0, 0)]   # history drafts only
    return Trace("hybrid", 3, steps, "hybrid", "replay", {}, {"history": "das", "model": "eagle3"})


def test_a_hybrid_trace_round_trips_with_its_parts_and_model_forwards(tmp_path):
    t = _hybrid()
    d = t.to_dict()
    assert d["version"] == VERSION == 2 and d["parts"] == {"history": "das", "model": "eagle3"}
    assert [s["model_forwards"] for s in d["steps"]] == [0, 3, 0]
    back = Trace.load(t.save(tmp_path / "h.json"))
    assert back.to_dict() == d and back.steps[1].model_forwards == 3
    assert "parts" not in _trace().to_dict() and "model_forwards" not in _trace().to_dict()["steps"][1]


def test_a_version_1_trace_still_reads(tmp_path):
    d = _trace().to_dict()
    d["version"] = 1
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(d))
    assert Trace.load(path).to_dict() == _trace().to_dict()
    d["steps"][1]["model_forwards"] = 0   # a field version 1 did not have
    path.write_text(json.dumps(d))
    with pytest.raises(TraceError, match=r"steps\[1\]"):
        Trace.load(path)


@pytest.mark.parametrize("change, field", [
    (lambda d: d.update(parts={"history": "das"}), "parts"),
    (lambda d: d.pop("parts"), "parts"),
    (lambda d: d["steps"][1].update(model_forwards=4), "steps[1].model_forwards"),
    (lambda d: d["steps"][2].update(proposer_s=None), "steps[2].proposer_s"),
    (lambda d: d.update(kind="list"), "parts"),
])
def test_a_bad_hybrid_trace_is_refused_naming_the_field(tmp_path, change, field):
    test_a_bad_trace_is_refused_naming_the_field(tmp_path, change, field, _hybrid)


def test_only_a_hybrid_or_model_trace_counts_model_forwards_per_step(tmp_path):
    with pytest.raises(TraceError, match=r"steps\[0\].model_forwards"):
        Trace("list", 3, [TraceStep(["a"], [5], [1], [1], 0, 1e-4, 0, 1)], "das")
    # a model drafter under a rule that skipped its later forwards: the step ran one and verified nothing
    t = Trace("model", 3, [TraceStep(["a"], [5], [0], [0], 0, None, 0, 1)], "eagle3")
    back = Trace.load(t.save(tmp_path / "m.json"))
    assert back.steps[0].model_forwards == 1 and back.to_dict() == t.to_dict()
