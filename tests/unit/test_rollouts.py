"""rollouts.py: problem ids, and the columnar RolloutBatch that carries a step's rollouts."""
from __future__ import annotations

import numpy as np
import pytest

from nemo_rl_specdec.adapter import payload
from nemo_rl_specdec.rollouts import RolloutBatch, RolloutError, RolloutRecord, problem_id


def test_problem_id_is_stable_per_prompt():
    a = problem_id([1, 2, 3])
    assert a == problem_id(np.array([1, 2, 3]))
    assert a != problem_id([1, 2, 4]) and a != problem_id([1, 2])
    assert len(a) == 16
    assert payload.problem_ids(np.array([[1, 2, 3, 0], [1, 2, 3, 9]]), [3, 3]) == [a, a]


def test_rollout_batch_concat_and_pickle_round_trip():
    import pickle

    a = RolloutBatch.pack([{"problem_id": "p", "prompt_token_ids": [1, 2], "token_ids": [3], "policy_version": 0}])
    b = RolloutBatch.pack([RolloutRecord(None, np.array([4], np.int32), np.array([5, 6], np.int32), 1)])
    c = pickle.loads(pickle.dumps(RolloutBatch.concat([a, RolloutBatch.empty(), b])))
    assert [(r.problem_id, r.prompt_token_ids.tolist(), r.token_ids.tolist(), r.policy_version) for r in c] == [
        ("p", [1, 2], [3], 0), (None, [4], [5, 6], 1)]
    assert c.num_tokens == 6 and len(c) == 2
    with pytest.raises(RolloutError, match=r"rollouts\[0\]: missing key\(s\) \['token_ids'\]"):
        RolloutBatch.pack([{"problem_id": "p", "output_token_ids": [1], "policy_version": 0}])


def test_token_sequences_read_records_dicts_and_keep_aligned_logprobs():
    from nemo_rl_specdec.rollouts import TokenSequence, token_sequences

    rec = RolloutRecord("p", np.array([1, 2], np.int32), np.array([3], np.int32), 0)
    d = {"prompt_token_ids": [1], "token_ids": [4, 5], "logprobs": [-0.5, -1.0]}
    short = {"prompt_token_ids": [1], "token_ids": [4, 5], "logprobs": [-0.5]}
    assert token_sequences([rec, d], 10) == [TokenSequence([1, 2], [3]), TokenSequence([1], [4, 5])]
    got = token_sequences([d, short], 10, logprobs=True)
    assert got[0].logprobs == [-0.5, -1.0] and got[1].logprobs is None  # misaligned: dropped


def test_token_sequences_name_the_bad_rollout_with_the_callers_error():
    from nemo_rl_specdec.rollouts import token_sequences

    class Mine(ValueError):
        pass

    with pytest.raises(Mine, match=r"rollouts\[1\].*outside the vocabulary \[0, 10\)"):
        token_sequences([{"prompt_token_ids": [1], "token_ids": [2]}, {"prompt_token_ids": [1], "token_ids": [10]}],
                        10, error=Mine)
    with pytest.raises(RolloutError, match=r"rollouts\[0\]: empty prompt"):
        token_sequences([{"prompt_token_ids": [], "token_ids": [2]}], 10)
    with pytest.raises(RolloutError, match=r"rollouts\[0\]: needs prompt_token_ids and token_ids"):
        token_sequences([{"token_ids": [2]}], 10)


def test_as_record_reads_an_engine_rollout_and_refuses_other_objects():
    from types import SimpleNamespace

    from nemo_rl_specdec.rollouts import Rollout, as_record

    ro = Rollout(0, "p", [1, 2], [3, 4], [-0.1, -0.2], "stop", 2, 2, 1)
    rec = as_record(ro)
    assert (rec.problem_id, rec.prompt_token_ids.tolist(), rec.token_ids.tolist(), rec.policy_version) == \
        ("p", [1, 2], [3, 4], 2)
    with pytest.raises(RolloutError, match=r"rollouts\[5\]: expected a dict with .*, a RolloutRecord or a Rollout; "
                                           r"got SimpleNamespace"):
        as_record(SimpleNamespace(token_ids=[1], policy_version=0), 5)
