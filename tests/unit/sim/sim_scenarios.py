"""Scenario dicts for the simulator tests: a base mapping with dotted-key overrides."""
from __future__ import annotations

import copy

from nemo_rl_specdec.sim.scenario import validate_scenario

# a small scenario on the linear cost model: 2 engines, 32 rollouts of about 400 tokens, 3 RL steps
SMALL = {
    "hardware": {"c_base_s": 0.01, "c_tok_s": 1e-4, "c_ctx_s": 1e-7, "max_num_seqs": 64},
    "cluster": {"num_engines": 2},
    "drafter": {"name": "suffix", "per_request_s": 1e-5},
    "acceptance": {"alpha": 0.7},
    "speculation": {"num_speculative_tokens": 4},
    "workload": {"num_prompts": 8, "generations_per_prompt": 4, "prompt_len": 32,
                 "lengths": {"median": 400, "sigma_between": 0.7, "sigma_within": 0.3, "max_len": 2048}},
    "rl": {"num_steps": 3, "logprob": {"fixed_s": 1.0}, "train": {"fixed_s": 2.0, "per_ktoken_s": 0.01},
           "refit_s": 0.5},
}


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
