"""The vLLM worker extension for NeMo-RL runs: NeMo-RL's extension composed with ours.

vLLM mixes `worker_extension_cls` into its Worker, so `self` below is the vLLM Worker. The
composite class is created at runtime, when first looked up by its FQN
(`nemo_rl_specdec.nemo_rl.extension.SpecDecNemoRLWorkerExtension`), with the bases

    SpecDecHostHooks -> NeMo-RL's VllmInternalWorkerExtension -> our SpecDecWorkerExtension

(the checkpoint-engine variant adds `SpecDecCheckpointEngineHooks` in front and uses NeMo-RL's
`VllmInternalWorkerExtensionWithCheckpointEngine`). NeMo-RL keeps loading the policy, its
`draft.*` Eagle tensors and its MTP layers exactly as before; the hooks add, inside the same
refit RPC, after NeMo-RL's own finalize step: `specdec_after_policy_weights(...)`, which refreshes
the drafter (rollouts for the suffix store, online-trained weights) and records the versions.
So target and drafter change together, between two engine steps, even with in-flight updates.

This module imports neither NeMo-RL nor vLLM at import time.
"""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Any, Optional

from nemo_rl_specdec.nemo_rl import api

logger = logging.getLogger(__name__)

SPECDEC_MIXIN = "nemo_rl_specdec.engine.worker_extension.SpecDecWorkerExtension"


def find_drafter_model(worker: Any) -> Optional[Any]:
    """The live drafter module, wherever this vLLM version keeps it.

    vLLM >= 0.32 has `worker.get_draft_model()`; the V1 runner keeps it at
    `model_runner.drafter.model`; model runner v2 (the default for Eagle/MTP in vLLM 0.25.1,
    NeMo-RL's pin) at `model_runner.speculator.model`, which NeMo-RL 0.6.0 does not look at.
    """
    getter = getattr(type(worker), "get_draft_model", None)
    if callable(getter):
        model = getter(worker)
        if model is not None:
            return model
    runner = getattr(worker, "model_runner", None)
    for attr in ("drafter", "speculator"):
        owner = getattr(runner, attr, None)
        model = getattr(owner, "model", None)
        if model is not None and callable(getattr(model, "load_weights", None)):
            return model
    return None


class SpecDecHostHooks:
    """Sits in front of NeMo-RL's host extension in the MRO; calls it with `super()`.

    RPCs (via `collective_rpc`): `specdec_stage_update(payload)` before a refit, and
    `specdec_report()` for metrics. Expects our engine mixin (`specdec_after_policy_weights`,
    `specdec_state`) further down the MRO.
    """

    _specdec_pending: Optional[dict] = None
    _specdec_loaded_names: Optional[list] = None
    _specdec_last_update: Optional[dict] = None
    _specdec_updates: int = 0

    # -- RPCs

    def specdec_stage_update(self, payload: dict) -> bool:
        """Stage the next update's version and rollouts; the drafter is not touched here."""
        if not isinstance(payload, dict):
            raise TypeError(f"specdec_stage_update expects a dict payload, got {type(payload).__name__}")
        self._specdec_pending = dict(payload)
        return True

    def specdec_report(self) -> dict:
        return {
            "state": dict(self.specdec_state() or {}),
            "last_update": self._specdec_last_update,
            "updates": self._specdec_updates,
        }

    # -- NeMo-RL hooks

    def _load_weights(self, weights):
        super()._load_weights(weights)
        if self._specdec_loaded_names is not None:
            self._specdec_loaded_names.extend(name for name, _ in weights)

    @contextmanager
    def _weight_update_lifecycle(self, transport):
        self._specdec_loaded_names = []
        with super()._weight_update_lifecycle(transport) as host_finalize:

            def finalize() -> None:
                host_finalize()
                self._specdec_finish_update(str(transport))

            yield finalize

    def _get_drafter_model(self) -> Any:
        model = super()._get_drafter_model()
        return model if model is not None else find_drafter_model(self)

    # -- ours

    def _specdec_finish_update(self, transport: str) -> dict:
        pending = self._specdec_pending or {}
        self._specdec_pending = None
        names = list(self._specdec_loaded_names or [])
        self._specdec_loaded_names = None
        version = pending.get("version")
        if version is None:  # refit not staged by our worker actor (e.g. a weight synchronizer)
            version = int((self.specdec_state() or {}).get("policy_version") or 0) + 1
        # Always a list (possibly empty): a rebuild-mode drafter needs "no new rollouts" to be explicit.
        rollouts = list(pending.get("rollouts") or [])
        t0 = time.perf_counter()
        try:
            report = self.specdec_after_policy_weights(
                version=int(version), loaded_names=names,
                drafter_weights=pending.get("drafter_weights"), rollouts=rollouts,
            )
        except Exception:
            logger.exception(
                "[specdec] drafter refresh failed at policy version %s (transport=%s, %d rollouts); "
                "set policy.generation.speculative_decoding.on_refresh_error=disable to keep training "
                "without speculation", version, transport, len(rollouts),
            )
            raise
        report = dict(report or {})
        report.setdefault("refresh_s", time.perf_counter() - t0)
        report["transport"] = transport
        report["rollouts"] = len(rollouts)
        self._specdec_last_update = report
        self._specdec_updates += 1
        return report


class SpecDecCheckpointEngineHooks:
    """The checkpoint-engine refit (nixl, `module:Class`) loads through `_load_weights` but has no
    lifecycle finalize step; finish our update after it returns."""

    async def _update_weights_from_checkpoint_engine_async(self) -> bool:
        self._specdec_loaded_names = []
        ok = await super()._update_weights_from_checkpoint_engine_async()
        if ok:
            self._specdec_finish_update("checkpoint_engine")
        return ok


COMPOSITES = {
    "SpecDecNemoRLWorkerExtension": (api.HOST_EXTENSION, ()),
    "SpecDecNemoRLWorkerExtensionWithCheckpointEngine": (api.HOST_EXTENSION_CKPT, (SpecDecCheckpointEngineHooks,)),
}


def build_extension(name: str, host_cls: type, specdec_cls: type, extra: tuple = ()) -> type:
    """`name(*extra, SpecDecHostHooks, host_cls, specdec_cls)`, importable as `<this module>.<name>`."""
    return type(name, (*extra, SpecDecHostHooks, host_cls, specdec_cls), {
        "__module__": __name__,
        "__qualname__": name,
        "__doc__": f"{host_cls.__name__} with nemo-rl-specdec's drafter refresh and versions (built at runtime).",
    })


def __getattr__(name: str) -> Any:
    if name in COMPOSITES:
        host_fqn, extra = COMPOSITES[name]
        cls = build_extension(name, api.resolve(host_fqn), api.resolve(SPECDEC_MIXIN), extra)
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
