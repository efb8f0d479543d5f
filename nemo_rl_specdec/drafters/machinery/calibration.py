"""Expected accepted tokens of a suffix-tree draft, calibrated online on what the target accepted.

A path draft's token j carries the tree's estimate p_j of the probability that the continuation
reaches it (the product of count ratios along the path, arctic's ``Draft.probs``). If those
estimates were right, ``sum_j p_j`` (arctic's ``score``) would be the expected number of accepted
draft tokens. They are not equally right everywhere: a problem tree built from a handful of
rollouts reports p = 1 after a single rollout, a global tree's estimates pool unrelated problems.

:class:`AcceptanceCalibration` keeps, per draft source (``problem``, ``global``, ``local``) and per
probability bin (ten bins of width 0.1 plus one for p = 1 exactly, where a path never branched),
how many drafted tokens landed in the bin and how many of those the target accepted. The
calibrated expectation of a draft is ``sum_j rate[source][bin(p_j)]``: the number of accepted
tokens the same estimates turned into so far. By linearity of expectation this is the expected
accepted length, whatever the dependence between positions.

A drafter whose draft tokens carry no probability (n-gram prompt lookup) is calibrated by draft
position instead (``positions=k``): one rate per position, the share of drafted tokens at that
position the target accepted; ``probs`` is then any per-token sequence (its length is read).
Those rates start at ``POSITION_START``.

Drafts that were computed but not proposed (cut by the per-step rule, or beaten by another
source) are scored too, by ``resolve_withheld``: their accepted length is their common prefix
with what the target produced, so the rates stay unbiased while drafts are withheld.

Every rate starts at its bin's centre (p = 1: 1.0) with ``prior`` pseudo-tokens, so an
uncalibrated source ranks drafts exactly as arctic's score does. Feedback arrives one engine step
after the draft, from how many tokens vLLM accepted (``len(sampled_token_ids[row]) - 1``), and is
folded in by batches (``flush_every`` drafts) with numpy; counts halve once a source has seen
``memory`` tokens, so the rates follow the policy as it changes.
"""
from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np

SOURCES = ("problem", "global", "local")
BINS = 10  # bins [0, .1), ..., [.9, 1); index BINS is p == 1 exactly
POSITION_START = 0.5  # by position: where every rate starts


class AcceptanceCalibration:
    """Per-source acceptance rates by probability bin, or by draft position (see module docstring)."""

    def __init__(self, prior: float = 20.0, flush_every: int = 256, memory: float = 50_000.0,
                 sources: tuple = SOURCES, positions: int | None = None):
        if prior <= 0 or flush_every < 1 or memory <= 0 or (positions is not None and positions < 1):
            raise ValueError(f"prior={prior}, flush_every={flush_every}, memory={memory}, positions={positions}: "
                             "all must be > 0")
        self.sources, self.positions = tuple(sources), positions
        start = np.append((np.arange(BINS) + 0.5) / BINS, 1.0) if positions is None \
            else np.full(positions, POSITION_START)
        self.prior, self.flush_every, self.memory = float(prior), int(flush_every), float(memory)
        self._proposed = np.full((len(self.sources), len(start)), self.prior)
        self._accepted = np.tile(start * self.prior, (len(self.sources), 1))
        self.rates: list = []  # rates[source index] -> list of BINS + 1 floats (plain lists: fast lookups)
        self.max_rate: list = []  # per source: its highest rate (an upper bound per drafted token)
        self._refresh()
        self._pending: list = []  # (source index, probs, accepted count)
        self.observed_drafts = 0

    def _refresh(self) -> None:
        r = self._accepted / self._proposed
        self._rate_arr = r
        self.rates = [list(map(float, row)) for row in r]
        self.max_rate = [float(row.max()) for row in r]

    def _bins(self, flat: np.ndarray | None, pos: np.ndarray) -> np.ndarray:
        if self.positions is not None:
            return np.minimum(pos, self.positions - 1)
        assert flat is not None   # the callers read the probabilities unless bins are positions
        return np.minimum((flat * BINS).astype(np.int64), BINS)

    def token_rates(self, source: int, probs: Sequence[float]) -> list:
        """Calibrated acceptance of each token of a path draft from `source` with these path probabilities."""
        if self.positions is not None:
            r = self.rates[source]
            return [r[min(j, self.positions - 1)] for j in range(len(probs))]
        return list(map(self.rates[source].__getitem__, map(int, map(float(BINS).__mul__, probs))))

    def rate_matrix(self, sources: Sequence[int], probs: Sequence[Sequence[float]], k: int) -> np.ndarray:
        """`token_rates` of many drafts at once: row i holds the rates of draft i (from `sources[i]`,
        with path probabilities `probs[i]`, at most k tokens), NaN past its end."""
        n = len(probs)
        lens = np.fromiter(map(len, probs), dtype=np.int64, count=n)
        out = np.full((n, k), np.nan)
        if not n or not lens.any():
            return out
        mask = np.arange(k) < lens[:, None]
        flat = None if self.positions is not None else \
            np.fromiter(chain.from_iterable(probs), dtype=np.float64, count=int(lens.sum()))
        bins = self._bins(flat, np.nonzero(mask)[1])
        src = np.repeat(np.asarray(sources, dtype=np.int64), lens)
        out[mask] = self._rate_arr[src, bins]
        return out

    def expected(self, source: int, probs: Sequence[float]) -> float:
        """Calibrated expected accepted tokens of a path draft from `source` with these path probabilities."""
        return sum(self.token_rates(source, probs))

    def record(self, source: int, probs: Sequence[float], accepted: int) -> None:
        """The target accepted `accepted` leading tokens of a draft from `source` with these probabilities."""
        self._pending.append((source, probs, accepted))
        if len(self._pending) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        """Fold the pending feedback into the rates (numpy, one pass over all pending drafts)."""
        pend, self._pending = self._pending, []
        if not pend:
            return
        lens = np.fromiter((len(p) for _, p, _ in pend), dtype=np.int64, count=len(pend))
        total = int(lens.sum())
        if total == 0:
            return
        src = np.repeat(np.fromiter((s for s, _, _ in pend), dtype=np.int64, count=len(pend)), lens)
        starts = np.repeat(np.cumsum(lens) - lens, lens)
        pos = np.arange(total) - starts  # position of each token within its draft
        probs = None if self.positions is not None else \
            np.fromiter(chain.from_iterable(p for _, p, _ in pend), dtype=np.float64, count=total)
        bins = self._bins(probs, pos)
        acc = pos < np.repeat(np.fromiter((a for _, _, a in pend), dtype=np.int64, count=len(pend)), lens)
        np.add.at(self._proposed, (src, bins), 1.0)
        np.add.at(self._accepted, (src, bins), acc.astype(np.float64))
        self.observed_drafts += len(pend)
        for s in np.unique(src):
            seen = self._proposed[s].sum()
            if seen > self.memory:  # forget the older half: the policy moves
                keep = 0.5
                self._proposed[s] *= keep
                self._accepted[s] *= keep
        self._refresh()

    def state_dict(self) -> dict:
        """What a checkpoint carries: the counts behind the rates, and the feedback not yet folded into
        them (folded at the same draft as in a run that did not stop)."""
        return {"sources": list(self.sources), "proposed": self._proposed.copy(), "accepted": self._accepted.copy(),
                "observed_drafts": self.observed_drafts,
                "pending": [[int(src), [float(p) for p in probs], int(acc)] for src, probs, acc in self._pending]}

    def load_state_dict(self, state: dict) -> None:
        """Counts saved by `state_dict` of a calibration with the same sources and bins."""
        proposed, accepted = np.asarray(state["proposed"], np.float64), np.asarray(state["accepted"], np.float64)
        if list(state["sources"]) != list(self.sources) or proposed.shape != self._proposed.shape \
                or accepted.shape != self._accepted.shape:
            raise ValueError(f"the saved calibration has sources {list(state['sources'])} and {proposed.shape} bins; "
                             f"this one {list(self.sources)} and {self._proposed.shape}")
        self._pending = [(int(src), list(probs), int(acc)) for src, probs, acc in state.get("pending", [])]
        self._proposed, self._accepted = proposed.copy(), accepted.copy()
        self.observed_drafts = int(state["observed_drafts"])
        self._refresh()

    def table(self) -> dict:
        """{source: {"rates": [...], "tokens": [...]}} as of the last flush (prior included in tokens),
        for stats and docs. Does not flush: safe to call from another thread than the proposer's."""
        return {s: {"rates": [round(x, 4) for x in self.rates[i]],
                    "tokens": [round(float(x), 1) for x in self._proposed[i]]} for i, s in enumerate(self.sources)}


def resolve_withheld(calib: AcceptanceCalibration, withheld: list, sampled: list) -> list:
    """Feed back drafts that were computed but not proposed: `sampled` are the tokens the target
    produced this step (under rejection sampling a sample of the policy, whatever was drafted), so a
    draft's accepted length is its common prefix with what was produced. A draft that matches every
    produced token and has more waits for the next step's tokens. Entries are (source, probs,
    tokens not yet compared, tokens matched so far); the ones still waiting are returned."""
    left = []
    for src, probs, toks, got in withheld:
        m = 0
        for a, b in zip(toks, sampled, strict=False):  # at most k tokens
            if a != b:
                break
            m += 1
        if m < len(sampled) or m == len(toks):
            calib.record(src, probs, got + m)
        else:
            left.append((src, probs, toks[m:], got + m))
    return left
