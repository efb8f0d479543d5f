"""bench --suite drafters: its run-file knob is checked before any engine starts."""
import pytest

from nemo_rl_specdec.bench.drafters import _repeats
from nemo_rl_specdec.config import ConfigError, load_run_config


def test_repeats_default_and_override():
    assert _repeats(load_run_config("configs/tiny_cpu.yaml", [])) == 1
    assert _repeats(load_run_config("configs/tiny_cpu.yaml", ["bench.drafters.repeats=3"])) == 3


@pytest.mark.parametrize("bad", ["0", "true", "1.5", "three"])
def test_bad_repeats_names_the_key(bad):
    with pytest.raises(ConfigError, match=r"bench\.drafters\.repeats: got .*allowed: an int >= 1"):
        _repeats(load_run_config("configs/tiny_cpu.yaml", [f"bench.drafters.repeats={bad}"]))
