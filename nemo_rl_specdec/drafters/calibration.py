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

Every rate starts at its bin's centre (p = 1: 1.0) with ``prior`` pseudo-tokens, so an
uncalibrated source ranks drafts exactly as arctic's score does. Feedback arrives one engine step
after the draft, from how many tokens vLLM accepted (``len(sampled_token_ids[row]) - 1``), and is
folded in by batches (``flush_every`` drafts) with numpy; counts halve once a source has seen
``memory`` tokens, so the rates follow the policy as it changes.
"""
from __future__ import annotations

from itertools import chain

import numpy as np

SOURCES = ("problem", "global", "local")
BINS = 10  # bins [0, .1), ..., [.9, 1); index BINS is p == 1 exactly


class AcceptanceCalibration:
    """Per-source, per-probability-bin acceptance rates (see module docstring)."""

    def __init__(self, prior: float = 20.0, flush_every: int = 256, memory: float = 50_000.0):
        if prior <= 0 or flush_every < 1 or memory <= 0:
            raise ValueError(f"prior={prior}, flush_every={flush_every}, memory={memory}: all must be > 0")
        centres = np.append((np.arange(BINS) + 0.5) / BINS, 1.0)
        self.prior, self.flush_every, self.memory = float(prior), int(flush_every), float(memory)
        self._proposed = np.full((len(SOURCES), BINS + 1), self.prior)
        self._accepted = np.tile(centres * self.prior, (len(SOURCES), 1))
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

    def token_rates(self, source: int, probs) -> list:
        """Calibrated acceptance of each token of a path draft from `source` with these path probabilities."""
        return list(map(self.rates[source].__getitem__, map(int, map(float(BINS).__mul__, probs))))

    def rate_matrix(self, sources, probs, k: int) -> np.ndarray:
        """`token_rates` of many drafts at once: row i holds the rates of draft i (from `sources[i]`,
        with path probabilities `probs[i]`, at most k tokens), NaN past its end."""
        n = len(probs)
        lens = np.fromiter(map(len, probs), dtype=np.int64, count=n)
        out = np.full((n, k), np.nan)
        if not n or not lens.any():
            return out
        flat = np.fromiter(chain.from_iterable(probs), dtype=np.float64, count=int(lens.sum()))
        bins = np.minimum((flat * BINS).astype(np.int64), BINS)
        src = np.repeat(np.asarray(sources, dtype=np.int64), lens)
        out[np.arange(k) < lens[:, None]] = self._rate_arr[src, bins]
        return out

    def expected(self, source: int, probs) -> float:
        """Calibrated expected accepted tokens of a path draft from `source` with these path probabilities."""
        return sum(self.token_rates(source, probs))

    def record(self, source: int, probs, accepted: int) -> None:
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
        probs = np.fromiter(chain.from_iterable(p for _, p, _ in pend), dtype=np.float64, count=total)
        bins = np.minimum((probs * BINS).astype(np.int64), BINS)
        src = np.repeat(np.fromiter((s for s, _, _ in pend), dtype=np.int64, count=len(pend)), lens)
        starts = np.repeat(np.cumsum(lens) - lens, lens)
        pos = np.arange(total) - starts  # position of each token within its draft
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

    def table(self) -> dict:
        """{source: {"rates": [...], "tokens": [...]}} as of the last flush (prior included in tokens),
        for stats and docs. Does not flush: safe to call from another thread than the proposer's."""
        return {s: {"rates": [round(x, 4) for x in self.rates[i]],
                    "tokens": [round(float(x), 1) for x in self._proposed[i]]} for i, s in enumerate(SOURCES)}
