"""Placement of a rollout batch's requests onto data-parallel engines.

A synchronous RL step waits for the slowest engine, and that engine's slowest request. The
policies:

- `contiguous`: NeMo-RL's behaviour today — the batch is cut into `num_engines` contiguous
  shards in input order (sizes differ by at most one, the first shards take the extra). The
  samples of one GRPO group sit next to each other in the batch, so they land on one engine.
- `round_robin`: request i (in input order) goes to engine i mod num_engines.
- `length_aware`: longest-processing-time first (LPT) over predicted lengths: requests are
  taken longest first and each goes to the engine that (1) holds the fewest samples of the
  same problem so far — so a group is spread as evenly as possible, at most
  ceil(group size / num_engines) per engine — then (2) has the least total predicted tokens,
  then (3) holds the fewest requests (so zero or equal predictions — a cold predictor —
  still spread the batch evenly instead of piling it onto engine 0), then (4) the lowest
  engine number. Each engine's list is ordered longest predicted first, so
  long requests start first when an engine has more requests than batch slots.

`contiguous` and `round_robin` keep input order within an engine. Every policy is
deterministic (ties broken by input position), and every request appears exactly once.

A request is anything with the attributes `index`, `problem_id` and `predicted_len`, e.g.
`Request(index=3, problem_id="p7", predicted_len=812.0)`. `index` is the
request's position in the caller's batch; `place` returns those indices, and
`restore_order(per_engine_outputs, assignment)` puts per-engine results back in index order.
"""
from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

PLACEMENTS = ("contiguous", "round_robin", "length_aware")


@dataclass(frozen=True)
class Request:
    index: int
    problem_id: Hashable
    predicted_len: float = 0.0


def _field(r: Any, name: str) -> Any:
    if not hasattr(r, name):
        raise ValueError(f"request {r!r}: missing attribute {name!r} (a request has index, problem_id, "
                         "predicted_len, e.g. scheduling.placement.Request)")
    return getattr(r, name)


def _normalize(requests: Sequence[Any]) -> list[Request]:
    out, seen = [], set()
    for r in requests:
        idx = _field(r, "index")
        if isinstance(idx, bool) or not isinstance(idx, int):
            raise ValueError(f"request index {idx!r}: expected an int")
        if idx in seen:
            raise ValueError(f"request index {idx} appears more than once")
        seen.add(idx)
        pred = float(_field(r, "predicted_len"))
        if pred != pred or pred < 0:
            raise ValueError(f"request {idx}: predicted_len={pred!r}, expected a number >= 0")
        out.append(Request(idx, _field(r, "problem_id"), pred))
    return out


def place(requests: Sequence[Any], num_engines: int, policy: str = "contiguous") -> list[list[int]]:
    """Assign requests to engines: a list per engine of request indices (see module doc)."""
    if policy not in PLACEMENTS:
        raise ValueError(f"placement policy {policy!r}: expected one of {list(PLACEMENTS)}")
    if isinstance(num_engines, bool) or not isinstance(num_engines, int) or num_engines < 1:
        raise ValueError(f"num_engines={num_engines!r}: expected an int >= 1")
    reqs = _normalize(requests)
    n, e = len(reqs), num_engines
    out: list[list[int]] = [[] for _ in range(e)]
    if policy == "contiguous":
        base, extra = divmod(n, e)
        start = 0
        for j in range(e):
            size = base + (1 if j < extra else 0)
            out[j] = [r.index for r in reqs[start:start + size]]
            start += size
        return out
    if policy == "round_robin":
        for pos, r in enumerate(reqs):
            out[pos % e].append(r.index)
        return out

    # length_aware: LPT with groups spread first.
    order = sorted(range(n), key=lambda p: (-reqs[p].predicted_len, p))
    load = [0.0] * e
    group_count: list[dict[Hashable, int]] = [dict() for _ in range(e)]
    placed: list[list[tuple[float, int, int]]] = [[] for _ in range(e)]
    # O(n * engines): a plain scan, since the group count has to be checked per engine anyway.
    for p in order:
        r = reqs[p]
        counts = [g.get(r.problem_id, 0) for g in group_count]
        fewest = min(counts)
        j = min((k for k in range(e) if counts[k] == fewest), key=lambda k: (load[k], len(placed[k]), k))
        load[j] += r.predicted_len
        group_count[j][r.problem_id] = counts[j] + 1
        placed[j].append((-r.predicted_len, p, r.index))
    for j in range(e):
        out[j] = [idx for _, _, idx in sorted(placed[j])]
    return out


def restore_order(per_engine_outputs: Sequence[Sequence[Any]], assignment: list[list[int]]) -> list[Any]:
    """Outputs in request-index order. `per_engine_outputs[j][m]` is the result of request
    `assignment[j][m]`; indices must be exactly 0..n-1. Raises ValueError naming the engine on
    a length mismatch, and on duplicated or missing indices (no result silently dropped)."""
    if len(per_engine_outputs) != len(assignment):
        raise ValueError(
            f"got outputs for {len(per_engine_outputs)} engines but the assignment has {len(assignment)}"
        )
    n = sum(len(a) for a in assignment)
    out: list[Any] = [None] * n
    filled = [False] * n
    for j, (outs, idxs) in enumerate(zip(per_engine_outputs, assignment, strict=True)):
        if len(outs) != len(idxs):
            raise ValueError(f"engine {j}: returned {len(outs)} outputs for {len(idxs)} requests")
        for idx, o in zip(idxs, outs, strict=True):
            if not 0 <= idx < n:
                raise ValueError(f"engine {j}: request index {idx} outside 0..{n - 1}")
            if filled[idx]:
                raise ValueError(f"engine {j}: request index {idx} assigned more than once")
            out[idx], filled[idx] = o, True
    return out


__all__ = ["PLACEMENTS", "Request", "place", "restore_order"]
