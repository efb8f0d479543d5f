"""The hybrid drafter's lockstep: one update refreshes both halves (the model part's weights, the
history store from the step's rollouts), one `refresh.mode` governs both, and a failure in either
half fails the update without advancing the drafter's version."""
from types import SimpleNamespace

import pytest

pytest.importorskip("arctic_inference.suffix_decoding._C")

from nemo_rl_specdec.config.run import validate_spec_block  # noqa: E402
from nemo_rl_specdec.drafters.hybrid import HybridProposer  # noqa: E402
from nemo_rl_specdec.engine.worker_extension import SpecDecWorkerExtension  # noqa: E402
from nemo_rl_specdec.lockstep import DrafterRefreshError  # noqa: E402
from nemo_rl_specdec.update import PolicyUpdate  # noqa: E402

ROLLOUTS = [{"problem_id": "p0", "prompt_token_ids": [1, 2, 3], "token_ids": [4, 5, 6, 7, 4, 5, 6, 7],
             "policy_version": 1}]
HEAD = [("fc.weight", object())]


def _worker(mode: str, load=None):
    """A worker whose engine runs the hybrid: `specdec_beside` is a real HybridProposer, whose history
    half is returned (its DASProposer); the model half's load is `load` (records what it was given)."""
    spec = validate_spec_block({"enabled": True, "drafter": "hybrid", "eagle3": {"model": "/ckpt/eagle3"},
                                "refresh": {"mode": mode}})
    vc = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4),
                         model_config=SimpleNamespace(max_model_len=256))
    runner = SimpleNamespace(drafter=None, model=None, vllm_config=vc, input_batch=SimpleNamespace(req_ids=[]),
                             requests={})
    runner.specdec_beside = HybridProposer(runner, spec)
    history = runner.specdec_beside.history
    w = SpecDecWorkerExtension()
    w.model_runner = runner
    st = w._specdec()
    st.spec = spec
    st.mode = mode
    loaded: list = []

    def load_model(items, version):
        if load is not None:
            load(items, version)
        loaded.append(version)
        return len(items)

    w._specdec_load_drafter = load_model
    return w, history, loaded


@pytest.mark.parametrize("mode", ["online", "refit"])
def test_one_update_refreshes_both_halves(mode):
    w, history, loaded = _worker(mode)
    report = w._specdec_refresh_drafter(PolicyUpdate(1, rollouts=ROLLOUTS), HEAD)
    assert loaded == [1] and report.drafter_tensors_applied == 1  # the model half's weights
    assert report.rollouts_added == 1 and history.version == 1  # the history half's store
    st = w._specdec()
    assert st.drafter_version == st.drafter_built_from == st.policy_version == 1


def test_a_failure_of_the_model_half_fails_the_update_and_leaves_the_store():
    def broken(items, version):
        raise DrafterRefreshError(f"drafter weights for version {version} did not land")

    w, history, _ = _worker("online", load=broken)
    with pytest.raises(DrafterRefreshError, match="did not land"):
        w._specdec_refresh_drafter(PolicyUpdate(1, rollouts=ROLLOUTS), HEAD)
    assert history.version == 0 and w._specdec().drafter_version == 0


def test_a_failure_of_the_history_half_fails_the_update_and_keeps_the_drafter_version():
    w, history, loaded = _worker("online")
    with pytest.raises(DrafterRefreshError, match="rejected its input"):  # the store refuses malformed rollouts
        w._specdec_refresh_drafter(PolicyUpdate(1, rollouts=[{"problem_id": "p0"}]), HEAD)
    assert loaded == [1]  # the model half had loaded ...
    assert w._specdec().drafter_version == 0 and history.version == 0  # ... but the update did not land


def test_an_update_without_rollouts_fails_the_history_half():
    w, _, _ = _worker("refit")
    with pytest.raises(DrafterRefreshError, match="carries no rollouts"):
        w._specdec_refresh_drafter(PolicyUpdate(1), HEAD)
    assert w._specdec().drafter_version == 0


def test_frozen_refreshes_neither_half():
    w, history, loaded = _worker("frozen")
    w._specdec_drafter_fp = lambda: ""  # no drafter module here: its fingerprint stays the empty one
    w._specdec_refresh_drafter(PolicyUpdate(1, rollouts=ROLLOUTS), [])
    assert loaded == [] and history.version == 0


def test_a_resume_carries_the_history_half_and_a_drafter_without_a_store_refuses_it():
    """NeMo-RL's checkpoint carries the hybrid engine's history half (DAS's window, by `CarriesState`
    on the store `vllm_compat.rollout_store` finds): a fresh engine restores it, versions included."""
    w, history, _ = _worker("online")
    w._specdec_refresh_drafter(PolicyUpdate(1, rollouts=ROLLOUTS), HEAD)
    blob = w.specdec_export_state()
    fresh, fresh_history, _ = _worker("online")
    out = fresh.specdec_restore_state(blob)
    assert out["restored_entries"] == 1 and fresh_history.version == history.version == 1
    assert fresh_history.store.stats() == history.store.stats()
    assert fresh._specdec().drafter_version == 1
    listless, _, _ = _worker("online")
    listless.model_runner.specdec_beside = None  # the model drafter alone: no proposer of ours keeps state
    with pytest.raises(DrafterRefreshError, match="keeps none"):
        listless.specdec_restore_state(blob)
