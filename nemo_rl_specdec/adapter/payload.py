"""What the worker actors hand the drafter: the rollouts each engine generated, stashed as
`RolloutBatch` chunks, and the `PolicyUpdate` staged into the engine before each refit.

Rollouts travel by reference: a worker `ray.put`s its stash once per refit, the exchange
(`exchange.py`) hands every engine the references of all engines, and each vLLM worker
resolves them from Ray's object store (`resolve_staged`), so every engine's store holds the
whole step whatever placement did. When generation ends (NeMo-RL's `finish_generation`) the same refs
are staged into the engines for a background store rebuild (`resolve_rollouts`), and the refit's
update then says `STAGED_ROLLOUTS`. NeMo-RL's async engine runs vLLM's engine core in a process
outside Ray: there the worker actor resolves the refs and sends what they hold
(`for_engine_core`). No NeMo-RL, no vLLM.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from nemo_rl_specdec.lockstep import STAGED_ROLLOUTS
from nemo_rl_specdec.rollouts import RolloutBatch, problem_id
from nemo_rl_specdec.update import PolicyUpdate

# Keys the driver adds to a generation batch (one value per row); NeMo-RL's workers ignore them.
NO_RECORD_KEY = "specdec_no_record"        # bool: a validation row, never handed to the drafter
BUDGET_KEY = "specdec_budget"              # int: max draft tokens for the request (-1: the drafter's k)
PREDICTED_KEY = "specdec_predicted_len"    # float: predicted output tokens (-1: none)


def problem_ids(input_ids: Any, input_lengths: Any) -> list[str]:
    """The problem id of each row of a right-padded prompt batch."""
    lens = input_lengths.tolist() if hasattr(input_lengths, "tolist") else list(input_lengths)
    return [problem_id(row[: int(n)]) for row, n in zip(input_ids, lens, strict=True)]


class RolloutStash:
    """Rollouts finished since the last policy update, bounded by a token budget (oldest chunks dropped)."""

    def __init__(self, max_tokens: int = 16_000_000):
        self.max_tokens = int(max_tokens)
        self._chunks: deque = deque()
        self._tokens = 0
        self.dropped = 0

    def __len__(self) -> int:
        return sum(len(c) for c in self._chunks)

    @property
    def tokens(self) -> int:
        return self._tokens

    def add(self, batch: RolloutBatch) -> None:
        if not len(batch):
            return
        self._chunks.append(batch)
        self._tokens += batch.num_tokens
        while self._tokens > self.max_tokens and len(self._chunks) > 1:
            old = self._chunks.popleft()
            self._tokens -= old.num_tokens
            self.dropped += len(old)

    def peek(self) -> RolloutBatch:
        """What `drain` would return, left in place (a checkpoint saves it)."""
        return RolloutBatch.concat(list(self._chunks))

    def drain(self) -> RolloutBatch:
        out = RolloutBatch.concat(list(self._chunks))
        self._chunks.clear()
        self._tokens = 0
        return out


def stage_payload(version: int, rollout_refs: Any = None,
                  drafter_weights: Any = None, refresh_drafter: bool = True,
                  drafter_checkpoint: bool = False) -> PolicyUpdate:
    """The update the worker actor stages into every vLLM worker right before a refit RPC (NeMo-RL's
    refit carries the policy weights, so `policy` stays None).

    `rollout_refs`: Ray object refs of `RolloutBatch`es (every engine's share of the step), None
    when this refit carries no rollouts, or `lockstep.STAGED_ROLLOUTS` when they were handed over at
    the end of generation and the store was rebuilt in the background (the refit installs it);
    `drafter_weights` may be a Ray object ref. Refs are fetched inside the refit RPC
    (`resolve_staged`), or by the async worker actor before it (`for_engine_core`). The drafter is
    not touched by staging: the extension applies it inside the refit RPC, so target and drafter
    change together.
    """
    if int(version) < 1:
        raise ValueError(f"policy version must be >= 1, got {version}")
    if isinstance(rollout_refs, str) and rollout_refs != STAGED_ROLLOUTS:
        raise ValueError(f"rollout_refs: got {rollout_refs!r}; allowed: Ray object refs, None or {STAGED_ROLLOUTS!r}")
    if rollout_refs is not None and not isinstance(rollout_refs, str):
        rollout_refs = list(rollout_refs)
    return PolicyUpdate(int(version), drafter_weights=drafter_weights, rollouts=rollout_refs,
                        refresh_drafter=refresh_drafter,  # False: an off-cadence step (refresh.every_n_steps)
                        drafter_checkpoint=drafter_checkpoint)  # the drafter is still the checkpoint the engine loaded


def resolve_staged(staged: PolicyUpdate) -> PolicyUpdate:
    """The staged update with its Ray refs replaced by what they hold: the drafter weights, and the
    rollout refs as one `RolloutBatch` (None stays None: no rollouts were staged)."""
    weights = staged.drafter_weights
    if type(weights).__name__ == "ObjectRef":
        import ray

        weights = ray.get(weights)
    rollouts = staged.rollouts
    if not (isinstance(rollouts, str) and rollouts == STAGED_ROLLOUTS):  # "staged": already in the engine
        rollouts = resolve_rollouts(rollouts)
    return staged.with_(drafter_weights=weights, rollouts=rollouts)


def resolve_rollouts(refs: Sequence[Any] | RolloutBatch | None) -> RolloutBatch | None:
    """Ray object refs of `RolloutBatch`es as one batch (None stays None; no refs: an empty batch; a
    batch stays itself: the async worker resolves the refs before vLLM's multiprocess engine core)."""
    if refs is None or isinstance(refs, RolloutBatch):
        return refs
    if not refs:
        return RolloutBatch.empty()
    import ray

    batches = ray.get(list(refs))
    bad = [type(b).__name__ for b in batches if not isinstance(b, RolloutBatch)]
    if bad:
        raise TypeError(f"staged rollout refs must hold RolloutBatch objects, got {bad}")
    return RolloutBatch.concat(batches)


def for_engine_core(staged: PolicyUpdate) -> bytes:
    """The staged update for vLLM's multiprocess engine core (NeMo-RL's async engine): its refs
    resolved here, in the worker actor (a ref pickled on the way loses its owner), as
    `PolicyUpdate.to_rpc()` bytes. Blocks on Ray: async callers run it in a thread."""
    return resolve_staged(staged).to_rpc()
