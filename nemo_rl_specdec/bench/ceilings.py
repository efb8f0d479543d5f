"""Ceilings: what no placement, no history drafter and no hybrid rule can beat, each a bound by
construction, computed on the same recorded text and priced by the one cost function
(`cost/model.py` `CostModel.cost`).

**Placement** (`bench --suite scheduling`, the priced placements). The objective is a batch's priced
makespan on E engines under a fixed model of each request's steps: request i's steps are the ones a
replay of the whole batch gave it (`request_steps`: its prompt's prefill, then one decode row per
target forward with its context and the drafts it verified), and an engine runs its requests as
`bench/replay.py` schedules them (first in, first admitted; at most ``slots`` at once; the entering
requests' prefill is a step of its own, then every running request advances one row per step), each
step priced by the one cost function (`PlacementPricer.engine_s`). On that objective:

- `PlacementPricer.search` is the best makespan over a real search: LPT on the priced per-request
  cost (each request's time run alone, largest first, onto the engine with the least such cost),
  the heuristics' own placements as further starts, then moves and swaps between the slowest engine
  and the others while they shorten the priced makespan. It is a placement, so the optimum is at most it.
- `PlacementPricer.lower_bound` is at most every placement's makespan. Proof: the cost function is
  monotone, a step with more requests' rows (or more prefill tokens) never costs less (every term of
  `CostModel.parts` is non-decreasing in the step's requests, tokens, contexts and drafts, given the
  profile's non-negative constants; `test_ceilings.py` checks it). (a) The engine holding request i
  runs each of i's rows in a step of its own, priced at least as i's row alone, so its time is at least
  i's time run alone: makespan >= max_i alone(i). (b) A step holds at most c = min(slots, requests)
  rows, and costs at least its dearest row alone, so at least the mean of its rows alone; summed over
  an engine's steps, at least (1/c) x the sum of its rows priced alone, and over the E engines the
  slowest takes at least 1/E of the total: makespan >= sum of every row alone / (c E).
  The optimum lies between the bound and the search; a heuristic's share of the optimum lies between
  bound / heuristic and search / heuristic.

**History drafters** (`bench --suite das`, `drafters`). `HindsightHistory` is a `ReplayDrafter` whose
draft at every step is the longest run of the tokens the target actually generated next (at most k)
that the text a history store could hold by then has right after an occurrence of the context's last
`MIN_MATCH` tokens: the hindsight-best draft such a store could propose. That text is every earlier
batch (prompts and responses), the current batch's prompts, and every running request's verified
tokens (its own and its siblings'). Every history drafter compared proposes a continuation of an
occurrence in its store of a suffix of the context at least `MIN_MATCH` long (DAS and vLLM's suffix
through arctic-inference's suffix tree, whose `speculate` tries match lengths from 1 and proposes
nothing when no context token matches; vLLM's n-gram at its defaults, `prompt_lookup_min` 5; ours,
`prompt_lookup_min` >= 1): the context's last `MIN_MATCH` tokens followed by its draft occur in the
text, and the ceiling's draft is the longest such run of the true next tokens, so the drafter accepts
at most as many tokens at the same position. By induction over the steps (every request of the batch admitted
at once, as the suites replay them): if every request is at least as far in the ceiling's replay as
in the drafter's, the ceiling's text holds the drafter's (siblings are further too), and a run that
occurs there from the drafter's position, with the `MIN_MATCH` tokens before it, still occurs from
any later position up to its end with the `MIN_MATCH` tokens before that position (they are inside
the run or the drafter's own matched tokens), so after the step the ceiling is still at least as far.
Each request takes no more target forwards: tokens per forward are a ceiling at that k.

**Hybrid** (`bench --suite hybrid`). `hybrid_bound`: per request, the fewest decode forwards over the
recorded text when at each position the step may commit up to 1 + the larger of the model half's
accepted draft there (its teacher-forced draft, `model_drafts`) and the history hindsight above with
no context match asked of it (the longest run of the next tokens anywhere in the text, at least the
history ceiling's draft), the
store's text taken at its largest (every earlier batch, the batch's prompts, the siblings' whole
responses and the request's own tokens so far, which holds whatever any store held at any time).
Any rule that picks, per request and step, the history draft, the model draft, a cut of either or
none commits no more at any position, so its path of positions is one the bound's shortest path
minimises over: its tokens per forward cannot exceed the bound's, whatever it chooses.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from nemo_rl_specdec.cost.model import CostModel, Step
from nemo_rl_specdec.cost.trace import FORWARD_KINDS, Trace

# ------------------------------------------------------------------------------------------- placement


@dataclass(frozen=True)
class RequestSteps:
    """One request's steps as an engine runs them: its prompt's prefill, then per target forward its
    context before the step and the draft tokens it verified."""

    prefill_tokens: int
    ctx: tuple
    drafts: tuple

    @property
    def rows(self) -> int:
        return len(self.ctx)


def request_steps(trace: Trace, prompt_lens: Sequence[int]) -> list[RequestSteps]:
    """Each request's steps (`RequestSteps`, in request-id order 0..n-1) from a replay trace of the
    batch: its decode rows as the trace has them, its prefill of `prompt_lens[i]` tokens."""
    ctx: dict = {i: [] for i in range(len(prompt_lens))}
    drafts: dict = {i: [] for i in range(len(prompt_lens))}
    for s in trace.steps:
        for rid, c, d in zip(s.rids, s.ctx, s.drafts, strict=True):
            if rid not in ctx:
                raise ValueError(f"request_steps: the trace's request {rid!r} is not one of the "
                                 f"{len(prompt_lens)} requests (ids 0..{len(prompt_lens) - 1})")
            ctx[rid].append(int(c))
            drafts[rid].append(int(d))
    return [RequestSteps(int(p), tuple(ctx[i]), tuple(drafts[i])) for i, p in enumerate(prompt_lens)]


class PlacementPricer:
    """Priced makespans of placements of `requests` (module doc): `cost` the one cost function of the
    drafter's profile entry, `slots` the requests an engine decodes at once (None: all of them),
    `proposer` whether a history proposer runs on every decode step (a list drafter's trace)."""

    def __init__(self, requests: Sequence[RequestSteps], cost: CostModel, slots: int | None = None,
                 proposer: bool = True):
        self.requests, self.cost, self.proposer = list(requests), cost, proposer
        self.slots = slots
        self._cache: dict = {}
        self.evaluations = 0
        self._row: dict = {}

    def _step_s(self, rows: list, prefill: int) -> float:
        if prefill:
            return self.cost.cost(Step.of(np.zeros(0), np.zeros(0), prefill, proposer=False)).total_s
        ctx = np.asarray([r[0] for r in rows], dtype=float)
        d = np.asarray([r[1] for r in rows], dtype=float)
        return self.cost.cost(Step.of(ctx, d, proposer=self.proposer)).total_s

    def engine_s(self, order: Sequence[int]) -> float:
        """The priced time of one engine running the requests `order` (admitted in that order)."""
        key = tuple(order)
        if key in self._cache:
            return self._cache[key]
        self.evaluations += 1
        waiting = list(key)
        limit = self.slots or max(1, len(waiting))
        active: list = []   # [request, next row]
        total = 0.0
        while active or waiting:
            entering: list[int] = []
            while waiting and len(active) + len(entering) < limit:
                entering.append(waiting.pop(0))
            if entering:
                total += self._step_s([], sum(self.requests[i].prefill_tokens for i in entering))
                active += [[i, 0] for i in entering if self.requests[i].rows]
                if not active:
                    continue
            total += self._step_s([(self.requests[i].ctx[j], self.requests[i].drafts[j]) for i, j in active], 0)
            for a in active:
                a[1] += 1
            active = [a for a in active if a[1] < self.requests[a[0]].rows]
        self._cache[key] = total
        return total

    def makespan(self, assignment: Sequence[Sequence[int]]) -> float:
        return max((self.engine_s(e) for e in assignment if len(e)), default=0.0)

    def alone_s(self, i: int) -> float:
        """Request i's priced time on an engine of its own."""
        return self.engine_s([i])

    def _rows_alone_s(self, i: int) -> float:
        """The sum of request i's steps each priced on its own (its prefill, then each row)."""
        if i not in self._row:
            r = self.requests[i]
            self._row[i] = self._step_s([], r.prefill_tokens) + sum(self._step_s([(c, d)], 0)
                                                                    for c, d in zip(r.ctx, r.drafts, strict=True))
        return self._row[i]

    def lower_bound(self, engines: int) -> dict:
        """A priced makespan no placement on `engines` engines goes below (module doc): the larger of
        the longest request run alone and the work bound."""
        n = len(self.requests)
        alone = max((self.alone_s(i) for i in range(n)), default=0.0)
        cap = min(self.slots or n, n) or 1
        work = sum(self._rows_alone_s(i) for i in range(n)) / (cap * engines)
        return {"lower_bound_s": max(alone, work), "longest_alone_s": alone, "work_bound_s": work,
                "set_by": "tail length" if alone >= work else "work"}

    def lpt(self, engines: int) -> list[list[int]]:
        """LPT on the priced per-request cost: requests by their priced time alone, largest first, each
        onto the engine whose summed per-request cost is least (ties: the lower engine)."""
        order = sorted(range(len(self.requests)), key=lambda i: (-self.alone_s(i), i))
        out: list[list[int]] = [[] for _ in range(engines)]
        load = [0.0] * engines
        for i in order:
            e = min(range(engines), key=lambda x: (load[x], x))
            out[e].append(i)
            load[e] += self.alone_s(i)
        return out

    def search(self, engines: int, starts: dict | None = None, max_evaluations: int = 4000) -> dict:
        """The best priced makespan found: LPT and every placement in `starts` ({name: assignment}),
        each improved by local search (`improve`); the best of them. Its makespan is that of a real
        placement (`assignment`), so the optimum is at most it."""
        cands = {"lpt": self.lpt(engines), **(starts or {})}
        best_name, best, best_s = "", None, math.inf
        for name, a in cands.items():
            a = [list(e) for e in a] + [[] for _ in range(engines - len(a))]
            s = self.makespan(a)
            if s < best_s:
                best_name, best, best_s = name, a, s
        assert best is not None
        start_s = best_s
        best, best_s = self.improve(best, max_evaluations)
        return {"search_s": best_s, "assignment": best, "start": best_name, "start_s": start_s,
                "evaluations": self.evaluations}

    def improve(self, assignment: list, max_evaluations: int) -> tuple[list, float]:
        """Local search: moves of one request from the slowest engine to another, then swaps between
        the slowest engine and another, the first that shortens the makespan (each engine's requests
        admitted longest-alone first) taken, until none does or `max_evaluations` engine timings ran."""
        cost = {i: self.alone_s(i) for e in assignment for i in e}

        def norm(e: list) -> list:
            return sorted(e, key=lambda i: (-cost[i], i))

        a = [list(e) for e in assignment]
        span = self.makespan(a)
        normed = [norm(e) for e in a]
        if self.makespan(normed) < span:
            a, span = normed, self.makespan(normed)
        budget = self.evaluations + max_evaluations
        improved = True
        while improved and self.evaluations < budget:
            improved = False
            times = [self.engine_s(e) if e else 0.0 for e in a]
            crit = int(np.argmax(times))
            others = sorted((e for e in range(len(a)) if e != crit), key=lambda e: times[e])
            # an engine takes at least as long as each of its requests alone (the cost function is monotone):
            # a request whose time alone is the makespan or more cannot move anywhere that shortens it
            movable = [i for i in sorted(a[crit], key=lambda i: -cost[i]) if cost[i] < span]
            candidates = [("move", i, None, e) for i in movable for e in others]
            candidates += [("swap", i, j, e) for e in others for i in movable for j in a[e] if cost[j] < cost[i]]
            for kind, i, j, e in candidates:
                if self.evaluations >= budget:
                    break
                src = [x for x in a[crit] if x != i] + ([j] if kind == "swap" else [])
                dst = [x for x in a[e] if x != j] + [i]
                src, dst = norm(src), norm(dst)
                new = max(self.engine_s(src) if src else 0.0, self.engine_s(dst))
                rest = max((times[x] for x in range(len(a)) if x not in (crit, e)), default=0.0)
                if max(new, rest) < span - 1e-12:
                    a[crit], a[e] = src, dst
                    span = max(new, rest)
                    improved = True
                    break
        return a, self.makespan(a)


def placement_ceiling(pricer: PlacementPricer, engines: int, placements: dict,
                      max_evaluations: int = 4000) -> dict:
    """The placement ceiling of one batch: every placement in `placements` ({name: assignment})
    priced on the fixed-steps objective, the lower bound, and the search (started from LPT and from
    each of them); per placement its share of the optimum's speed, between ``share_of_bound`` (bound /
    its makespan, the optimum can be no faster) and ``share_of_search`` (search / its makespan)."""
    spans = {n: pricer.makespan(a) for n, a in placements.items()}
    lb = pricer.lower_bound(engines)
    found = pricer.search(engines, placements, max_evaluations)
    s, b = found["search_s"], lb["lower_bound_s"]
    return {"makespan_s": spans, **lb, "search_s": s, "search_start": found["start"],
            "search_start_s": found["start_s"], "search_assignment": found["assignment"],
            "evaluations": found["evaluations"],
            "share_of_bound": {n: b / v for n, v in spans.items() if v > 0},
            "share_of_search": {n: s / v for n, v in spans.items() if v > 0},
            # where the search sits between the bound (0) and the placement (1)
            "search_between_bound_and": {n: (s - b) / (v - b) if v > b else 0.0 for n, v in spans.items()}}


# ------------------------------------------------------------------------------------ history hindsight

def _grams_ending(grams: set, text: Sequence[int], start: int, end: int, k: int) -> None:
    """Add to `grams` every run of at most k tokens of `text` that ends at a position in [start, end)."""
    for e in range(start, end):
        for j in range(1, min(k, e + 1) + 1):
            grams.add(hash(tuple(text[e - j + 1:e + 1])))


def longest_known(grams, future: Sequence[int], lead: Sequence[int] = ()) -> int:
    """The longest prefix of `future` that the text `grams` indexes has right after `lead` (runs of
    at most len(lead) + len(future) tokens): every prefix of an occurring run occurs, so a binary
    search finds it."""
    lead = tuple(lead)
    lo, hi = 0, len(future)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if hash(lead + tuple(future[:mid])) in grams:
            lo = mid
        else:
            hi = mid - 1
    return lo


MIN_MATCH = 1   # the fewest context tokens any history drafter compared matches before it proposes (module doc)


@dataclass
class HindsightHistory:
    """The history hindsight ceiling as `bench/replay.py` drives a drafter (module doc): `texts`
    {(batch, rollout): prompt + response tokens}, the recorded text; `k` the drafts' length. Its
    `drafter` replays with ``replay(..., drafter=h.drafter)`` on the same batches; the trace's
    proposer time is its own lookups (it prices as no proposer: the ceiling is on tokens per forward).
    `min_match` the context tokens a draft must follow in the text (0: anywhere in it)."""

    texts: dict
    k: int
    min_match: int = MIN_MATCH
    grams: set = field(default_factory=set)
    _seen: dict = field(default_factory=dict)
    rows: int = 0            # decode request-steps
    matched: int = 0         # of them, with at least one draft token accepted
    accepted: int = 0        # draft tokens accepted

    def __post_init__(self):
        from nemo_rl_specdec.bench.replay import ReplayDrafter

        self.drafter = ReplayDrafter(self.propose, self.after_batch, "list")

    def propose(self, batch, sampled: list, requests: dict) -> list:
        rids = list(batch.req_ids)
        ns = [int(x) for x in batch.num_tokens_no_spec[:len(rids)]]
        keys = []
        for rid, n in zip(rids, ns, strict=True):   # every request's verified tokens first: siblings' too
            _, v, j = rid.rsplit("-", 2)
            key = (int(v), int(j))
            keys.append(key)
            _grams_ending(self.grams, self.texts[key], self._seen.get(key, 0), n, self.k + self.min_match)
            self._seen[key] = n
        out = []
        for key, n in zip(keys, ns, strict=True):
            text = self.texts[key]
            future = text[n:min(n + self.k, len(text))]
            m = self.min_match
            a = longest_known(self.grams, future, text[n - m:n]) if n >= m else 0
            self.rows += 1
            self.matched += a > 0
            self.accepted += a
            out.append(list(future[:a]))
        return out

    def after_batch(self, rollouts: list, version: int) -> None:
        for key, n in list(self._seen.items()):   # the batch's whole text is history from now on
            text = self.texts[key]
            _grams_ending(self.grams, text, n, len(text), self.k + self.min_match)
            self._seen[key] = len(text)


def _texts(batches: Sequence[Sequence]) -> dict:
    from nemo_rl_specdec.bench.replay import _field

    return {(v, i): list(_field(r, "prompt_token_ids")) + list(_field(r, "token_ids"))
            for v, rs in enumerate(batches) for i, r in enumerate(rs)}


def history_ceiling(spec, batches: Sequence[Sequence], max_model_len: int, temperature: float = 1.0,
                    k: int | None = None, min_match: int = MIN_MATCH) -> dict:
    """The history hindsight ceiling of `batches` at `k` (default the block's): per batch the replay's
    figures (`bench/replay.py`, every request admitted at once) with the hindsight draft, and over
    all of them tokens per target forward, coverage (the share of decode request-steps whose draft
    had an accepted token) and mean match length (accepted tokens per such step); ``by_batch``: the
    same per batch-size bin of the ceiling's own steps (`bin_shape`)."""
    from nemo_rl_specdec.bench.replay import replay

    k = int(k or spec.num_speculative_tokens)
    spec = spec.model_copy(update={"num_speculative_tokens": k})
    h = HindsightHistory(_texts(batches), k, min_match)
    rows = replay(spec, batches, max_model_len, temperature, drafter=h.drafter, label="history_ceiling")
    gen = sum(r["generated_tokens"] for r in rows)
    fwd = sum(r["target_forwards"] for r in rows)
    return {"k": k, "min_match": min_match, "tokens_per_target_forward": gen / fwd if fwd else 0.0,
            "per_batch": [r["tokens_per_target_forward"] for r in rows],
            "coverage": h.matched / h.rows if h.rows else 0.0,
            "match_length": h.accepted / h.matched if h.matched else 0.0,
            "by_batch": bin_shape([r["trace"] for r in rows])}


def trace_shape(traces: Sequence) -> dict:
    """Coverage and mean match length of a drafter's replay traces (`Trace`s or their dicts), as
    `history_ceiling` counts them."""
    rows = matched = accepted = 0
    for t in traces:
        for s in (t.to_dict() if isinstance(t, Trace) else t)["steps"]:
            rows += len(s["rids"])
            matched += sum(a > 0 for a in s["accepted"])
            accepted += sum(s["accepted"])
    return {"coverage": matched / rows if rows else 0.0, "match_length": accepted / matched if matched else 0.0}


def bin_of(requests: int) -> str:
    """The batch-size bin (`cost/price.py` BINS) of a decode step of `requests` requests, as printed."""
    from nemo_rl_specdec.cost.price import BINS

    lo, hi = next((lo, hi) for lo, hi in BINS if lo <= requests < hi)
    return f"{lo}-{hi - 1}" if hi < 10 ** 9 else f">={lo}"


def bin_shape(traces: Sequence) -> dict:
    """Per batch-size bin (`bin_of`) of the decode steps of replay traces (`Trace`s or their dicts): the
    request-steps, tokens committed per request-step, draft tokens verified per request-step, the share
    of request-steps that verified a draft (``drafted``), coverage as `history_ceiling` counts it (the
    share with at least one draft token accepted), the acceptance rate of the verified draft tokens, and
    for a trace of a drafter with a model (hybrid, model) the share of decode steps that ran the model's
    drafting forwards (``model_steps``: a hybrid's steps that ran its model half's drafts; a model
    drafter's steps that drafted)."""
    acc: dict = {}
    for t in traces:
        d = t.to_dict() if isinstance(t, Trace) else t
        for s in d["steps"]:
            n = len(s["rids"])
            if not n:
                continue
            a = acc.setdefault(bin_of(n), {"steps": 0, "rows": 0, "committed": 0, "drafted_tokens": 0, "drafted": 0,
                                           "matched": 0, "accepted": 0, "model_steps": 0, "counted": False})
            a["steps"] += 1
            a["rows"] += n
            a["committed"] += n + sum(s["accepted"])
            a["drafted_tokens"] += sum(s["drafts"])
            a["drafted"] += sum(x > 0 for x in s["drafts"])
            a["matched"] += sum(x > 0 for x in s["accepted"])
            a["accepted"] += sum(s["accepted"])
            if d["kind"] in FORWARD_KINDS:   # a step that counts none ran as many as its longest draft
                a["counted"] = True
                a["model_steps"] += s.get("model_forwards", 0) > 1 or (
                    not s.get("model_forwards", 0) and d["kind"] == "model" and max(s["drafts"]) > 0)
    return {b: {"steps": a["steps"], "request_steps": a["rows"], "tokens_per_request_step": a["committed"] / a["rows"],
                "draft_tokens_per_request_step": a["drafted_tokens"] / a["rows"], "drafted": a["drafted"] / a["rows"],
                "coverage": a["matched"] / a["rows"],
                "acceptance": a["accepted"] / a["drafted_tokens"] if a["drafted_tokens"] else 0.0,
                "model_steps": a["model_steps"] / a["steps"] if a["counted"] else None}
            for b, a in acc.items()}


def history_share(tokens_per_forward: float, shape: dict, ceiling: dict) -> dict:
    """A history drafter's tokens per forward as a share of the ceiling at the same k, and the workload
    property that limits it most (``limited_by``): coverage (the drafter finds no match where the text
    held one) or match length (its matches are shorter than the text's), whichever of the two falls
    further below the ceiling's."""
    share = tokens_per_forward / ceiling["tokens_per_target_forward"] if ceiling["tokens_per_target_forward"] else 0.0
    cov = shape["coverage"] / ceiling["coverage"] if ceiling["coverage"] else 1.0
    length = shape["match_length"] / ceiling["match_length"] if ceiling["match_length"] else 1.0
    return {"share": share, "coverage_ratio": cov, "match_length_ratio": length,
            "limited_by": "coverage" if cov <= length else "match length"}


def judge_history(results: list, batches: Sequence[Sequence], spec, max_model_len: int,
                  temperature: float = 1.0) -> dict:
    """The history ceiling at each k of the replayed `results` (rows with ``replay_tokens_per_target_forward``
    and ``replay_per_step``, as `bench/das.py` summarizes them); each such row gets
    ``history_ceiling``: ``ceiling`` (the ceiling at its k), its own coverage and match length
    (`trace_shape`) and its share (`history_share`). Returns {k: ceiling}."""
    rows = [r for r in results if r.get("replay_tokens_per_target_forward") is not None]
    ceilings = {k: history_ceiling(spec, batches, max_model_len, temperature, k)
                for k in sorted({int(r["k"]) for r in rows})}
    for r in rows:
        c = ceilings[int(r["k"])]
        shape = trace_shape([x["trace"] for x in r["replay_per_step"]])
        r["history_ceiling"] = {"ceiling": c, **shape, **history_share(r["replay_tokens_per_target_forward"], shape, c)}
    return ceilings


def history_lines(results: list, ours: str) -> list[str]:
    """The ceiling rows a suite prints: per k the ceiling, and every replayed row's share of it; for
    `ours`, the property that limits its share most."""
    rows = [r for r in results if r.get("history_ceiling")]
    out = []
    for k in sorted({r["k"] for r in rows}):
        c = next(r["history_ceiling"]["ceiling"] for r in rows if r["k"] == k)
        out.append(f"history hindsight ceiling at k={k} (the longest run of the next tokens that the text a store "
                   f"could hold by then has after the context's last {c['min_match']} token(s)): "
                   f"{c['tokens_per_target_forward']:.3f} tok/fwd, coverage "
                   f"{100 * c['coverage']:.1f}% of request-steps, match length {c['match_length']:.2f} tokens")
        for r in (r for r in rows if r["k"] == k):
            h = r["history_ceiling"]
            line = (f"  {r['name']}: {r['replay_tokens_per_target_forward']:.3f} tok/fwd = {100 * h['share']:.1f}% of "
                    f"the ceiling (coverage {100 * h['coverage_ratio']:.0f}%, match length "
                    f"{100 * h['match_length_ratio']:.0f}% of the ceiling's)")
            if r["name"] == ours:
                line += f"; its share is limited most by {h['limited_by']}"
            out.append(line)
    return out


# ------------------------------------------------------------------------------------------- hybrid

def fewest_forwards(reach: Sequence[int]) -> int:
    """The fewest steps from position 0 to len(reach), where a step from position p may end anywhere
    in (p, p + 1 + reach[p]] (a shortest path: dynamic programming from the end)."""
    n = len(reach)
    best = [0] * (n + 1)
    for p in range(n - 1, -1, -1):
        hi = min(n, p + 1 + max(0, int(reach[p])))
        best[p] = 1 + min(best[p + 1:hi + 1])
    return best[0]


def hybrid_bound(batches: Sequence[Sequence], k: int, model_accepted: Callable[[int, int, int], int]) -> dict:
    """The hybrid's per-request hindsight bound (module doc) on tokens per target forward, the
    prefills counted as `replay` counts them: `model_accepted(batch, rollout, n)` is the model half's
    accepted draft tokens at a step whose request holds n verified tokens (prompt included)."""
    from collections import Counter

    texts = _texts(batches)
    history: set = set()
    gen = fwd = 0
    for v, rs in enumerate(batches):
        own: list = []
        for i in range(len(rs)):   # each request's whole text: its siblings may hold it by any time
            g: set = set()
            _grams_ending(g, texts[(v, i)], 0, len(texts[(v, i)]), k)
            own.append(g)
        held = Counter(x for g in own for x in g)   # how many of the batch's requests hold each run
        for i, r in enumerate(rs):
            t = texts[(v, i)]
            plen = len(t) - len(_response(r))
            prefix: set = set()
            _grams_ending(prefix, t, 0, plen + 1, k)   # the prefill samples the first response token
            known = _Known(history, held, own[i], prefix)
            reach = []
            for n in range(plen + 1, len(t)):
                future = t[n:min(n + k, len(t))]
                reach.append(max(longest_known(known, future), min(int(model_accepted(v, i, n)), len(future))))
                _grams_ending(prefix, t, n, n + 1, k)   # the token this step verifies at least
            fwd += 1 + (fewest_forwards(reach) if reach else 0)
            gen += len(t) - plen
        history.update(held)
    return {"k": k, "tokens_per_target_forward": gen / fwd if fwd else 0.0}


def _response(r) -> list:
    from nemo_rl_specdec.bench.replay import _field

    return list(_field(r, "token_ids"))


class _Known:
    """The runs a request's store could hold (`hybrid_bound`): the earlier batches', any other request
    of its batch's (whole), and its own text so far."""

    def __init__(self, history: set, held: dict, own: set, prefix: set):
        self.history, self.held, self.own, self.prefix = history, held, own, prefix

    def __contains__(self, x) -> bool:
        return x in self.history or x in self.prefix or self.held.get(x, 0) - (x in self.own) > 0


__all__ = ["MIN_MATCH", "HindsightHistory", "PlacementPricer", "RequestSteps", "bin_of", "bin_shape",
           "fewest_forwards",
           "history_ceiling", "history_lines", "history_share", "hybrid_bound", "judge_history", "longest_known",
           "placement_ceiling", "request_steps", "trace_shape"]
