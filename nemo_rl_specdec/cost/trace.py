"""What an engine did, step by step: the record a rollout is priced from (`cost/price.py`).

One `TraceStep` per target forward: the decode requests in it (their ids, their contexts before
the step, the draft tokens each verified and how many of them the target accepted), the prompt
tokens prefilled in it (and the requests whose prefill ended there, each sampling its first
token), and the CPU time (thread time) the proposer spent drafting for it. A `Trace` is the
steps of one rollout with the drafter that made them:

- ``kind``: ``none`` (no speculation), ``list`` (history drafters: DAS, vLLM suffix, n-gram; drafts
  looked up on the host, so every step must carry its proposer time), ``model`` (k sequential draft
  forwards: eagle3, mtp, draft_model; a step may say the forwards it ran, ``model_forwards``, where
  a rule skipped some of them: 0, as many as its longest draft), ``block`` (one forward over all
  draft positions: dflash) or ``hybrid`` (a history drafter on every step and a model drafter's
  forwards: each step says how many ran, ``model_forwards``, and the trace names the two profile
  entries that price them, ``parts: {history: ..., model: ...}``);
- ``source``: ``replay`` (`bench/replay.py`: a drafter proposing on recorded rollouts, every running
  request once per target forward) or ``engine`` (a live engine's steps).

A replay trace determines its no-speculation twin (`without_drafts`): the same requests from the
same contexts, one token per forward. JSON on disk (`save`, `load`); a trace of another format
version, or a field of the wrong shape, is refused naming the field. Version 2 added the hybrid
kind (``parts``, ``model_forwards``); version 1 files read as before.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from nemo_rl_specdec.config.schema import short

FORMAT = "nemo-rl-specdec/trace"
VERSION = 2
READS = (1, 2)  # trace versions this package reads
HYBRID = "hybrid"  # the kind of a trace of a drafter made of parts (not a drafter's name: compared as this constant)
FORWARD_KINDS = (HYBRID, "model")   # the kinds whose steps may count the draft forwards they ran
KINDS = ("none", "list", "model", "block", HYBRID)
PARTS = ("history", "model")
SOURCES = ("replay", "engine")


class TraceError(ValueError):
    """A malformed trace; the message names the field (``steps[i].drafts``) and what is allowed."""


@dataclass
class TraceStep:
    rids: list = field(default_factory=list)      # decode requests in the step (ids: ints or strings)
    ctx: list = field(default_factory=list)       # their tokens in the KV cache before the step
    drafts: list = field(default_factory=list)    # draft tokens each verified
    accepted: list = field(default_factory=list)  # of those, accepted (so 1 + accepted tokens committed)
    prefill_tokens: int = 0                       # prompt tokens prefilled in the same forward
    proposer_s: float | None = None            # proposer thread time spent on this step's drafts
    prefill_requests: int = 0                     # requests whose prefill ended here (each samples a token)
    model_forwards: int = 0                       # hybrid, model: the (model part's) draft forwards run in this step

    @property
    def committed(self) -> int:
        return len(self.rids) + sum(self.accepted) + self.prefill_requests


@dataclass
class Trace:
    kind: str
    k: int
    steps: list
    drafter: str | None = None
    source: str = "replay"
    meta: dict = field(default_factory=dict)
    parts: dict | None = None   # hybrid: {"history": profile entry, "model": profile entry}

    def __post_init__(self):
        self.check()

    # ---------------------------------------------------------------- figures
    @property
    def generated_tokens(self) -> int:
        return sum(s.committed for s in self.steps)

    @property
    def target_forwards(self) -> int:
        return len(self.steps)

    @property
    def proposer_s(self) -> float | None:
        times = [s.proposer_s for s in self.steps if s.proposer_s is not None]
        return sum(times) if times else None

    def tokens_per_forward(self) -> float:
        """Generated tokens per request per target forward, a request's prefill counted as one (as
        `metrics.py` counts them)."""
        rows = sum(len(s.rids) + s.prefill_requests for s in self.steps)
        return self.generated_tokens / rows if rows else 0.0

    def without_drafts(self) -> Trace:
        """The same requests rolled out without speculation (replay traces): each request enters at the
        step it first decoded in, from the context it had then, and commits one token per forward
        until it has committed what it did here; the prefill steps stay as they are."""
        if self.source != "replay":
            raise TraceError(f"source: {self.source!r}; only a replay trace determines its run without drafts "
                             "(an engine's is the no-spec engine's own trace)")
        first: dict = {}   # rid -> (step index, context then)
        total: dict = {}
        prefill_at = {}
        for i, s in enumerate(self.steps):
            if s.prefill_tokens or s.prefill_requests:
                prefill_at[i] = (s.prefill_tokens, s.prefill_requests)
            for rid, c, a in zip(s.rids, s.ctx, s.accepted, strict=True):
                first.setdefault(rid, (i, c))
                total[rid] = total.get(rid, 0) + 1 + a
        steps: list = []
        live: dict = {}   # rid -> [context, tokens left]
        j = 0
        entering = sorted(first.items(), key=lambda kv: kv[1][0])
        i = 0
        while i < len(self.steps) or live or j < len(entering):
            while j < len(entering) and entering[j][1][0] <= i:
                rid, (_, c) = entering[j]
                live[rid] = [c, total[rid]]
                j += 1
            rids = list(live)
            pt, pr = prefill_at.get(i, (0, 0))
            steps.append(TraceStep(rids, [live[r][0] for r in rids], [0] * len(rids), [0] * len(rids), pt, None, pr))
            for r in rids:
                live[r][0] += 1
                live[r][1] -= 1
                if live[r][1] == 0:
                    del live[r]
            i += 1
        return Trace("none", 0, steps, None, "replay", {**self.meta, "without_drafts_of": self.drafter})

    # ---------------------------------------------------------------- validation
    def check(self) -> None:
        if self.kind not in KINDS:
            raise TraceError(f"kind: {self.kind!r}; allowed: {list(KINDS)}")
        if self.source not in SOURCES:
            raise TraceError(f"source: {self.source!r}; allowed: {list(SOURCES)}")
        bad_k = isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 0
        if bad_k or (self.kind == "none") != (self.k == 0):
            raise TraceError(f"k: {self.k!r}; allowed: 0 with kind 'none', else an integer >= 1")
        if not isinstance(self.steps, list):
            raise TraceError(f"steps: {type(self.steps).__name__}; allowed: a list of steps")
        hybrid = self.kind == HYBRID
        if hybrid != (self.parts is not None) or hybrid and (
                not isinstance(self.parts, dict) or sorted(self.parts) != sorted(PARTS)
                or not all(isinstance(v, str) and v for v in self.parts.values())):
            raise TraceError(f"parts: {short(self.parts, 60)!r}; allowed: with kind 'hybrid' (only), a mapping of "
                             f"{list(PARTS)} to the hardware profile's entries that price them")
        for i, s in enumerate(self.steps):
            where = f"steps[{i}]"
            n = len(s.rids)
            for name in ("ctx", "drafts", "accepted"):
                v = getattr(s, name)
                if not isinstance(v, list) or len(v) != n:
                    raise TraceError(f"{where}.{name}: {short(v, 60)!r}; allowed: one integer per request in rids "
                                     f"({n})")
                if any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in v):
                    raise TraceError(f"{where}.{name}: {short(v, 60)!r}; allowed: integers >= 0")
            if any(isinstance(r, bool) or not isinstance(r, (int, str)) for r in s.rids):
                raise TraceError(f"{where}.rids: {short(s.rids, 60)!r}; allowed: request ids (integers or strings)")
            if len(set(s.rids)) != n:
                raise TraceError(f"{where}.rids: a request appears twice in one step")
            bad = [j for j in range(n) if s.accepted[j] > s.drafts[j] or s.drafts[j] > self.k]
            if bad:
                j = bad[0]
                raise TraceError(f"{where}: request {s.rids[j]!r} verified {s.drafts[j]} drafts and accepted "
                                 f"{s.accepted[j]}; allowed: accepted <= drafts <= k ({self.k})")
            for name in ("prefill_tokens", "prefill_requests"):
                v = getattr(s, name)
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise TraceError(f"{where}.{name}: {v!r}; allowed: an integer >= 0")
            if not n and not s.prefill_tokens:
                raise TraceError(f"{where}: neither a decode request nor a prefill token (an empty step)")
            if s.proposer_s is not None and not (isinstance(s.proposer_s, (int, float)) and 0 <= s.proposer_s < 1e4):
                raise TraceError(f"{where}.proposer_s: {s.proposer_s!r}; allowed: seconds >= 0, or null")
            if self.kind in ("list", HYBRID) and n and s.proposer_s is None:
                raise TraceError(f"{where}.proposer_s: missing; a history drafter's trace ({self.drafter}) needs the "
                                 "proposer's CPU time of every decode step (it is on the step's critical path)")
            f = s.model_forwards
            counted = self.kind in FORWARD_KINDS
            if isinstance(f, bool) or not isinstance(f, int) or not 0 <= f <= (self.k if counted else 0):
                raise TraceError(f"{where}.model_forwards: {f!r}; allowed: " + (
                    f"an integer from 0 to k ({self.k})" if counted else
                    f"0 (only a trace of kind {' or '.join(FORWARD_KINDS)} counts them per step)"))

    # ---------------------------------------------------------------- files
    def to_dict(self) -> dict:
        hybrid = self.kind == HYBRID
        return {"format": FORMAT, "version": VERSION, "drafter": self.drafter, "kind": self.kind, "k": self.k,
                "source": self.source, "meta": self.meta, **({"parts": self.parts} if hybrid else {}),
                "steps": [{"rids": s.rids, "ctx": s.ctx, "drafts": s.drafts, "accepted": s.accepted,
                           "prefill_tokens": s.prefill_tokens, "prefill_requests": s.prefill_requests,
                           "proposer_s": s.proposer_s,
                           **({"model_forwards": s.model_forwards} if self.kind in FORWARD_KINDS else {})}
                          for s in self.steps]}

    @classmethod
    def from_dict(cls, d: Any) -> Trace:
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            got = d.get("format") if isinstance(d, dict) else d
            raise TraceError(f"format: {short(got, 60)!r}; allowed: {FORMAT!r} "
                             "(a file written by a bench or `Trace.save`)")
        if d.get("version") not in READS:
            raise TraceError(f"version: {d.get('version')!r}; this package reads trace versions {list(READS)} "
                             "(re-record the trace with this version's bench)")
        top = {"format", "version", "drafter", "kind", "k", "source", "meta", "steps"} | (
            {"parts"} if d["version"] >= 2 else set())
        unknown = sorted(set(d) - top)
        if unknown:
            raise TraceError(f"{unknown[0]}: not a trace field of version {d['version']}; allowed: "
                             f"{', '.join(sorted(top - {'format', 'version'}))}")
        raw = d.get("steps")
        if not isinstance(raw, list):
            raise TraceError(f"steps: {short(raw, 60)!r}; allowed: a list of steps")
        keys = {"rids", "ctx", "drafts", "accepted", "prefill_tokens", "prefill_requests", "proposer_s"} | (
            {"model_forwards"} if d["version"] >= 2 else set())
        steps = []
        for i, s in enumerate(raw):
            if not isinstance(s, dict) or set(s) - keys:
                extra = sorted(set(s) - keys) if isinstance(s, dict) else s
                raise TraceError(f"steps[{i}]: {short(extra, 60)!r}; allowed keys: {sorted(keys)}")
            rids = s.get("rids", [])
            if not isinstance(rids, list):
                raise TraceError(f"steps[{i}].rids: {short(rids, 60)!r}; allowed: a list of request ids")
            steps.append(TraceStep(list(rids), s.get("ctx", []), s.get("drafts", []), s.get("accepted", []),
                                   s.get("prefill_tokens", 0), s.get("proposer_s"), s.get("prefill_requests", 0),
                                   s.get("model_forwards", 0)))
        meta = d.get("meta") or {}
        if not isinstance(meta, dict):
            raise TraceError(f"meta: {short(meta, 60)!r}; allowed: a mapping")
        return cls(cast(str, d.get("kind")), cast(int, d.get("k")), steps, d.get("drafter"), d.get("source", "replay"),
                   meta, d.get("parts"))

    def save(self, path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), separators=(",", ":")), encoding="utf-8")
        return p

    @classmethod
    def load(cls, path) -> Trace:
        d = read_json(path)
        try:
            return cls.from_dict(d)
        except TraceError as e:
            raise TraceError(f"{path}: {e}") from None


def read_json(path) -> Any:
    """A JSON file's content, or a TraceError naming the file and what is wrong with it."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise TraceError(f"{path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None


__all__ = ["FORMAT", "KINDS", "PARTS", "READS", "SOURCES", "VERSION", "Trace", "TraceError", "TraceStep", "read_json"]
