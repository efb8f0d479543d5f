"""The vLLM worker extension for NeMo-RL runs: NeMo-RL's extension composed with ours.

vLLM mixes `worker_extension_cls` into its Worker, so `self` below is the vLLM Worker. The
composite class is created at runtime, when first looked up by its FQN
(`nemo_rl_specdec.adapter.extension.SpecDecNemoRLWorkerExtension`), with the bases

    refit hooks (SpecDecHostHooks) -> NeMo-RL's VllmInternalWorkerExtension -> our SpecDecWorkerExtension

(the checkpoint-engine variant adds `SpecDecCheckpointEngineHooks` in front and uses NeMo-RL's
`VllmInternalWorkerExtensionWithCheckpointEngine`). NeMo-RL keeps loading the policy, its
`draft.*` Eagle tensors and its MTP layers exactly as before. The hooks wrap every refit RPC entry
point the NeMo-RL found has (`update_weights_via_ipc_zmq`, `update_weights_from_collective`, and
`nccl_reshard_refit` where it exists): when NeMo-RL's refit returns True, the same RPC then
refreshes the drafter (the staged rollouts for the suffix store, or the store rebuilt in the
background since generation ended; online-trained weights) and records the versions. So target
and drafter change together, between two engine steps, on v0.7.0 (which has no weight-update
lifecycle hook) and on main alike. A failed refresh raises out of the
RPC on whichever tensor-parallel rank it happens; NeMo-RL's worker turns that into a failed
refit and the run stops.

This module imports neither NeMo-RL nor vLLM at import time.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from nemo_rl_specdec.adapter import api
from nemo_rl_specdec.adapter.host import Host
from nemo_rl_specdec.update import PolicyUpdate

logger = logging.getLogger(__name__)

SPECDEC_MIXIN = "nemo_rl_specdec.engine.worker_extension.SpecDecWorkerExtension"
REFIT_RPCS = ("update_weights_via_ipc_zmq", "update_weights_from_collective", "nccl_reshard_refit")


class SpecDecHostHooks(Host):
    """Sits in front of NeMo-RL's host extension in the MRO; calls it with `super()`.

    RPCs (via `collective_rpc`): `specdec_stage_refs(refs, version)` when generation ends (the
    step's rollouts, rebuilt into the store in the background), `specdec_stage_update(update)`
    before a refit, and `specdec_report()` for metrics. Expects our engine mixin (`specdec_after_policy_weights`,
    `specdec_state`) further down the MRO. `refit_hooks(host)` adds the refit wrappers.
    """

    _specdec_pending: PolicyUpdate | None = None
    _specdec_loaded_names: list | None = None
    _specdec_loaded_drafter: list | None = None
    _specdec_last_update: dict | None = None
    _specdec_updates: int = 0

    # -- RPCs

    def specdec_stage_update(self, update: PolicyUpdate) -> bool:
        """Stage the next update's version and rollouts; the drafter is not touched here. `update` may
        arrive as the map of its fields (`PolicyUpdate.from_rpc`: NeMo-RL's async engine)."""
        try:
            update = PolicyUpdate.from_rpc(update)
        except TypeError as e:
            raise TypeError(f"specdec_stage_update: {e}") from None
        self._specdec_pending = update
        return True

    def specdec_stage_refs(self, refs: list, version: int) -> dict:
        """Fetch the step's rollouts (every engine's refs) and start rebuilding the store for `version` on
        a background thread (`specdec_stage_rollouts`); the refit to `version` installs it. Never raises:
        a failure is kept and fails that refit's drafter refresh, where on_refresh_error applies."""
        from nemo_rl_specdec.adapter.payload import resolve_rollouts

        t0 = time.perf_counter()
        try:
            out = dict(self.specdec_stage_rollouts(resolve_rollouts(refs), int(version)))
        except Exception as e:
            self.specdec_stage_failed(int(version), f"{type(e).__name__}: {e}")  # kept if staging raised earlier
            logger.exception("[specdec] staging rollouts for policy version %s failed; the refit to it fails "
                             "its drafter refresh", version)
            return {"staged_version": int(version), "error": f"{type(e).__name__}: {e}"}
        out["stage_s"] = time.perf_counter() - t0
        return out

    def specdec_report(self) -> dict:
        return {
            "state": dict(self.specdec_state() or {}),
            "last_update": self._specdec_last_update,
            "updates": self._specdec_updates,
        }

    # -- NeMo-RL hooks

    def _load_weights(self, weights):
        recording = self._specdec_loaded_names is not None  # inside a refit RPC we wrap
        if recording:  # names and drafter tensors before NeMo-RL's loader sees (and may rename) them
            from nemo_rl_specdec.engine.weights import split_policy_and_drafter

            names = [name for name, _ in weights]
            _, drafter = split_policy_and_drafter(list(weights), self._specdec_num_layers())
            drafter = [(n, t.detach().to("cpu", copy=True) if hasattr(t, "detach") else t)  # kept for a restore
                       for n, t in drafter]
        super()._load_weights(weights)
        if recording:
            assert self._specdec_loaded_names is not None and self._specdec_loaded_drafter is not None
            self._specdec_loaded_names.extend(names)
            self._specdec_loaded_drafter.extend(drafter)

    def _specdec_start_recording(self) -> None:
        self._specdec_loaded_names, self._specdec_loaded_drafter = [], []

    def _specdec_stop_recording(self) -> None:
        self._specdec_loaded_names = self._specdec_loaded_drafter = None

    # -- ours

    def _specdec_after_refit(self, route: str) -> bool:
        """NeMo-RL's refit succeeded: refresh the drafter in the same RPC. A failure raises, so it
        reaches NeMo-RL through `collective_rpc` from every tensor-parallel rank (its workers read
        only rank 0's return value, but turn an exception on any rank into a failed refit)."""
        self._specdec_finish_update(route)
        return True

    def _specdec_finish_update(self, transport: str) -> dict:
        from nemo_rl_specdec.adapter.payload import resolve_staged

        staged = self._specdec_pending
        self._specdec_pending = None
        names = list(self._specdec_loaded_names or [])
        loaded_drafter = list(self._specdec_loaded_drafter or [])
        self._specdec_stop_recording()
        if staged is None:  # refit not staged by our worker actor (e.g. a weight synchronizer)
            staged = PolicyUpdate(int((self.specdec_state() or {}).get("policy_version") or 0) + 1)
        t0 = time.perf_counter()
        # None (not staged) stays None: a rebuild-mode drafter then fails loudly instead of
        # rebuilding from nothing; an empty batch means "this step had no rollouts".
        update = resolve_staged(staged)
        fetch_s = time.perf_counter() - t0
        rollouts = update.rollouts
        try:
            report = self.specdec_after_policy_weights(update, loaded_names=names, loaded_drafter=loaded_drafter)
        except Exception:
            logger.exception(
                "[specdec] drafter refresh failed at policy version %s (transport=%s, %s rollouts); "
                "set policy.generation.speculative_decoding.on_refresh_error=disable to keep training "
                "without speculation", update.version, transport,
                "no" if rollouts is None else rollouts if isinstance(rollouts, str) else len(rollouts),
            )
            raise
        report.rollouts_fetch_s = fetch_s
        report.transport = transport
        report.rollouts = report.rollouts_added if report.staged else 0 if rollouts is None else len(rollouts)
        self._specdec_last_update = report.to_dict()  # the metrics' flat form; crosses Ray to the driver
        self._specdec_updates += 1
        return self._specdec_last_update


def _refit_wrapper(owner: type, name: str):
    def refit(self, *args, **kwargs):
        self._specdec_start_recording()
        ok = getattr(super(owner, self), name)(*args, **kwargs)
        if not ok:
            self._specdec_stop_recording()
            return ok
        return self._specdec_after_refit(name)

    refit.__name__ = name
    refit.__qualname__ = f"{owner.__qualname__}.{name}"
    refit.__doc__ = f"NeMo-RL's `{name}`, then the drafter refresh in the same RPC."
    return refit


def _get_drafter_model(self) -> Any:
    from nemo_rl_specdec.engine.weights import find_drafter_model

    model = super(type(self)._specdec_hooks, self)._get_drafter_model()
    return model if model is not None else find_drafter_model(self)


def refit_hooks(host_cls: type) -> type:
    """SpecDecHostHooks plus a wrapper for each refit RPC `host_cls` has (and its drafter lookup,
    widened to vLLM's model runner v2, where it has one)."""
    hooks: Any = type("SpecDecRefitHooks", (SpecDecHostHooks,), {"__module__": __name__})
    hooks._specdec_hooks = hooks
    for name in REFIT_RPCS:
        if hasattr(host_cls, name):
            setattr(hooks, name, _refit_wrapper(hooks, name))
    if hasattr(host_cls, "_get_drafter_model"):
        hooks._get_drafter_model = _get_drafter_model
    return hooks


class SpecDecCheckpointEngineHooks(Host):
    """The checkpoint-engine refit (nixl, `module:Class`; NeMo-RL main) loads through `_load_weights`
    in its own RPC: finish our update after it returns."""

    async def _update_weights_from_checkpoint_engine_async(self) -> bool:
        self._specdec_start_recording()
        ok = await super()._update_weights_from_checkpoint_engine_async()
        if not ok:
            self._specdec_stop_recording()
            return ok
        return self._specdec_after_refit("checkpoint_engine")


COMPOSITES = {
    "SpecDecNemoRLWorkerExtension": (api.HOST_EXTENSION, ()),
    "SpecDecNemoRLWorkerExtensionWithCheckpointEngine": (api.HOST_EXTENSION_CKPT, (SpecDecCheckpointEngineHooks,)),
}


def build_extension(name: str, host_cls: type, specdec_cls: type, extra: tuple = ()) -> type:
    """`name(*extra, refit hooks, host_cls, specdec_cls)`, importable as `<this module>.<name>`."""
    return type(name, (*extra, refit_hooks(host_cls), host_cls, specdec_cls), {
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
