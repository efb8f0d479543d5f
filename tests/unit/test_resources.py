"""resources.py finds the bundled configs/ and assets/ from the package: here, the checkout's own."""
from __future__ import annotations

from pathlib import Path

import pytest

import nemo_rl_specdec
from nemo_rl_specdec import resources

CHECKOUT = Path(nemo_rl_specdec.__file__).resolve().parents[1]


def test_a_checkout_uses_its_own_configs_and_assets():
    assert resources.package_dir().resolve() == CHECKOUT / "nemo_rl_specdec"
    assert resources.configs_dir().resolve() == CHECKOUT / "configs"
    assert resources.config_path("sim", "cpu_tiny.yaml").is_file()
    assert (resources.asset_path("tiny", "policy") / "config.json").is_file()


def test_lookups_try_the_folders_then_configs_and_drop_a_leading_configs():
    root = resources.configs_dir()
    assert resources.config_lookups("x.yaml", "sim") == [root / "sim" / "x.yaml", root / "x.yaml"]
    assert resources.config_lookups("configs/sim/x.yaml") == [root / "sim" / "x.yaml"]
    assert resources.config_lookups("/abs/x.yaml", "sim") == []


def test_a_package_without_configs_says_where_it_looked(tmp_path, monkeypatch):
    (tmp_path / "nemo_rl_specdec").mkdir()
    monkeypatch.setattr(resources, "package_dir", lambda: tmp_path / "nemo_rl_specdec")
    with pytest.raises(FileNotFoundError, match=r"the bundled configs/ is missing: looked in .*nemo_rl_specdec/configs"
                                                r" \(a wheel install\) and .*/configs \(a source checkout\)"):
        resources.configs_dir()
