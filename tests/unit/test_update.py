"""update.py: the typed policy update and its report, as they cross Ray and collective_rpc."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from nemo_rl_specdec.lockstep import STAGED_ROLLOUTS
from nemo_rl_specdec.update import PolicyUpdate, UpdateError, UpdateReport


def test_policy_update_defaults_and_ints():
    u = PolicyUpdate(np.int64(3), {"w": 1})
    assert (u.version, u.policy, u.drafter_weights, u.rollouts) == (3, {"w": 1}, None, None)
    assert type(u.version) is int and u.drafter_version is None
    assert u.refresh_drafter is True and u.drafter_checkpoint is False
    assert PolicyUpdate(2, drafter_version=np.int32(1)).drafter_version == 1


@pytest.mark.parametrize("bad", [-1, "3", 1.5, True, None])
def test_policy_update_refuses_a_bad_version(bad):
    with pytest.raises(UpdateError, match=r"PolicyUpdate.version: got .*; allowed: an int policy version >= 0"):
        PolicyUpdate(bad)


def test_policy_update_refuses_a_bad_drafter_version():
    with pytest.raises(UpdateError, match="PolicyUpdate.drafter_version"):
        PolicyUpdate(1, drafter_version=-2)


def test_policy_update_pickles_and_copies_with_changes():
    u = PolicyUpdate(4, rollouts=STAGED_ROLLOUTS, refresh_drafter=False)
    assert pickle.loads(pickle.dumps(u)) == u
    v = u.with_(rollouts=[])
    assert v.rollouts == [] and v.version == 4 and u.rollouts == STAGED_ROLLOUTS
    with pytest.raises(AttributeError):
        u.version = 5  # frozen: one update is one value


def test_update_report_flat_form_puts_the_fields_over_the_engine_state():
    r = UpdateReport(policy_version=2, mode="rebuild", drafter_refreshed=True, rollouts_added=3,
                     state={"policy_version": 2, "drafter_version": 2, "disabled": False, "mode": "rebuild"})
    assert r.drafter_version == 2 and not r.disabled and r.disabled_reason == ""
    d = r.to_dict()
    assert d == {"policy_version": 2, "mode": "rebuild", "drafter_version": 2, "disabled": False,
                 "drafter_refreshed": True, "drafter_tensors_applied": 0, "rollouts_added": 3,
                 "policy_tensors_applied": 0, "refresh_s": 0.0, "prefix_cache_reset": False}
    r.staged, r.in_flight_requests, r.transport = True, 4, "ipc"
    assert {"staged": True, "in_flight_requests": 4, "transport": "ipc"}.items() <= r.to_dict().items()
    assert pickle.loads(pickle.dumps(r)) == r
