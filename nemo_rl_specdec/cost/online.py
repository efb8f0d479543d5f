"""An engine's step time, fitted online: the parameters of the one step-cost function's linear form.

    t = c_base + c_seq * requests + c_tok * verified tokens + c_ctx * sum(context)

is `cost/model.py`'s linear target forward (`hardware.c_*_s`, `linear_columns`), with the drafter's
own time per step folded into c_base and c_seq (a list drafter runs for every request of every step).
`StepCostFit` keeps the engine's most recent decode steps, refits them every `refit_every` steps
with `cost/fit.py`'s `nnls_fit` (non-negative least squares, refitted once without the steps whose
residual is more than `OUTLIER_MADS` robust deviations out: a step the engine was held up in,
another engine on the core, a pause between calls; docs/measurements/scheduling.md has what they
did to the fit on the CPU bench), and answers what a step would cost with more or fewer
draft tokens through the `CostModel` of those constants (`cost_model`). Until it has `min_samples`
steps with at least two different draft-token counts it answers None, and the caller drafts as
without it (the warm-up). Its
constants, sample count, samples kept and R^2 (on those) are the engine's `step_cost` metric.

A model drafter runs its own forwards inside the step: one per draft position, the first over the
step's verified tokens (vLLM runs it even at k = 0, to keep the drafter's KV in sync).
`StepCostFit(draft_forwards=True)` adds their cost, `c_fwd_s * f + c_fwd_seq_s * f * requests`
with f = max(k, 1) the step's draft forwards (`scheduling/k_auto.py`).
"""
from __future__ import annotations

from collections import deque
from typing import Protocol, runtime_checkable

import numpy as np

from nemo_rl_specdec.cost.fit import nnls_fit
from nemo_rl_specdec.cost.model import CostModel, linear_columns

COLUMNS = ("c_base_s", "c_seq_s", "c_tok_s", "c_ctx_s")   # the metrics' names of LINEAR_TERMS
FORWARD_COLUMNS = ("c_fwd_s", "c_fwd_seq_s")


@runtime_checkable
class StepCostSource(Protocol):
    """What a per-step rule reads of a step's cost (`drafters/machinery/step_judge.py` `StepJudge.fit`):
    the engine's online fit (`StepCostFit`) or a hardware profile's prices (`cost/price.py`
    `PricedStepCost`, for a replayed rule)."""

    @property
    def ready(self) -> bool:
        """Whether `split` answers (False during an online fit's warm-up)."""
        ...

    @property
    def samples(self) -> int:
        """Decode steps seen (`add`)."""
        ...

    @property
    def r2(self) -> float | None:
        """The fit's R^2 (None: not fitted, or nothing fitted)."""
        ...

    def split(self, requests: int, ctx_sum: int, draft_tokens: float | None = None) -> tuple[float, float] | None:
        """(t0, c_tok) of a step (`CostModel.split`), or None while not `ready`."""
        ...

    def add(self, requests: int, verified_tokens: int, ctx_sum: int, seconds: float, forwards: int = 0) -> None:
        """One decode step the engine ran, and its time."""
        ...

    def metrics(self) -> dict: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@runtime_checkable
class HybridStepCost(StepCostSource, Protocol):
    """What the hybrid's per-step choice reads (`drafters/hybrid.py` `HybridProposer.cost`): a
    `StepCostSource` that also prices the model half's draft forwards a step may skip."""

    def forward_s(self, requests: int, k: int) -> float:
        """The model drafter's k - 1 draft forwards after the first (`CostModel.draft_forwards`)."""
        ...


class StepCostFit:
    """Online fit of one engine's step time (see module doc)."""

    def __init__(self, window: int = 2048, min_samples: int = 32, refit_every: int = 32,
                 draft_forwards: bool = False):
        self.columns = COLUMNS + (FORWARD_COLUMNS if draft_forwards else ())
        if window < min_samples or min_samples < len(self.columns) or refit_every < 1:
            raise ValueError(f"window={window}, min_samples={min_samples}, refit_every={refit_every}: need "
                             f"window >= min_samples >= {len(self.columns)} and refit_every >= 1")
        self.draft_forwards = bool(draft_forwards)
        self.min_samples, self.refit_every = int(min_samples), int(refit_every)
        self._x: deque = deque(maxlen=int(window))
        self._y: deque = deque(maxlen=int(window))
        self._since = 0
        self.coef: np.ndarray | None = None
        self.r2: float | None = None
        self.samples = 0
        self.kept = 0  # samples of the last fit left after dropping outliers

    def add(self, requests: int, verified_tokens: int, ctx_sum: int, seconds: float, forwards: int = 0) -> None:
        """One decode step that verified `verified_tokens` tokens of `requests` requests (and ran
        `forwards` draft forwards, with `draft_forwards`)."""
        if requests <= 0 or not seconds > 0 or not np.isfinite(seconds):
            return
        row = linear_columns(requests, verified_tokens, ctx_sum, forwards)
        self._x.append(row if self.draft_forwards else row[:len(COLUMNS)])
        self._y.append(float(seconds))
        self.samples += 1
        self._since += 1
        if self._since >= self.refit_every and len(self._y) >= self.min_samples:
            self._refit()

    def _refit(self) -> None:
        self._since = 0
        X, y = np.asarray(self._x), np.asarray(self._y)
        if np.ptp(X[:, 2] - X[:, 1]) == 0:  # draft tokens never varied: c_tok cannot be told from c_seq
            return
        if self.draft_forwards and np.ptp(X[:, 4]) == 0:  # nor draft forwards: c_fwd is c_base
            return
        fit = nnls_fit(X, y, refit=lambda keep: int(keep.sum()) >= self.min_samples)
        self.coef, self.kept, self.r2 = fit.coef, fit.kept, fit.r2

    @property
    def ready(self) -> bool:
        """Whether the fit is made (after the warm-up): `split` answers."""
        return self.coef is not None

    def cost_model(self) -> CostModel | None:
        """The one step-cost function with the fitted constants (None during the warm-up)."""
        return None if self.coef is None else CostModel.from_linear(self.coef)

    def split(self, requests: int, ctx_sum: int, draft_tokens: float | None = None) -> tuple[float, float] | None:
        """(t0, c_tok): a step of these requests without drafts, and the cost of one more verified
        token (the same for any `draft_tokens`: the form is linear); None during the warm-up."""
        cm = self.cost_model()
        if cm is None:
            return None
        t0, c_tok = cm.split(requests, ctx_sum, float(requests if draft_tokens is None else draft_tokens))
        return (t0, c_tok) if t0 > 0 else None

    def forward_s(self, requests: int, k: int) -> float:
        """The model drafter's draft forwards after the first (k - 1 of them) for a step of `requests`
        requests, from the fitted constants; 0 during the warm-up or without `draft_forwards`."""
        cm = self.cost_model()
        if cm is None or not self.draft_forwards:
            return 0.0
        return cm.draft_forwards(np.zeros(requests), k)[1]

    def state_dict(self) -> dict:
        """What a checkpoint carries: the samples in the window and the fit made from them."""
        return {"columns": list(self.columns), "x": np.asarray(self._x, np.float64).reshape(-1, len(self.columns)),
                "y": np.asarray(self._y, np.float64), "since": self._since,
                "coef": None if self.coef is None else np.asarray(self.coef, np.float64), "r2": self.r2,
                "samples": self.samples, "kept": self.kept}

    def load_state_dict(self, state: dict) -> None:
        """A `state_dict` of a fit with the same columns (its window is cut to this one's length)."""
        if list(state["columns"]) != list(self.columns):
            raise ValueError(f"the saved step-cost fit has columns {list(state['columns'])}; "
                             f"this one {list(self.columns)}")
        self._x.clear()
        self._y.clear()
        self._x.extend(np.asarray(row, np.float64) for row in np.asarray(state["x"]))
        self._y.extend(float(v) for v in np.asarray(state["y"]))
        self._since, self.samples, self.kept = int(state["since"]), int(state["samples"]), int(state["kept"])
        self.coef = None if state["coef"] is None else np.asarray(state["coef"], np.float64)
        self.r2 = None if state["r2"] is None else float(state["r2"])

    def metrics(self) -> dict:
        coef = [None] * len(self.columns) if self.coef is None else [float(v) for v in self.coef]
        return {"samples": self.samples, "kept": self.kept, "r2": self.r2, **dict(zip(self.columns, coef, strict=True))}


__all__ = ["COLUMNS", "FORWARD_COLUMNS", "HybridStepCost", "StepCostFit", "StepCostSource"]
