"""`RolloutExchange`: a Ray actor through which the engines of one `VllmGeneration` swap their
rollouts at every refit, so each engine's drafter sees the whole step.

Each engine's worker actor registers once (`join`) after its engine is up. At a refit, every
engine calls `swap(engine, round, refs)` with the object refs of the rollouts it generated; the
call returns when all registered engines have swapped for that round, with everyone's refs.
Only refs travel through the actor; the tokens stay in Ray's object store. Refits are collective
in NeMo-RL (every engine takes part in each), so a round completes unless an engine is gone; then
`swap` fails after `timeout_s` naming the engines that never arrived.
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


def exchange_actor_class() -> Any:
    import ray

    return ray.remote(num_cpus=0)(RolloutExchange)
