"""payload.py: rollouts cut from a NeMo-RL generation batch, the rollout stash, the staged update."""
from __future__ import annotations

import numpy as np
import pytest

from nemo_rl_specdec.adapter import payload
from nemo_rl_specdec.rollouts import RolloutBatch, RolloutError, problem_id
from nemo_rl_specdec.update import PolicyUpdate


def test_rollouts_from_a_generation_batch_cut_prompt_and_output():
    """NeMo-RL's vLLM worker writes the unpadded prompt, then the generated tokens, then padding."""
    input_ids = np.array([[5, 6, 7, 0], [8, 9, 0, 0]])
    output_ids = np.array([[5, 6, 7, 11, 12, 0], [8, 9, 13, 0, 0, 0]])
    batch = RolloutBatch.from_generation(input_ids, np.array([3, 2]), output_ids, np.array([2, 1]), policy_version=4)
    got = [(r.problem_id, r.prompt_token_ids.tolist(), r.token_ids.tolist(), r.policy_version) for r in batch]
    assert got == [(problem_id([5, 6, 7]), [5, 6, 7], [11, 12], 4), (problem_id([8, 9]), [8, 9], [13], 4)]
    tail = RolloutBatch.from_generation(input_ids, [3, 2], output_ids, [2, 1], 4, prompt_tail=1)
    assert [r.prompt_token_ids.tolist() for r in tail] == [[7], [9]]
    assert [r.problem_id for r in tail] == [r.problem_id for r in batch]  # ids hash the whole prompt
    with pytest.raises(RolloutError, match="batch sizes differ"):
        RolloutBatch.from_generation(input_ids, [3, 2], output_ids[:1], [2], 0)
    with pytest.raises(RolloutError, match="exceed"):
        RolloutBatch.from_generation(input_ids, [3, 2], output_ids, [9, 1], 0)


def test_rollout_stash_keeps_the_newest_within_its_token_budget():
    stash = payload.RolloutStash(max_tokens=10)
    mk = lambda i, n: RolloutBatch.pack([{"problem_id": f"p{i}", "prompt_token_ids": [i] * 2,  # noqa: E731
                                           "token_ids": [i] * n, "policy_version": i}])
    stash.add(mk(1, 3))
    stash.add(mk(2, 3))
    assert (len(stash), stash.tokens, stash.dropped) == (2, 10, 0)
    stash.add(mk(3, 1))
    assert (len(stash), stash.tokens, stash.dropped) == (2, 8, 1)
    out = stash.drain()
    assert out.problem_ids == ["p2", "p3"]
    assert len(stash) == 0 and stash.tokens == 0


def test_stage_payload():
    assert payload.stage_payload(3, ["ref"]) == PolicyUpdate(3, rollouts=["ref"])
    assert payload.stage_payload(2, drafter_weights="w", refresh_drafter=False, drafter_checkpoint=True) == \
        PolicyUpdate(2, drafter_weights="w", refresh_drafter=False, drafter_checkpoint=True)
    assert payload.stage_payload(2).rollouts is None
    with pytest.raises(ValueError, match=">= 1"):
        payload.stage_payload(0)
    assert payload.resolve_staged(payload.stage_payload(1)).rollouts is None  # nothing staged stays None
    assert len(payload.resolve_staged(payload.stage_payload(1, [])).rollouts) == 0
