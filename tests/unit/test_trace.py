"""trace.py: the step record a rollout is priced from; its file form and its errors."""
from __future__ import annotations

import json

import pytest

from nemo_rl_specdec.trace import FORMAT, VERSION, Trace, TraceError, TraceStep


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
def test_a_bad_trace_is_refused_naming_the_field(tmp_path, change, field):
    d = _trace().to_dict()
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
