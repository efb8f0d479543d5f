"""What our vLLM custom_class proposers (DAS in `suffix.py`, n-gram in `ngram.py`) share, as
`roles.ListProposer` declares it: the handle on the model runner that calls them, the speculative
block the worker extension attaches, the per-step rule built from it (`step_judge.StepJudge`), the
flat metrics the trainer logs, and turning drafting off for good.
"""
from __future__ import annotations

from typing import Any

from nemo_rl_specdec.drafters.machinery.step_judge import StepJudge


class SpecdecProposer:
    """Base of our custom_class proposers (a `roles.ListProposer`); a subclass sets `metrics_prefix`,
    keeps `k`, `counters`, `calibration` and its per-request state `_reqs`, drafts nothing while `k`
    is 0, and implements `configure(spec)`, `acceptance_metrics()`, `specdec_stats()` and `propose`."""

    metrics_prefix = ""
    runner: Any = None
    k: int
    counters: dict[str, float]
    judge: StepJudge
    _reqs: dict
    disabled_reason: str = ""

    def configure(self, spec: dict | None) -> None:
        raise NotImplementedError

    def acceptance_metrics(self) -> dict:
        """The calibrated acceptance, as {name: rate}."""
        raise NotImplementedError

    def make_judge(self, name: str, spec: dict | None) -> StepJudge:
        """The per-step rule the block asks for; `auto_disable` unset means on (the schema's default for
        our proposers)."""
        return StepJudge(name, self.counters, auto_disable=(spec or {}).get("auto_disable") is not False,
                         adaptive=((spec or {}).get("scheduling") or {}).get("budget") == "adaptive")

    def specdec_stats(self) -> dict:
        raise NotImplementedError

    def propose(self, sampled_token_ids: Any, num_tokens_no_spec: Any, token_ids_cpu: Any,
                slot_mappings: Any = None) -> list:
        raise NotImplementedError

    def specdec_disable(self, reason: str) -> None:
        """Stop proposing for good (on_refresh_error=disable): every later step drafts nothing, so
        vLLM verifies no drafts and the engine runs as without speculation."""
        self.k = 0
        self.disabled_reason = str(reason)
        self._reqs.clear()

    def specdec_new_policy(self, version: int) -> None:
        """A policy update arrived. These proposers keep no per-training-step window: their counters run
        from engine start, and the trainer logs them as they are."""

    def load_model(self, target_model: Any) -> None:
        """Required by vLLM's CPU runner (it calls drafter.load_model unconditionally). There is no
        model to load; the runner handle (request ids, sampling params) comes with `specdec_attach`."""

    def specdec_attach(self, runner: Any, spec: dict) -> None:
        """Called by the worker extension at init: the runner handle and the speculative block (as
        validated by `config.validate_spec_block`)."""
        self.runner = runner
        self.configure(spec)

    def specdec_metrics(self) -> dict:
        """Flat numbers for the trainer's metrics (`specdec_state()["metrics"]`; NeMo-RL logs them as
        `specdec/engine/<prefix>/*`): the counters since engine start, the step-cost fit
        (`step_cost/*`) and the calibrated acceptance (`acceptance/*`). Reads no drafter state a
        background thread writes."""
        p = self.metrics_prefix
        out = {f"{p}/{k}": float(v) for k, v in self.counters.items()}
        out.update({f"{p}/step_cost/{k}": float(v) for k, v in self.judge.fit.metrics().items() if v is not None})
        out.update({f"{p}/acceptance/{k}": float(v) for k, v in self.acceptance_metrics().items()})
        return out


__all__ = ["SpecdecProposer"]
