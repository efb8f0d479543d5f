"""Per-problem rollout-length prediction.

GRPO samples the same problems again and again (several samples per step, and again in later
epochs), and the samples of one problem tend to be long or short together. `LengthPredictor`
keeps, per problem id, an exponential moving average (EMA) of the lengths seen so far plus a
short history of recent lengths, and a global history for problems never seen before.

- `predict(pid)`: the EMA for a known problem; for an unknown one the cold-start prior — the
  global mean (`cold_start="mean"`), a global quantile (`"quantile"`), or the configured
  `prior` (`"prior"`, also used while nothing at all has been observed).
- `predict_remaining(pid, generated)`: the expected number of tokens still to come for a
  request that has already produced `generated` tokens, E[L - g | L > g], estimated from the
  problem's recent lengths (the global ones for an unknown problem). Once a request has
  outlived every length on record, it is assumed to keep going for `tail_factor * g` more
  tokens (a long-tailed length distribution: the longer a request has run, the longer it is
  likely to run). The result is clipped to `max_len - g` when `max_len` is set, and is never
  negative.

The state is plain JSON (`to_dict` / `from_dict`), so it can be checkpointed with the run.
"""
from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Hashable, Iterable
from typing import Any

COLD_STARTS = ("mean", "quantile", "prior")


class _History:
    """Recent lengths of one problem (or of all problems), with a sorted view and suffix sums."""

    __slots__ = ("recent", "_sorted", "_suffix")

    def __init__(self, maxlen: int, values: Iterable[float] = ()):
        self.recent: deque[float] = deque(values, maxlen=maxlen)
        self._sorted: list[float] | None = None
        self._suffix: list[float] | None = None

    def add(self, x: float) -> None:
        self.recent.append(x)
        self._sorted = self._suffix = None

    def _view(self) -> tuple[list[float], list[float]]:
        if self._sorted is None:
            s = sorted(self.recent)
            suffix = [0.0] * (len(s) + 1)
            for i in range(len(s) - 1, -1, -1):
                suffix[i] = suffix[i + 1] + s[i]
            self._sorted, self._suffix = s, suffix
        return self._sorted, self._suffix  # type: ignore[return-value]

    def mean_above(self, g: float) -> float | None:
        """Mean of the recorded lengths strictly greater than g, or None if there are none."""
        s, suffix = self._view()
        i = bisect.bisect_right(s, g)
        n = len(s) - i
        return suffix[i] / n if n else None

    def quantile(self, q: float) -> float:
        s, _ = self._view()
        if not s:
            raise ValueError("empty history")
        pos = q * (len(s) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    def mean(self) -> float:
        s, suffix = self._view()
        return suffix[0] / len(s)

    def __len__(self) -> int:
        return len(self.recent)


class LengthPredictor:
    """EMA of previous rollout lengths per problem id, with a cold-start prior.

    Args:
        alpha: EMA weight of the newest observation (1.0 = last length only).
        cold_start: what an unseen problem predicts: "mean" or "quantile" of all lengths seen
            so far, or the configured "prior".
        prior: prediction used with cold_start="prior", and whenever nothing has been observed.
        quantile: the global quantile for cold_start="quantile".
        tail_factor: remaining length, as a multiple of the tokens generated so far, assumed for
            a request that has outlived every recorded length.
        max_len: response-length cap (max_new_tokens); remaining predictions never exceed it.
        history: how many recent lengths are kept per problem.
        global_history: how many recent lengths are kept over all problems.
    """

    def __init__(
        self,
        alpha: float = 0.5,
        cold_start: str = "mean",
        prior: float = 0.0,
        quantile: float = 0.5,
        tail_factor: float = 0.25,
        max_len: float | None = None,
        history: int = 32,
        global_history: int = 4096,
    ):
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha={alpha!r}: expected 0 < alpha <= 1")
        if cold_start not in COLD_STARTS:
            raise ValueError(f"cold_start={cold_start!r}: expected one of {list(COLD_STARTS)}")
        if prior < 0:
            raise ValueError(f"prior={prior!r}: expected >= 0")
        if not 0 <= quantile <= 1:
            raise ValueError(f"quantile={quantile!r}: expected 0 <= quantile <= 1")
        if tail_factor < 0:
            raise ValueError(f"tail_factor={tail_factor!r}: expected >= 0")
        if max_len is not None and max_len <= 0:
            raise ValueError(f"max_len={max_len!r}: expected > 0 or None")
        if history < 1 or global_history < 1:
            raise ValueError("history and global_history must be >= 1")
        self.alpha = float(alpha)
        self.cold_start = cold_start
        self.prior = float(prior)
        self.quantile = float(quantile)
        self.tail_factor = float(tail_factor)
        self.max_len = None if max_len is None else float(max_len)
        self.history = int(history)
        self.global_history = int(global_history)
        self._ema: dict[Hashable, float] = {}
        self._count: dict[Hashable, int] = {}
        self._hist: dict[Hashable, _History] = {}
        self._global = _History(self.global_history)

    # ------------------------------------------------------------------ updates
    def observe(self, problem_id: Hashable, length: float) -> None:
        """Record the final length of one finished rollout of `problem_id`."""
        length = float(length)
        if length < 0:
            raise ValueError(f"length={length!r} for problem {problem_id!r}: expected >= 0")
        if problem_id in self._ema:
            self._ema[problem_id] += self.alpha * (length - self._ema[problem_id])
            self._count[problem_id] += 1
        else:
            self._ema[problem_id] = length
            self._count[problem_id] = 1
            self._hist[problem_id] = _History(self.history)
        self._hist[problem_id].add(length)
        self._global.add(length)

    def observe_many(self, pairs: Iterable[tuple[Hashable, float]]) -> None:
        for pid, length in pairs:
            self.observe(pid, length)

    # ------------------------------------------------------------------ queries
    def known(self, problem_id: Hashable) -> bool:
        return problem_id in self._ema

    def count(self, problem_id: Hashable) -> int:
        return self._count.get(problem_id, 0)

    def cold_prediction(self) -> float:
        """What an unseen problem predicts."""
        if self.cold_start == "prior" or not len(self._global):
            return self.prior
        if self.cold_start == "mean":
            return self._global.mean()
        return self._global.quantile(self.quantile)

    def predict(self, problem_id: Hashable) -> float:
        """Predicted total response length of a new rollout of `problem_id`."""
        ema = self._ema.get(problem_id)
        return self.cold_prediction() if ema is None else ema

    def predict_remaining(self, problem_id: Hashable, generated_so_far: float) -> float:
        """Expected tokens still to come for a request that has generated `generated_so_far`."""
        g = float(generated_so_far)
        if g < 0:
            raise ValueError(f"generated_so_far={g!r}: expected >= 0")
        if g == 0:
            rem = self.predict(problem_id)
        else:
            hist = self._hist.get(problem_id, self._global)
            above = hist.mean_above(g) if len(hist) else None
            if above is not None:
                rem = above - g
            elif not len(hist):  # nothing observed at all: the prior, then the tail rule
                rem = self.prior - g if self.prior > g else self.tail_factor * g
            else:
                rem = self.tail_factor * g
        if self.max_len is not None:
            rem = min(rem, self.max_len - g)
        return max(0.0, float(rem))

    # ------------------------------------------------------------------ state
    def to_dict(self) -> dict[str, Any]:
        """JSON-able state. Problem ids are stored as given (use str/int ids for JSON)."""
        return {
            "params": {
                "alpha": self.alpha, "cold_start": self.cold_start, "prior": self.prior,
                "quantile": self.quantile, "tail_factor": self.tail_factor, "max_len": self.max_len,
                "history": self.history, "global_history": self.global_history,
            },
            "problems": [
                [pid, self._ema[pid], self._count[pid], list(self._hist[pid].recent)] for pid in self._ema
            ],
            "global": list(self._global.recent),
        }

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> LengthPredictor:
        try:
            p = cls(**state["params"])
            for pid, ema, count, recent in state["problems"]:
                if isinstance(pid, list):  # JSON turns tuple ids into lists
                    pid = tuple(pid)
                p._ema[pid] = float(ema)
                p._count[pid] = int(count)
                p._hist[pid] = _History(p.history, (float(x) for x in recent))
            p._global = _History(p.global_history, (float(x) for x in state["global"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"invalid LengthPredictor state: {e}") from None
        return p
