"""The hybrid's per-step proposer without an engine: history drafts looked up first, the model half
called with its k or with 0 (vLLM's KV-only forward) as the choice says, one draft per request
from either half, and each half's feedback from what the target accepted."""
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("arctic_inference.suffix_decoding._C")

from nemo_rl_specdec.config.run import validate_spec_block  # noqa: E402
from nemo_rl_specdec.drafters.hybrid import PROBE_EVERY, HybridProposer  # noqa: E402

K = 4
PROMPT = [5, 6, 7, 8]
REPEAT = [1, 2, 3, 4] * 6  # a request that repeats itself: its own tree drafts it
NOVEL = [9, 10, 11, 12, 13, 14, 15, 16]


class _Runner:
    def __init__(self, rows):
        self.vllm_config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=K),
                                           model_config=SimpleNamespace(max_model_len=256))
        self.requests = {rid: SimpleNamespace(sampling_params=SimpleNamespace(extra_args={}), prompt_token_ids=PROMPT)
                         for rid, _ in rows}
        tokens = np.zeros((len(rows), 128), dtype=np.int32)
        n = np.zeros(len(rows), dtype=np.int64)
        for i, (_, toks) in enumerate(rows):
            tokens[i, :len(toks)] = toks
            n[i] = len(toks)
        self.input_batch = SimpleNamespace(req_ids=[r for r, _ in rows], token_ids_cpu=tokens, num_tokens_no_spec=n)


class _Model:
    """vLLM's proposer of the model part as the runner calls it: k columns of the token 99."""

    def __init__(self, rows: int):
        self.rows, self.calls = rows, []

    def __call__(self, sched):
        k = sched.num_spec_tokens_to_schedule
        self.calls.append(k)
        return np.full((self.rows, k), 99)


class _Cost:
    """A step cost with a fixed model forward (`split`, `forward_s`), in place of the online fit."""

    def __init__(self, fwd_s: float):
        self.fwd_s, self.ready = fwd_s, True

    def split(self, requests, ctx_sum, draft_tokens=None):
        return 1e-2, 1e-4

    def forward_s(self, requests, k):
        return self.fwd_s

    def add(self, *a, **kw):
        pass

    def metrics(self):
        return {}


def _hybrid(fwd_s: float | None = None, **hybrid):
    runner = _Runner([("a", PROMPT + REPEAT), ("b", PROMPT + NOVEL)])
    h = HybridProposer(runner, validate_spec_block({"enabled": True, "drafter": "hybrid", "num_speculative_tokens": K,
                                                    "eagle3": {"model": "/ckpt"}, "hybrid": hybrid}))
    if fwd_s is not None:
        h.cost = _Cost(fwd_s)
    return h, runner


def _step(h, model, sampled):
    sched = SimpleNamespace(num_spec_tokens_to_schedule=K)
    out = h.propose(lambda: model(sched), sched, sampled)
    assert sched.num_spec_tokens_to_schedule == K  # restored for vLLM
    return out


def test_a_cheap_model_forward_runs_and_each_request_takes_its_better_draft():
    h, _ = _hybrid(fwd_s=1e-6)
    model = _Model(2)
    out = _step(h, model, [[4], [16]])
    assert model.calls == [K]
    assert out[0] == [1, 2, 3, 4]  # the repeating request: its history draft (calibration's prior beats 0.5)
    assert out[1] == [99] * len(out[1]) and out[1]  # the novel one: the model's
    c = h.counters
    assert c["from_history"] == 1 and c["from_model"] == 1 and c["model_runs"] == 1


def test_a_costly_model_forward_is_skipped_but_vllm_still_runs_its_kv_forward():
    h, _ = _hybrid(fwd_s=10.0)
    model = _Model(2)
    out = _step(h, model, [[4], [16]])
    assert model.calls == [0]  # k = 0: the drafter's KV for the verified tokens is written, no draft forwards
    assert out[0] == [1, 2, 3, 4] and out[1] == []
    assert h.counters["model_skipped"] == 1 and h.counters["skipped_draft_forwards"] == K - 1


def test_above_the_tail_the_model_half_offers_nothing_but_its_kv_forward_runs():
    h, _ = _hybrid(fwd_s=1e-6, tail_requests=1)  # two requests decode: above the tail
    model = _Model(2)
    out = _step(h, model, [[4], [16]])
    assert model.calls == [0]  # no draft forwards; the KV forward of the verified tokens still runs
    assert out[0] == [1, 2, 3, 4] and out[1] == []  # the history half's drafts alone
    c = h.counters
    assert c["above_tail_steps"] == 1 and c["from_model"] == 0 and c["model_skipped"] == 1
    assert h.last_forwards == 1


def test_at_the_tail_the_model_half_drafts_as_without_a_threshold():
    h, _ = _hybrid(fwd_s=1e-6, tail_requests=2)
    model = _Model(2)
    out = _step(h, model, [[4], [16]])
    assert model.calls == [K] and out[1] and out[1] == [99] * len(out[1])
    assert h.counters["above_tail_steps"] == 0 and h.counters["from_model"] == 1


def test_above_the_tail_the_warm_up_does_not_run_the_model_either():
    h, _ = _hybrid(tail_requests=1)  # the online fit: warm-up
    model = _Model(2)
    for _ in range(PROBE_EVERY):
        _step(h, model, [[4], [16]])
    assert model.calls == [0] * PROBE_EVERY
    assert h.counters["above_tail_steps"] == PROBE_EVERY


def test_feedback_goes_to_the_half_that_drafted():
    h, runner = _hybrid(fwd_s=1e-6)
    model = _Model(2)
    out = _step(h, model, [[4], [16]])
    # the target accepted 2 of the history draft (a) and 1 of the model draft (b)
    _step(h, model, [out[0][:2] + [7], [99, 5]])
    c = h.counters
    assert c["history_accepted"] == 2 and c["model_accepted"] == 1
    assert h.model.drafted[:len(out[1])].tolist() == [1] * len(out[1]) and h.model.accepted[0] == 1


def test_warm_up_runs_the_model_but_one_step_in_probe_every():
    h, _ = _hybrid()  # the online fit: not ready in a few steps
    model = _Model(2)
    for _ in range(PROBE_EVERY):
        _step(h, model, [[4], [16]])
    assert model.calls == [K] * (PROBE_EVERY - 1) + [0]
    assert h.counters["warmup_steps"] == PROBE_EVERY


def test_metrics_per_training_step_close_at_each_policy_update():
    h, _ = _hybrid(fwd_s=1e-6)
    model = _Model(2)
    _step(h, model, [[4], [16]])
    assert not any(k.startswith("hybrid/step/") for k in h.specdec_metrics())
    h.specdec_new_policy(1)
    m = h.specdec_metrics()
    assert m["hybrid/step/share_history"] == 0.5 and m["hybrid/step/share_model"] == 0.5
    assert m["hybrid/share_history"] == 0.5 and "das/calls" in m


def test_a_step_whose_k_is_zero_drafts_nothing_but_runs_the_models_kv_forward():
    h, _ = _hybrid(fwd_s=1e-6)
    model = _Model(2)
    sched = SimpleNamespace(num_spec_tokens_to_schedule=0)  # k by batch size: 0 at this batch size
    out = h.propose(lambda: model(sched), sched, [[4], [16]])
    assert out == [[], []] and model.calls == [0] and sched.num_spec_tokens_to_schedule == 0
    assert h.history.counters["rows"] == 2 and h.last_forwards == 1  # the history half accounted for the step


def test_the_model_half_drafts_at_its_own_depth_and_history_at_the_engines_k():
    h, _ = _hybrid(fwd_s=1e-6, model_k=2)
    model = _Model(2)
    out = _step(h, model, [[4], [16]])
    assert model.calls == [2]  # vLLM's proposer asked for model_k tokens
    assert out[0] == [1, 2, 3, 4] and out[1] == [99, 99][:len(out[1])] and 0 < len(out[1]) <= 2
