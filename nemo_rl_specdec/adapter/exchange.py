"""What the parts of a NeMo-RL run hand each other at a refit, through two small Ray actors.

`RolloutExchange`: the engines of one `VllmGeneration` swap their rollouts at every refit, so
each engine's drafter sees the whole step. Each engine's worker actor registers once (`join`)
after its engine is up. At a refit, every engine calls `swap(engine, round, refs)` with the object
refs of the rollouts it generated; the call returns when all registered engines have swapped for
that round, with everyone's refs. Only refs travel through the actor; the tokens stay in Ray's
object store. Refits are collective in NeMo-RL (every engine takes part in each), so a round
completes unless an engine is gone; then `swap` fails after `timeout_s` naming the engines that
never arrived.

`DrafterBoard`: the drafter the policy workers distilled last (`policy_workers.py`), by
reference, with its sequence number and training stats. The trainer `publish`es after each policy
step; every engine's worker actor takes the newest one it has not applied (`latest`) and stages
it into the refit that carries the new policy, so both land in the same versioned update. One
board per Ray job (`board_name`): the driver that trains and the worker actors that refit (in
sync and async GRPO alike) find it by name.
"""
from __future__ import annotations

import asyncio
from typing import Any


class RolloutExchange:
    """Async Ray actor class (wrap with `ray.remote`); see module docstring."""

    def __init__(self, timeout_s: float = 300.0):
        self.timeout_s = float(timeout_s)
        self.engines: set = set()
        self.rounds: dict = {}  # round -> {"refs": {engine: refs}, "done": Event, "left": set}

    def join(self, engine: str) -> int:
        self.engines.add(engine)
        return len(self.engines)

    def num_engines(self) -> int:
        return len(self.engines)

    async def swap(self, engine: str, round_id: int, refs: list) -> list:
        if engine not in self.engines:
            raise RuntimeError(f"engine {engine!r} swapped rollouts without joining the exchange")
        r = self.rounds.setdefault(round_id, {"refs": {}, "done": asyncio.Event(), "left": set(self.engines)})
        r["refs"][engine] = list(refs)
        if set(r["refs"]) >= self.engines:
            r["done"].set()
        try:
            await asyncio.wait_for(r["done"].wait(), self.timeout_s)
        except asyncio.TimeoutError:
            missing = sorted(self.engines - set(r["refs"]))
            raise TimeoutError(f"rollout exchange round {round_id}: engines {missing} did not reach the refit "
                               f"within {self.timeout_s:.0f} s; their rollouts would be missing from every "
                               "drafter, so the refit fails instead") from None
        out = [ref for e in sorted(r["refs"]) for ref in r["refs"][e]]
        r["left"].discard(engine)
        if not r["left"]:
            del self.rounds[round_id]
        return out


class DrafterBoard:
    """Ray actor class (wrap with `ray.remote`); see module docstring."""

    def __init__(self):
        self.seq, self.refs, self.stats = -1, None, {}

    def publish(self, seq: int, refs: list, stats: dict) -> int:
        if int(seq) <= self.seq:
            raise ValueError(f"drafter {seq} published after drafter {self.seq}: publications must be in order")
        self.seq, self.refs, self.stats = int(seq), list(refs), dict(stats)
        return self.seq

    def latest(self, after_seq: int) -> Any:
        """(seq, refs, stats) of the newest drafter if it is newer than `after_seq`, else None."""
        return (self.seq, self.refs, self.stats) if self.seq > int(after_seq) else None


def exchange_actor_class() -> Any:
    import ray

    return ray.remote(num_cpus=0)(RolloutExchange)


def board_name() -> str:
    """The drafter board's actor name in this Ray job (the same in the driver and in its actors)."""
    import ray

    return f"specdec_drafters_{ray.get_runtime_context().get_job_id()}"


def drafter_board(create: bool = False) -> Any:
    """This job's drafter board (created with `create`); raises ValueError when it does not exist."""
    import ray

    if create:
        return ray.remote(num_cpus=0)(DrafterBoard).options(name=board_name(), get_if_exists=True).remote()
    return ray.get_actor(board_name())
