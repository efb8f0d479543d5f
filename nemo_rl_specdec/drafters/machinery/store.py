"""The DAS rollout store: recent rollouts in arctic-inference suffix trees, per problem and global,
windowed by the policy version that produced them.

Layout. Every rollout becomes one *entry* (an int32 sequence id) holding the last
``max_tree_depth - 1`` prompt tokens followed by the response tokens. The prompt tail is
what lets a new request of the same problem match from its first generated token (its
context ends with that same prompt); older prompt tokens can never take part in a match
that drafts a response token, because a match plus its draft is at most ``max_tree_depth``
tokens, so they are not stored.

Trees (``scope``):

- ``problem``: one tree per problem id; rollouts without a problem id go to the global tree,
  which then only serves requests without a problem id (problem isolation);
- ``global``: one tree with every rollout;
- ``both``: both of the above; a request with a problem id queries its problem tree and the
  global tree and keeps the draft with more expected accepted tokens (calibrated on measured
  acceptance when the proposer passes its calibration, see :meth:`RolloutStore.speculate`).

Versions and eviction. Entries carry the policy version that generated them. The window
keeps the ``window_steps`` most recent versions: after :meth:`slide` to ``newest``, every
entry with ``version <= newest - window_steps`` has been removed from every tree it was in
(``SuffixTree.remove(seq_id)``: exact, the tree is the same as if the sequence had never
been added). The memory cap (bytes, as estimated by ``SuffixTree.estimate_memory``) is
enforced by removing entries oldest version first (and, within a version, oldest first).

In-flight entries. While a problem has no stored rollouts (cold start), its running requests
(GRPO siblings) share their verified tokens through the store's trees as they generate
(:meth:`start_live` / :meth:`extend_live`, tagged with the current policy version). The next
:meth:`rebuild` settles them: an in-flight entry identical to one of the update's rollouts is
kept as that rollout (no re-insertion), every other one is removed, so after a rebuild the
store holds exactly the window's rollouts.

Costs (arctic-inference's CPU time per token): removing a sequence costs about as much as
inserting it, so evicting a version costs about as much as adding one, and rebuilding a tree
from scratch is never cheaper than removing the evicted sequences unless most of the tree goes.
What insertion, freeing trees and a token's memory cost on a refresh is measured in
docs/measurements/refresh.md.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from types import EllipsisType
from typing import TYPE_CHECKING, Any

import numpy as np

from nemo_rl_specdec.rollouts import RolloutBatch, RolloutError, as_record

if TYPE_CHECKING:
    from nemo_rl_specdec.drafters.machinery.calibration import AcceptanceCalibration

SCOPES = ("problem", "global", "both")
_MAX_SEQ_ID = 0x7FFFFFFF  # arctic's sequence ids are int32
_GLOBAL = ("global tree",)  # key of the global tree in the per-tree byte cache (problem ids are str)
_FILL = 0.9  # newest-first admission: each chunk aims at this share of the predicted headroom


class StoreInputError(ValueError):
    """A rollout handed to the store is malformed (message says which one and why)."""


@dataclass
class Entry:
    seq_id: int
    problem_id: str | None
    version: int
    num_tokens: int
    in_problem_tree: bool
    in_global_tree: bool
    live: list | None = None  # in-flight entry: its token chunks, until the next rebuild settles it
    tokens: np.ndarray | None = None  # a settled entry's sequence (int32): what `export` saves


@dataclass
class StoreDraft:
    token_ids: list
    probs: list
    score: float  # what drafts were ranked by: arctic's score, or calibrated expected accepted tokens
    match_len: int
    source: str  # "problem" | "global" | "" (no draft)
    other: StoreDraft | None = None  # with a calibration: the other tree's draft, when it lost


_EMPTY = StoreDraft([], [], 0.0, 0, "")


def as_token_array(tokens: object, what: str) -> np.ndarray:
    """Validate a token sequence and return it as a contiguous int32 array."""
    if isinstance(tokens, np.ndarray):
        arr = tokens
    else:
        if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Iterable):
            raise StoreInputError(f"{what}: expected a sequence of token ids, got {type(tokens).__name__}")
        tokens = list(tokens)
        if any(isinstance(t, bool) or not isinstance(t, (int, np.integer)) for t in tokens):
            bad = next(t for t in tokens if isinstance(t, bool) or not isinstance(t, (int, np.integer)))
            raise StoreInputError(f"{what}: token ids must be ints, got {bad!r} ({type(bad).__name__})")
        arr = np.asarray(tokens, dtype=np.int64)
    if arr.ndim != 1:
        raise StoreInputError(f"{what}: expected a 1-D token sequence, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise StoreInputError(f"{what}: token ids must be integers, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() > 0x7FFFFFFF):
        raise StoreInputError(f"{what}: token ids must be in [0, 2^31), got range [{arr.min()}, {arr.max()}]")
    return np.ascontiguousarray(arr, dtype=np.int32)


class RolloutStore:
    """Per-problem and global suffix trees over a sliding window of policy versions."""

    def __init__(self, *, window_steps: int = 4, scope: str = "both", max_tree_depth: int = 64,
                 max_memory_bytes: float | None = 512 * 2**20):
        from arctic_inference.suffix_decoding._C import SuffixTree  # C++ tree (nanobind)

        if scope not in SCOPES:
            raise ValueError(f"scope: got {scope!r}; allowed: {list(SCOPES)}")
        if int(window_steps) < 1:
            raise ValueError(f"window_steps: got {window_steps!r}; allowed: an int >= 1")
        if int(max_tree_depth) < 1:
            raise ValueError(f"max_tree_depth: got {max_tree_depth!r}; allowed: an int >= 1")
        if max_memory_bytes is not None and max_memory_bytes <= 0:
            raise ValueError(f"max_memory_bytes: got {max_memory_bytes!r}; allowed: > 0 or None")
        self._Tree = SuffixTree
        self.window_steps = int(window_steps)
        self.scope = scope
        self.max_tree_depth = int(max_tree_depth)
        self.max_memory_bytes = None if max_memory_bytes is None else int(max_memory_bytes)
        self.prompt_tail = self.max_tree_depth - 1
        self._problem_trees: dict = {}
        self._global_tree: Any = None
        self._entries: OrderedDict[int, Entry] = OrderedDict()  # insertion order
        self._problem_entries: dict = {}  # problem id -> entries in its problem tree
        self._global_entries = 0
        self._next_seq_id = 0
        self.newest_version: int | None = None
        self.evicted_window = 0
        self.evicted_memory = 0
        self.rejected_old = 0
        self._bytes: int | None = None  # cached estimate, None = stale
        self._tree_bytes: dict = {}  # tree key (problem id or _GLOBAL) -> its last estimate_memory()
        self._dirty: set = set()  # tree keys written since their last estimate
        self._measured: tuple | None = None  # (bytes, tokens) at the last measurement
        self._live_tokens = 0  # in-flight tokens added since the last rebuild
        self.live_settled = 0  # in-flight entries kept as stored rollouts by a rebuild (no re-insertion)
        self._history: dict = {}  # problem id (None included) -> stored (settled) entries

    # ------------------------------------------------------------------ placement
    def _in_problem(self, problem_id: str | None) -> bool:
        return problem_id is not None and self.scope in ("problem", "both")

    def _in_global(self, problem_id: str | None) -> bool:
        return problem_id is None or self.scope in ("global", "both")

    @property
    def min_version(self) -> int | None:
        """Oldest version the window admits (None before any version was seen)."""
        return None if self.newest_version is None else self.newest_version - self.window_steps + 1

    # ------------------------------------------------------------------ writes
    def add(self, token_ids: Sequence[int] | np.ndarray, *, version: int, problem_id: str | None = None,
            prompt_token_ids: Sequence[int] | np.ndarray = ()) -> int | None:
        """Add one rollout; returns its sequence id, or None when its version is already outside
        the window (it would be evicted at once). Does not slide the window or enforce the cap."""
        version = _check_version(version, "version")
        if problem_id is not None and not isinstance(problem_id, str):
            raise StoreInputError(f"problem_id: expected a str or None, got {type(problem_id).__name__}")
        resp = as_token_array(token_ids, "token_ids")
        prompt = as_token_array(prompt_token_ids, "prompt_token_ids")
        if self.min_version is not None and version < self.min_version:
            self.rejected_old += 1
            return None
        seq = self._sequence(prompt, resp)
        if len(seq) == 0:
            return None
        return self._insert(seq, problem_id, version, live=False)

    def _sequence(self, prompt: np.ndarray, resp: np.ndarray) -> np.ndarray:
        """What an entry holds: the last max_tree_depth-1 prompt tokens, then the response."""
        if not len(prompt):  # arctic takes writable arrays only (Ray's zero-copy arrays are read-only)
            return resp if resp.flags.writeable else resp.copy()
        return np.concatenate([prompt[len(prompt) - min(len(prompt), self.prompt_tail):], resp])

    def _insert(self, seq: np.ndarray, problem_id: str | None, version: int, live: bool,
                seq_id: int | None = None) -> int:
        seq_id = self._new_seq_id() if seq_id is None else seq_id
        in_p, in_g = self._in_problem(problem_id), self._in_global(problem_id)
        if in_p:
            tree = self._problem_trees.get(problem_id)
            if tree is None:
                tree = self._problem_trees[problem_id] = self._Tree(self.max_tree_depth)
            tree.extend_ndarray(seq_id, seq)
            self._problem_entries[problem_id] = self._problem_entries.get(problem_id, 0) + 1
            self._dirty.add(problem_id)
        if in_g:
            if self._global_tree is None:
                self._global_tree = self._Tree(self.max_tree_depth)
            self._global_tree.extend_ndarray(seq_id, seq)
            self._global_entries += 1
            self._dirty.add(_GLOBAL)
        self._entries[seq_id] = Entry(seq_id, problem_id, version, int(len(seq)), in_p, in_g,
                                      [seq.copy()] if live else None, None if live else seq.copy())
        if not live:
            self._history[problem_id] = self._history.get(problem_id, 0) + 1
        self._bytes = None
        return seq_id

    # ------------------------------------------------------------------ in-flight (live) entries
    def start_live(self, context: np.ndarray, *, problem_id: str | None, version: int) -> int | None:
        """Open an in-flight entry for a running request: `context` is its prompt tail plus the tokens
        generated so far (int32). Siblings (same problem) can draft from it while it grows. Live
        entries are settled by the next :meth:`rebuild`: kept if the update carries the identical
        rollout, removed otherwise, so after a rebuild the store holds exactly the window's rollouts."""
        if len(context) == 0:
            return None
        sid = self._insert(np.ascontiguousarray(context, dtype=np.int32), problem_id, int(version), live=True)
        self._live_tokens += len(context)
        return sid

    def has_history(self, problem_id: str | None) -> bool:
        """Whether the store holds settled rollouts of this problem (in any tree)."""
        return problem_id in self._history

    def extend_live(self, seq_id: int, tokens: np.ndarray) -> None:
        """Append verified tokens to an in-flight entry (no-op if the entry is gone)."""
        e = self._entries.get(seq_id)
        if e is None or e.live is None or len(tokens) == 0:
            return
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        if e.in_problem_tree:
            self._problem_trees[e.problem_id].extend_ndarray(seq_id, tokens)
            self._dirty.add(e.problem_id)
        if e.in_global_tree:
            self._global_tree.extend_ndarray(seq_id, tokens)
            self._dirty.add(_GLOBAL)
        e.live.append(tokens.copy())
        e.num_tokens += len(tokens)
        self._live_tokens += len(tokens)
        self._bytes = None

    def live_over_cap(self) -> bool:
        """Cheap check for in-flight growth: the last measured bytes plus the live tokens added since,
        at the measured bytes per token, against the cap."""
        if self.max_memory_bytes is None:
            return False
        if self._measured is None:
            return self.bytes() > self.max_memory_bytes
        b, t = self._measured
        per_token = b / t if t else 400.0
        return b + per_token * self._live_tokens > self.max_memory_bytes

    def _settle_live(self, checked: list) -> tuple:
        """Match the update's rollouts against in-flight entries (same problem, identical tokens):
        matches are kept as stored entries (retagged with the rollout's version); in-flight entries
        the update does not carry are removed. Returns (rollouts still to insert, matched count)."""
        live: dict = {}
        for e in self._entries.values():
            if e.live is not None:
                seq = np.concatenate(e.live) if len(e.live) > 1 else e.live[0]
                live.setdefault((e.problem_id, seq.tobytes()), []).append(e.seq_id)
        rest, matched = [], 0
        for pid, seq, v in checked:
            ids = live.get((pid, seq.tobytes())) if live else None
            if ids and (self.min_version is None or v >= self.min_version):
                e = self._entries[ids.pop()]
                e.version, e.live, e.tokens = v, None, seq.copy()
                self._history[pid] = self._history.get(pid, 0) + 1
                matched += 1
            else:
                rest.append((pid, seq, v))
        for ids in live.values():
            for sid in ids:
                self.remove(sid)
        self._live_tokens = 0
        return rest, matched

    def _new_seq_id(self, reserved: Collection[int] = frozenset()) -> int:
        """A free sequence id (not stored, not in `reserved`), increasing until 2^31 wraps."""
        if self._next_seq_id > _MAX_SEQ_ID:  # 2^31 insertions: restart at the lowest free id
            used = set(self._entries) | set(reserved)
            self._next_seq_id = next(i for i in range(_MAX_SEQ_ID + 1) if i not in used)
        sid = self._next_seq_id
        self._next_seq_id += 1
        while self._next_seq_id in self._entries or self._next_seq_id in reserved:
            self._next_seq_id += 1
        return sid

    def remove(self, seq_id: int) -> None:
        """Remove one entry from every tree that holds it (exact)."""
        e = self._entries.pop(seq_id)
        if e.live is None:
            n = self._history[e.problem_id] - 1
            if n:
                self._history[e.problem_id] = n
            else:
                del self._history[e.problem_id]
        if e.in_problem_tree:
            n = self._problem_entries[e.problem_id] - 1
            if n == 0:  # free the tree (its last sequence needs no removal): an empty problem is no problem
                del self._problem_entries[e.problem_id]
                del self._problem_trees[e.problem_id]
                self._tree_bytes.pop(e.problem_id, None)
                self._dirty.discard(e.problem_id)
            else:
                self._problem_trees[e.problem_id].remove(seq_id)
                self._problem_entries[e.problem_id] = n
                self._dirty.add(e.problem_id)
        if e.in_global_tree:
            self._global_entries -= 1
            if self._global_entries == 0:
                self._global_tree = None
                self._tree_bytes.pop(_GLOBAL, None)
                self._dirty.discard(_GLOBAL)
            else:
                self._global_tree.remove(seq_id)
                self._dirty.add(_GLOBAL)
        self._bytes = None

    def evict_older_than(self, min_version: int) -> int:
        """Remove every entry whose version is < min_version; returns how many."""
        gone = [sid for sid, e in self._entries.items() if e.version < min_version]
        for sid in gone:
            self.remove(sid)
        return len(gone)

    def slide(self, newest_version: int) -> int:
        """Advance the window so it ends at `newest_version` (never moves back); returns evictions."""
        newest_version = _check_version(newest_version, "newest_version")
        if self.newest_version is None or newest_version > self.newest_version:
            self.newest_version = newest_version
        assert self.min_version is not None   # the window has a newest version now
        n = self.evict_older_than(self.min_version)
        self.evicted_window += n
        return n

    def enforce_memory(self) -> int:
        """Remove entries, oldest version first, until the estimate is within the cap; returns how many."""
        if self.max_memory_bytes is None:
            return 0
        removed = 0
        while self._entries and self.bytes() > self.max_memory_bytes:
            over = self.bytes() - self.max_memory_bytes
            per_token = self.bytes() / max(1, sum(e.num_tokens for e in self._entries.values()))
            need_tokens = over / per_token
            # oldest version first, insertion order within a version
            order = sorted(self._entries.values(), key=lambda e: (e.version, e.seq_id))
            freed = 0.0
            batch = []
            for e in order:
                batch.append(e.seq_id)
                freed += e.num_tokens
                if freed >= need_tokens:
                    break
            for sid in batch:
                self.remove(sid)
            removed += len(batch)
        self.evicted_memory += removed
        return removed

    def rebuild(self, rollouts: RolloutBatch | Iterable[Any], version: int) -> int:
        """One refresh step: validate all rollouts first (nothing changes on bad input), slide the
        window to the newest producing version (at least `version - 1`, the policy that generated
        the step's rollouts in a sync pipeline), admit the rollouts inside the window within the
        memory cap. `rollouts`: a RolloutBatch (read in place, no per-rollout copy), or records /
        dicts. Returns the number admitted: in-flight entries kept as rollouts plus rollouts inserted
        and not evicted by the cap while admitting.

        The cap keeps the newest entries (version, then insertion order) that fit, as inserting
        everything and then evicting oldest first would; rollouts are admitted newest first and
        admission stops at the first one that does not fit, so a step larger than the cap is never
        inserted only to be evicted (see :meth:`_admit`)."""
        version = _check_version(version, "version")
        checked = self._check_rollouts(rollouts, version)
        newest = max([version - 1] + [c[2] for c in checked])
        self.slide(newest)
        rest, added = self._settle_live(checked)
        self.live_settled += added
        inside = []
        for pid, seq, v in rest:
            if self.min_version is not None and v < self.min_version:
                self.rejected_old += 1
            elif len(seq):
                inside.append((pid, seq, v))
        added += self._admit(inside)
        self.enforce_memory()  # settled in-flight entries and older entries may still exceed the cap
        return added

    def _check_rollouts(self, rollouts: RolloutBatch | Iterable[Any], version: int) -> list:
        """[(problem id, stored sequence (prompt tail + response, int32), version)] or StoreInputError."""
        if isinstance(rollouts, RolloutBatch):
            return self._check_batch(rollouts, version)
        out = []
        for i, r in enumerate(_as_list(rollouts)):
            pid, prompt, resp, v = self._check_rollout(i, r, version)
            out.append((pid, self._sequence(prompt, resp), v))
        return out

    @staticmethod
    def _check_rollout(i: int, r: Any, version: int) -> tuple:
        try:
            rec = as_record(r, i)
        except RolloutError as e:
            raise StoreInputError(str(e)) from None
        if rec.policy_version > version:
            raise StoreInputError(f"rollouts[{i}].policy_version={rec.policy_version} is newer than the policy "
                                  f"version being installed ({version}): a rollout cannot come from a future policy")
        return rec.problem_id, rec.prompt_token_ids, rec.token_ids, rec.policy_version

    def _check_batch(self, b: RolloutBatch, version: int) -> list:
        """A RolloutBatch checked as a whole; each stored sequence is a view of `b.tokens` (a rollout's
        prompt part is followed by its response there)."""
        t, st, pl, vs = b.tokens, b.starts, b.prompt_lens, b.versions
        if not t.flags.writeable:  # arctic takes writable arrays only; Ray's zero-copy get is read-only
            t = t.copy()
        if t.size and int(t.min()) < 0:
            i = int(np.searchsorted(st, int(np.argmax(t < 0)), side="right")) - 1
            raise StoreInputError(f"rollouts[{i}]: token ids must be in [0, 2^31), got a negative id")
        for bad, what in ((vs < 0, "an int policy version >= 0"), (vs > version, None)):
            if bad.any():
                i = int(np.argmax(bad))
                if what:
                    raise StoreInputError(f"rollouts[{i}].policy_version: expected {what}, got {int(vs[i])}")
                raise StoreInputError(f"rollouts[{i}].policy_version={int(vs[i])} is newer than the policy version "
                                      f"being installed ({version}): a rollout cannot come from a future policy")
        for i, pid in enumerate(b.problem_ids):
            if pid is not None and not isinstance(pid, str):
                raise StoreInputError(f"rollouts[{i}].problem_id: expected a str or None, got {type(pid).__name__}")
        first = st[:-1] + pl - np.minimum(pl, self.prompt_tail)
        return [(pid, t[int(a):int(e)], int(v)) for pid, a, e, v in zip(b.problem_ids, first, st[1:], vs, strict=True)]

    def _admit(self, items: list) -> int:
        """Insert `items` [(problem id, sequence, version)] within the memory cap; returns how many stay.

        Sequence ids are taken in input order, so the eviction order (version, then sequence id) is
        the one inserting them all would give. Without a cap, all are inserted in input order.
        With a cap, they are inserted newest first, in chunks sized from the measured bytes per
        token (one memory estimate per chunk, only of the trees written); after a chunk that
        crosses the cap, :meth:`enforce_memory` evicts oldest first, and no item older than an
        evicted entry is inserted afterwards (it would have been evicted before it).

        When every stored entry is older than every item and the items alone are predicted to
        exceed the cap, they are inserted into new, empty trees: if the cap then cuts the items,
        every stored entry (older than the cut) goes with its trees, freed whole instead of
        sequence by sequence. If the prediction was wrong (all items fit), they are inserted into
        the stored trees after all and the cap is enforced oldest first as usual."""
        if not items:
            return 0
        reserved: set = set()
        ids = []
        for _ in items:
            ids.append(self._new_seq_id(reserved))
            reserved.add(ids[-1])
        if self.max_memory_bytes is None:
            for (pid, seq, v), sid in zip(items, ids, strict=True):
                self._insert(seq, pid, v, live=False, seq_id=sid)
            return len(items)
        order = sorted(range(len(items)), key=lambda i: (items[i][2], ids[i]), reverse=True)
        stash = self._stash_if_superseded(items, ids)
        kept, cut = self._fill(items, ids, order)
        if stash is None:
            return kept
        if cut:  # the cap cut the items themselves: every stashed (older) entry is evicted with its trees
            self.evicted_memory += len(stash["_entries"])
            return kept
        # all items fit on their own: put them into the stored trees next to the older entries
        fresh = [(e.seq_id, e.problem_id, e.version) for e in self._entries.values()]
        seqs = {ids[i]: items[i][1] for i in range(len(items))}
        self.__dict__.update(stash)
        for sid, pid, v in sorted(fresh):
            self._insert(seqs[sid], pid, v, live=False, seq_id=sid)
        self.enforce_memory()
        return sum(1 for sid in seqs if sid in self._entries)

    def _stash_if_superseded(self, items: list, ids: list) -> dict | None:
        """If every stored entry is older than every item and the items are predicted to exceed the
        cap on their own, move the stored state aside (empty trees from here on) and return it."""
        if not self._entries or self._measured is None or not self._measured[1]:
            return None
        newest_old = max((e.version, e.seq_id) for e in self._entries.values())
        if newest_old >= min((v, sid) for (_, _, v), sid in zip(items, ids, strict=True)):
            return None
        per_token = self._measured[0] / self._measured[1]
        if per_token * sum(len(seq) for _, seq, _ in items) <= self.max_memory_bytes:
            return None
        keys = ("_problem_trees", "_global_tree", "_entries", "_problem_entries", "_global_entries", "_history",
                "_tree_bytes", "_dirty", "_bytes", "_measured")
        stash = {k: getattr(self, k) for k in keys}
        self._problem_trees, self._global_tree, self._entries = {}, None, OrderedDict()
        self._problem_entries, self._global_entries, self._history = {}, 0, {}
        self._tree_bytes, self._dirty, self._bytes = {}, set(), None
        self._measured = stash["_measured"]  # keeps the bytes-per-token rate for chunk sizing
        return stash

    def _fill(self, items: list, ids: list, order: list) -> tuple:
        """Insert items newest first (`order`) in measured chunks within the cap (see :meth:`_admit`).
        Returns (items still stored, whether the cap cut the items)."""
        cap = self.max_memory_bytes
        assert cap is not None   # only a capped store fills in chunks (_admit)
        inserted: list = []  # seq ids of inserted items
        pos, cut = 0, False
        new_bytes = 0.0  # predicted bytes of the inserted items
        while pos < len(order):
            b, t = self._measured if self._measured and self._measured[1] else (0, 0)
            per_token = b / t if t else 400.0 * (2 if self.scope == "both" else 1)
            budget = _FILL * (cap - new_bytes)
            chunk = [order[pos]]
            spent = per_token * len(items[order[pos]][1])
            for j in order[pos + 1:]:
                more = per_token * len(items[j][1])
                if spent + more > budget:
                    break
                chunk.append(j)
                spent += more
            for j in chunk:
                pid, seq, v = items[j]
                self._insert(seq, pid, v, live=False, seq_id=ids[j])
                inserted.append(ids[j])
            pos += len(chunk)
            new_bytes += spent
            if self.bytes() > cap:
                oldest_left = (items[order[pos]][2], ids[order[pos]]) if pos < len(order) else None
                present = {sid: (e.version, sid) for sid, e in self._entries.items()}
                self.enforce_memory()
                gone = [key for sid, key in present.items() if sid not in self._entries]
                if any(sid not in self._entries for sid in inserted) or (
                        oldest_left is not None and gone and max(gone) > oldest_left):
                    cut = True
                    break  # everything not yet inserted is older than something the cap evicted
            if len(self._entries) == len(inserted):  # only items stored: the estimate is theirs
                new_bytes = float(self.bytes())
        if pos < len(order):
            cut = True
            self.evicted_memory += len(order) - pos  # admitted nowhere: evicted at once, as before
        return sum(1 for sid in inserted if sid in self._entries), cut

    def clear(self) -> None:
        for sid in list(self._entries):
            self.remove(sid)

    # ------------------------------------------------------------------ checkpoint
    def export(self) -> dict:
        """The window as a checkpoint carries it: every settled entry (problem id, version, stored
        sequence) in eviction order, and the window's newest version. In-flight entries are not
        carried (a resumed run regenerates what was in flight). Plain lists and one int32 array."""
        kept = sorted((e for e in self._entries.values() if e.live is None), key=lambda e: (e.version, e.seq_id))
        seqs = [e.tokens for e in kept if e.tokens is not None]  # every settled entry keeps its tokens
        return {"max_tree_depth": self.max_tree_depth, "scope": self.scope, "window_steps": self.window_steps,
                "newest_version": self.newest_version, "problem_ids": [e.problem_id for e in kept],
                "versions": [e.version for e in kept], "lengths": [len(t) for t in seqs],
                "tokens": np.concatenate(seqs) if seqs else np.zeros(0, np.int32)}

    def restore(self, state: dict) -> int:
        """Replace the content with an `export` of a store with the same `max_tree_depth` (a sequence
        stores the last max_tree_depth - 1 prompt tokens, so another depth's entries are not this
        store's): its entries in their order, its newest version, then this store's window and
        memory cap. Returns the entries kept. Raises StoreInputError on another depth or a malformed
        state, before anything changes."""
        if int(state.get("max_tree_depth", -1)) != self.max_tree_depth:
            raise StoreInputError(f"the saved window was built with max_tree_depth {state.get('max_tree_depth')}, "
                                  f"this store's is {self.max_tree_depth}")
        tokens = np.ascontiguousarray(np.asarray(state["tokens"]), dtype=np.int32)
        lengths, versions, pids = list(state["lengths"]), list(state["versions"]), list(state["problem_ids"])
        if not (len(lengths) == len(versions) == len(pids)) or sum(lengths) != len(tokens):
            raise StoreInputError(f"the saved window is inconsistent: {len(pids)} problem ids, {len(versions)} "
                                  f"versions, {len(lengths)} lengths over {len(tokens)} tokens")
        self.clear()
        self.newest_version = None
        ends = np.cumsum(lengths, dtype=np.int64)
        for pid, v, a, e in zip(pids, versions, ends - np.asarray(lengths, dtype=np.int64), ends, strict=True):
            self._insert(tokens[int(a):int(e)], pid, _check_version(int(v), "version"), live=False)
        if state.get("newest_version") is not None:
            self.slide(int(state["newest_version"]))
        self.enforce_memory()
        return len(self._entries)

    # ------------------------------------------------------------------ reads
    def speculate(self, context: np.ndarray, problem_id: str | None, max_spec_tokens: int,
                  max_spec_factor: float = 1.0, min_token_prob: float = 0.1,
                  calibration: AcceptanceCalibration | None = None) -> StoreDraft:
        """Best draft for `context` (int32, its last max_tree_depth tokens are used) from the trees
        the request may see: its problem tree (scope problem|both) and/or the global tree.

        Without `calibration`, drafts are ranked by arctic's score (the sum of the path's estimated
        probabilities) and the global tree is skipped once the problem tree gave a full-length draft.
        With an :class:`~nemo_rl_specdec.drafters.machinery.calibration.AcceptanceCalibration`, drafts are
        ranked by calibrated expected accepted tokens (returned as ``score``), the losing tree's draft
        is returned too (``other``: the proposer measures what it would have got, so each source is
        calibrated on the same contexts, not only where it won), and the global tree is skipped only
        when it cannot win: when even ``max_spec_tokens`` tokens at its best measured rate would not
        beat the problem tree's draft."""
        if max_spec_tokens <= 0 or len(context) == 0:
            return _EMPTY
        if len(context) > self.max_tree_depth:
            context = context[len(context) - self.max_tree_depth:]
        best = _EMPTY
        if self._in_problem(problem_id):
            tree = self._problem_trees.get(problem_id)
            if tree is not None:
                d = tree.speculate_ndarray(context, max_spec_tokens, max_spec_factor, 0.0, min_token_prob, False)
                if d.token_ids:
                    e = d.score if calibration is None else calibration.expected(0, d.probs)
                    best = StoreDraft(d.token_ids, d.probs, e, d.match_len, "problem")
                    if calibration is None:
                        if len(best.token_ids) >= max_spec_tokens:
                            return best  # full length from the problem's own rollouts: skip the global tree
                    elif e >= max_spec_tokens * calibration.max_rate[1]:
                        return best  # the global tree cannot beat it
        if self._in_global(problem_id) and self._global_tree is not None:
            d = self._global_tree.speculate_ndarray(context, max_spec_tokens, max_spec_factor, 0.0,
                                                    min_token_prob, False)
            if d.token_ids:
                e = d.score if calibration is None else calibration.expected(1, d.probs)
                g = StoreDraft(d.token_ids, d.probs, e, d.match_len, "global")
                if e > best.score:
                    g.other, best = (best if best.token_ids else None), g
                elif calibration is not None:
                    best.other = g
        return best

    def bytes(self) -> int:
        """Estimated bytes of all trees (arctic's estimate_memory), cached until the next write."""
        if self._bytes is None:  # re-estimate only the trees written since (estimate_memory walks a tree)
            for key in self._dirty:
                tree = self._global_tree if key is _GLOBAL else self._problem_trees.get(key)
                if tree is None:
                    self._tree_bytes.pop(key, None)
                else:
                    self._tree_bytes[key] = int(tree.estimate_memory())
            self._dirty.clear()
            self._bytes = int(sum(self._tree_bytes.values()))
            self._measured = (self._bytes, sum(e.num_tokens for e in self._entries.values()))
            self._live_tokens = 0
        return self._bytes

    def versions(self) -> list:
        return sorted({e.version for e in self._entries.values()})

    def entries(self, problem_id: str | None | EllipsisType = ..., version: int | None = None) -> list:
        """Live entries, optionally filtered by problem id (None = no id) and/or version."""
        return [e for e in self._entries.values()
                if (problem_id is ... or e.problem_id == problem_id) and (version is None or e.version == version)]

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._entries

    def stats(self) -> dict:
        by_version: dict = {}
        for e in self._entries.values():
            by_version[e.version] = by_version.get(e.version, 0) + 1
        return {
            "entries": len(self._entries),
            "tokens": sum(e.num_tokens for e in self._entries.values()),
            "versions": sorted(by_version),
            "entries_by_version": {str(k): v for k, v in sorted(by_version.items())},
            "problems": len(self._problem_trees),
            "global_entries": self._global_entries,
            "bytes": self.bytes(),
            "max_memory_bytes": self.max_memory_bytes,
            "window_steps": self.window_steps,
            "newest_version": self.newest_version,
            "scope": self.scope,
            "max_tree_depth": self.max_tree_depth,
            "evicted_window": self.evicted_window,
            "evicted_memory": self.evicted_memory,
            "rejected_old": self.rejected_old,
            "live_entries": sum(1 for e in self._entries.values() if e.live is not None),
            "live_settled": self.live_settled,
        }


def _check_version(v: object, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise StoreInputError(f"{what}: expected an int policy version, got {v!r} ({type(v).__name__})")
    if v < 0:
        raise StoreInputError(f"{what}: policy versions are >= 0, got {v}")
    return int(v)


def _as_list(rollouts: object) -> list:
    if rollouts is None or isinstance(rollouts, (str, bytes, dict)) or not isinstance(rollouts, Iterable):
        raise StoreInputError(f"rollouts: expected a list of rollout dicts, got {type(rollouts).__name__}")
    return list(rollouts)
