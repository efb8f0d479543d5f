"""What a generation request and its rollout are, everywhere in the package: the request an
engine serves, the rollout it returns, the record every drafter refresh consumes, the problem
identity, and the columnar batch that carries a step's rollouts between processes.

- `Request`: one prompt to roll out (problem id, draft budget, predicted length, seed).
- `Rollout`: what an engine returns for a request (tokens, target logprobs, finish reason, and
  the policy/drafter versions each stretch of tokens was generated with).
- `problem_id(prompt_tokens)`: a request's problem identity, a hash of its prompt tokens. All
  samples of one GRPO prompt share it, and so does the same prompt in a later epoch.
- `RolloutRecord`: one finished rollout (problem id, prompt tokens, response tokens, the policy
  version that sampled it). `RolloutStore.rebuild` and the online distillers read it; `as_record`
  makes one from a `Rollout` or from a dict with the same keys (the wire and test form).
- `token_sequences(rollouts, vocab_size)`: the (prompt, response[, logprobs]) token lists a
  trainer reads from rollouts, checked against the vocabulary (GRPO and the distillers).
- `RolloutBatch`: many records as four flat numpy arrays plus the problem ids. It pickles as a
  few contiguous buffers, so Ray's object store hands it to every engine without per-token
  Python objects, and `records()` yields views, not copies.

No NeMo-RL, no vLLM, no Ray import.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import numpy as np


class RolloutError(ValueError):
    """A rollout (or a batch of them) is malformed; the message names the field and the index."""


def _numpy(x: Any) -> Any:
    """A torch tensor as a numpy array (anything else unchanged)."""
    return x.detach().cpu().numpy() if hasattr(x, "detach") else x


def _int_tokens(tokens: Any, what: str) -> np.ndarray:
    if isinstance(tokens, np.ndarray):
        arr = tokens
    else:
        if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Iterable):
            raise RolloutError(f"{what}: expected a sequence of token ids, got {type(tokens).__name__}")
        arr = np.asarray(_numpy(tokens))
    if arr.ndim != 1:
        raise RolloutError(f"{what}: expected a 1-D token sequence, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise RolloutError(f"{what}: token ids must be ints, got dtype {arr.dtype}")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > 0x7FFFFFFF):
        raise RolloutError(f"{what}: token ids must be in [0, 2^31), got range [{arr.min()}, {arr.max()}]")
    return np.ascontiguousarray(arr, dtype=np.int32)


def problem_id(prompt_tokens: Any) -> str:
    """Stable id of a prompt: 16 hex chars of blake2b over its tokens as int64."""
    arr = np.asarray(_numpy(prompt_tokens), dtype=np.int64).reshape(-1)
    return hashlib.blake2b(arr.tobytes(), digest_size=8).hexdigest()


@dataclass
class Request:
    """One prompt to roll out (one sample)."""

    prompt_token_ids: list
    problem_id: str | None = None
    budget: int | None = None  # max draft tokens for this request (list drafters); None = k
    seed: int | None = None
    predicted_len: float | None = None  # predicted output tokens; a list drafter lifts the budget past it
    max_new_tokens: int | None = None  # this request's cap on new tokens; None = the call's (or the run file's)


@dataclass
class Rollout:
    """What an engine returns for one `Request` (in the request's position `index`)."""

    index: int
    problem_id: str | None
    prompt_token_ids: list
    token_ids: list
    logprobs: list
    finish_reason: str | None
    policy_version: int
    drafter_version: int
    drafter_built_from: int
    # (first token index, policy_version, drafter_version) for each stretch of tokens generated
    # under one (policy, drafter) pair; more than one entry only after in-flight updates
    segments: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RolloutRecord:
    """One finished rollout, as every drafter refresh reads it."""

    problem_id: str | None
    prompt_token_ids: np.ndarray  # int32; may be only the prompt's tail (see RolloutBatch.pack)
    token_ids: np.ndarray  # int32, the response
    policy_version: int

    def to_dict(self) -> dict:
        return {"problem_id": self.problem_id, "prompt_token_ids": self.prompt_token_ids,
                "token_ids": self.token_ids, "policy_version": self.policy_version}


_FIELDS = ("problem_id", "prompt_token_ids", "token_ids", "policy_version")


def as_record(r: Any, i: int = 0) -> RolloutRecord:
    """A RolloutRecord from a record, an engine `Rollout`, or a dict with the record's keys."""
    if isinstance(r, RolloutRecord):
        return r
    if isinstance(r, Rollout):
        r = {k: getattr(r, k) for k in _FIELDS}
    if not isinstance(r, dict):
        raise RolloutError(f"rollouts[{i}]: expected a dict with {list(_FIELDS)}, a RolloutRecord or a Rollout; "
                           f"got {type(r).__name__}")
    missing = [k for k in ("token_ids", "policy_version") if k not in r]
    if missing:
        raise RolloutError(f"rollouts[{i}]: missing key(s) {missing}; has {sorted(r)} "
                           f"(a rollout needs {list(_FIELDS)})")
    pid = r.get("problem_id")
    if pid is not None and not isinstance(pid, str):
        raise RolloutError(f"rollouts[{i}].problem_id: expected a str or None, got {type(pid).__name__}")
    v = r["policy_version"]
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
        raise RolloutError(f"rollouts[{i}].policy_version: expected an int policy version >= 0, got {v!r}")
    prompt = r.get("prompt_token_ids")
    return RolloutRecord(pid, _int_tokens(() if prompt is None else prompt, f"rollouts[{i}].prompt_token_ids"),
                         _int_tokens(r["token_ids"], f"rollouts[{i}].token_ids"), int(v))


class TokenSequence(NamedTuple):
    """One rollout as a trainer reads it: plain int lists, and the sampler's logprob per response
    token where they were asked for and line up with the response (else None)."""

    prompt: list
    response: list
    logprobs: list | None = None


def _sequence_fields(r: Any, i: int, error: type) -> tuple:
    """(prompt_token_ids, token_ids, logprobs) of a record, a `Rollout` or a dict (None where absent)."""
    if isinstance(r, dict):
        return r.get("prompt_token_ids"), r.get("token_ids"), r.get("logprobs")
    if isinstance(r, (Rollout, RolloutRecord)):
        return r.prompt_token_ids, r.token_ids, getattr(r, "logprobs", None)
    raise error(f"rollouts[{i}]: expected a dict, a RolloutRecord or a Rollout; got {type(r).__name__}")


def token_sequences(rollouts: Sequence[Any], vocab_size: int, *, logprobs: bool = False,
                    error: type = RolloutError) -> list[TokenSequence]:
    """`TokenSequence` per rollout (records, engine rollouts or dicts with `prompt_token_ids`,
    `token_ids` and, for `logprobs=True`, `logprobs`). Raises `error` naming the rollout's index
    when it is none of those, a field is missing, the prompt is empty (the first response token needs a context) or a
    token id is outside [0, vocab_size). Logprobs not aligned with the response are dropped (None)."""
    out = []
    for i, r in enumerate(rollouts):
        prompt, resp, lps = _sequence_fields(r, i, error)
        if prompt is None or resp is None:
            raise error(f"rollouts[{i}]: needs prompt_token_ids and token_ids")
        prompt, resp = [int(t) for t in prompt], [int(t) for t in resp]
        if not prompt:
            raise error(f"rollouts[{i}]: empty prompt (the first response token needs a context)")
        bad = [t for t in prompt + resp if t < 0 or t >= vocab_size]
        if bad:
            raise error(f"rollouts[{i}]: token id {bad[0]} outside the vocabulary [0, {vocab_size})")
        lps = lps if logprobs else None
        if lps is not None and len(lps) != len(resp):
            lps = None
        out.append(TokenSequence(prompt, resp, None if lps is None else [float(x) for x in lps]))
    return out


class RolloutBatch:
    """Rollouts in columnar form: `tokens` holds, per rollout, its prompt part then its response.

    Arrays (all numpy): `tokens` int32 [sum of lengths]; `starts` int64 [n+1] offsets into
    `tokens`; `prompt_lens` int32 [n] (the prompt part of each span); `versions` int64 [n].
    `problem_ids`: a list of str or None, one per rollout.
    """

    __slots__ = ("tokens", "starts", "prompt_lens", "versions", "problem_ids")

    def __init__(self, tokens: np.ndarray, starts: np.ndarray, prompt_lens: np.ndarray,
                 versions: np.ndarray, problem_ids: Sequence[str | None]):
        self.tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        self.starts = np.ascontiguousarray(starts, dtype=np.int64)
        self.prompt_lens = np.ascontiguousarray(prompt_lens, dtype=np.int32)
        self.versions = np.ascontiguousarray(versions, dtype=np.int64)
        self.problem_ids = list(problem_ids)
        n = len(self.problem_ids)
        if not (len(self.starts) == n + 1 and len(self.prompt_lens) == n and len(self.versions) == n):
            raise RolloutError(f"RolloutBatch: inconsistent sizes (starts={len(self.starts)}, "
                               f"prompt_lens={len(self.prompt_lens)}, versions={len(self.versions)}, ids={n})")
        if n and (self.starts[0] != 0 or self.starts[-1] != len(self.tokens)
                  or np.any(np.diff(self.starts) < self.prompt_lens)):
            raise RolloutError("RolloutBatch: offsets do not cover `tokens` or a prompt is longer than its span")

    # -- building
    @classmethod
    def empty(cls) -> RolloutBatch:
        return cls(np.zeros(0, np.int32), np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int64), [])

    @classmethod
    def pack(cls, rollouts: Iterable[Any], prompt_tail: int | None = None) -> RolloutBatch:
        """Pack records (or dicts). `prompt_tail` keeps only the last N prompt tokens of each:
        the suffix store never reads further back than its tree depth."""
        recs = [as_record(r, i) for i, r in enumerate(rollouts)]
        parts, starts, plens = [], [0], []
        for r in recs:
            p = r.prompt_token_ids
            if prompt_tail is not None:
                p = p[len(p) - min(len(p), int(prompt_tail)):]
            parts += [p, r.token_ids]
            plens.append(len(p))
            starts.append(starts[-1] + len(p) + len(r.token_ids))
        tokens = np.concatenate(parts) if parts else np.zeros(0, np.int32)
        return cls(tokens, np.asarray(starts), np.asarray(plens), np.asarray([r.policy_version for r in recs]),
                   [r.problem_id for r in recs])

    @classmethod
    def from_generation(cls, input_ids: Any, input_lengths: Any, output_ids: Any, generation_lengths: Any,
                        policy_version: int, prompt_tail: int | None = None) -> RolloutBatch:
        """From a generation batch: row i of `output_ids` is the unpadded prompt
        (`input_lengths[i]` tokens) followed by `generation_lengths[i]` generated tokens, then
        padding, as NeMo-RL's vLLM workers return it. Problem ids hash the unpadded prompts."""
        ids, lens = _np2(input_ids, "input_ids"), _np1(input_lengths, "input_lengths")
        out, gens = _np2(output_ids, "output_ids"), _np1(generation_lengths, "generation_lengths")
        if not (len(ids) == len(lens) == len(out) == len(gens)):
            raise RolloutError(f"batch sizes differ: input_ids={len(ids)} input_lengths={len(lens)} "
                               f"output_ids={len(out)} generation_lengths={len(gens)}")
        width = ids.shape[1]
        recs = []
        for i in range(len(ids)):
            n, g = int(lens[i]), int(gens[i])
            if n > width or n + g > out.shape[1]:
                raise RolloutError(f"row {i}: input_length {n} + generation_length {g} exceed the padded "
                                   f"widths (input_ids {width}, output_ids {out.shape[1]})")
            prompt = ids[i, :n]
            recs.append(RolloutRecord(problem_id(prompt), _int_tokens(prompt, f"input_ids[{i}]"),
                                      _int_tokens(out[i, n:n + g], f"output_ids[{i}]"), int(policy_version)))
        return cls.pack(recs, prompt_tail)

    @classmethod
    def concat(cls, batches: Sequence[RolloutBatch]) -> RolloutBatch:
        batches = [b for b in batches if b is not None and len(b)]
        if not batches:
            return cls.empty()
        if len(batches) == 1:
            return batches[0]
        offs = np.cumsum([0] + [len(b.tokens) for b in batches[:-1]])
        starts = np.concatenate([[0]] + [b.starts[1:] + o for b, o in zip(batches, offs, strict=True)])
        return cls(np.concatenate([b.tokens for b in batches]), starts,
                   np.concatenate([b.prompt_lens for b in batches]), np.concatenate([b.versions for b in batches]),
                   [p for b in batches for p in b.problem_ids])

    # -- reading
    def __len__(self) -> int:
        return len(self.problem_ids)

    @property
    def num_tokens(self) -> int:
        return int(len(self.tokens))

    @property
    def nbytes(self) -> int:
        return int(self.tokens.nbytes + self.starts.nbytes + self.prompt_lens.nbytes + self.versions.nbytes)

    def records(self) -> Iterator[RolloutRecord]:
        """Each rollout as a record whose arrays are views into `tokens` (no copy)."""
        t, s, pl, v, pids = self.tokens, self.starts, self.prompt_lens, self.versions, self.problem_ids
        for i in range(len(pids)):
            a, m = int(s[i]), int(s[i]) + int(pl[i])
            yield RolloutRecord(pids[i], t[a:m], t[m:int(s[i + 1])], int(v[i]))

    def __iter__(self) -> Iterator[RolloutRecord]:
        return self.records()

    def __reduce__(self):
        return (RolloutBatch, (self.tokens, self.starts, self.prompt_lens, self.versions, self.problem_ids))


def _np2(x: Any, what: str) -> np.ndarray:
    a = np.asarray(_numpy(x))
    if a.ndim != 2:
        raise RolloutError(f"{what}: expected a 2-D [batch, tokens] array, got shape {a.shape}")
    return a


def _np1(x: Any, what: str) -> np.ndarray:
    return np.asarray(_numpy(x)).reshape(-1)
