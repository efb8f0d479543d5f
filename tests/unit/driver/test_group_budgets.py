"""EngineGroup refuses a per-call budget its engines cannot apply: `adaptive` is chosen inside the
engines at every step, so it is fixed when they start (no engine is started here)."""
from types import SimpleNamespace

import pytest

from nemo_rl_specdec.config.run import load_run_config
from nemo_rl_specdec.driver.group import EngineGroup

B = "policy.generation.speculative_decoding"


def _group(budget):
    cfg = load_run_config("configs/tiny_cpu.yaml", [f"{B}.drafter=suffix", f"{B}.scheduling.budget={budget}"])
    return SimpleNamespace(_check_alive=lambda: None, spec=cfg.spec, budget_via="per_request")


@pytest.mark.parametrize("started,asked", [("uniform", "adaptive"), ("das", "adaptive"), ("adaptive", "uniform"),
                                           ("adaptive", "das")])
def test_adaptive_is_fixed_when_the_engines_start(started, asked):
    with pytest.raises(ValueError, match=rf"budget='{asked}' on a group started with scheduling.budget='{started}'"):
        EngineGroup.generate(_group(started), [], budget=asked)
