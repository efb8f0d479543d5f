"""Rollouts handed to the drafter, and the payload staged into the engine before each refit.

A NeMo-RL generation output row holds `prompt (right-padded to input_lengths) + generated
tokens`; we cut it into (prompt, output) token lists, tag it with a problem id (a hash of the
prompt tokens: all samples of one GRPO prompt share it, across steps and epochs) and the policy
version it was sampled with. Pure Python + numpy; no NeMo-RL, no vLLM.
"""
from __future__ import annotations

import hashlib
from collections import deque
from typing import Any, Optional, Sequence

import numpy as np


def _as_list(x: Any) -> list:
    if hasattr(x, "tolist"):
        return x.tolist()
    return list(x)


def problem_id(prompt_tokens: Sequence[int]) -> str:
    """Stable id of a prompt: 16 hex chars of blake2b over its int32 tokens."""
    arr = np.asarray(_as_list(prompt_tokens), dtype=np.int64)
    return hashlib.blake2b(arr.tobytes(), digest_size=8).hexdigest()


def prompt_rows(input_ids: Any, input_lengths: Any) -> list[list[int]]:
    ids = _as_list(input_ids)
    lens = [int(v) for v in _as_list(input_lengths)]
    return [list(map(int, row[:n])) for row, n in zip(ids, lens)]


def problem_ids(input_ids: Any, input_lengths: Any) -> list[str]:
    return [problem_id(p) for p in prompt_rows(input_ids, input_lengths)]


def extract_rollouts(input_ids: Any, input_lengths: Any, output_ids: Any, generation_lengths: Any,
                     policy_version: int) -> list[dict]:
    """Rows of a generation output as rollout dicts (see module docstring)."""
    prompts = prompt_rows(input_ids, input_lengths)
    outs = _as_list(output_ids)
    gens = [int(v) for v in _as_list(generation_lengths)]
    if not (len(prompts) == len(outs) == len(gens)):
        raise ValueError(f"batch sizes differ: prompts={len(prompts)} outputs={len(outs)} lengths={len(gens)}")
    rollouts = []
    for prompt, row, g in zip(prompts, outs, gens):
        start = len(prompt)
        output = list(map(int, row[start:start + g]))
        if len(output) != g:
            raise ValueError(f"output row shorter than prompt + generation_length ({len(row)} < {start + g})")
        rollouts.append({
            "problem_id": problem_id(prompt),
            "prompt_token_ids": prompt,
            "output_token_ids": output,
            "policy_version": int(policy_version),
        })
    return rollouts


class RolloutStash:
    """Rollouts finished since the last policy update, bounded by a token budget (oldest dropped).

    Tokens are kept as int32 arrays (4 bytes/token); `drain()` returns plain dicts of lists.
    """

    def __init__(self, max_tokens: int = 16_000_000):
        self.max_tokens = int(max_tokens)
        self._items: deque = deque()
        self._tokens = 0
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def tokens(self) -> int:
        return self._tokens

    def add(self, rollouts: list[dict]) -> None:
        for r in rollouts:
            p = np.asarray(r["prompt_token_ids"], dtype=np.int32)
            o = np.asarray(r["output_token_ids"], dtype=np.int32)
            self._items.append((r["problem_id"], p, o, int(r["policy_version"])))
            self._tokens += p.size + o.size
        while self._tokens > self.max_tokens and self._items:
            _, p, o, _ = self._items.popleft()
            self._tokens -= p.size + o.size
            self.dropped += 1

    def drain(self) -> list[dict]:
        out = [{"problem_id": pid, "prompt_token_ids": p.tolist(), "output_token_ids": o.tolist(),
                "policy_version": v} for pid, p, o, v in self._items]
        self._items.clear()
        self._tokens = 0
        return out


def stage_payload(version: Optional[int], rollouts: Optional[list[dict]] = None,
                  drafter_weights: Optional[list] = None) -> dict:
    """What the worker actor stages into every vLLM worker right before a refit RPC.

    The drafter is not touched by staging: the extension applies it inside the refit's own
    finalize step, so target and drafter change in the same engine RPC.
    """
    if version is not None and int(version) < 1:
        raise ValueError(f"policy version must be >= 1, got {version}")
    return {
        "version": None if version is None else int(version),
        "rollouts": list(rollouts or []),
        "drafter_weights": drafter_weights,
    }
