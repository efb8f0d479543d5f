"""rollouts.py: problem ids, and the columnar RolloutBatch that carries a step's rollouts."""
from __future__ import annotations

import numpy as np
import pytest

from nemo_rl_specdec.nemo_rl import payload
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
