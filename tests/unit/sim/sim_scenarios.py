"""Scenario dicts for the simulator tests: a base mapping with dotted-key overrides."""
from __future__ import annotations

import copy

from nemo_rl_specdec.sim.scenario import validate_scenario


def build(base: dict, overrides: dict):
    """Validate `base` with `overrides` (dotted keys -> values) applied to a copy."""
    raw = copy.deepcopy(base)
    for key, value in overrides.items():
        node = raw
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return validate_scenario(raw)
