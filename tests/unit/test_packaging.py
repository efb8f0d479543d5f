"""The built wheel is the package: it carries every module, every bundled config and asset, and its
console script validates a bundled run file and simulates a bundled scenario from a fresh venv with
no checkout around.

The wheel is built offline from a copy of the sources pyproject.toml packages (no build isolation: the
running interpreter's setuptools builds it). The fresh venv takes its third-party packages from the
running interpreter's site-packages through a `.pth` line, which adds the folder without running its
own `.pth` files, so the checkout's editable install stays out of it.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import nemo_rl_specdec
from nemo_rl_specdec.resources import asset_path, configs_dir

CHECKOUT = Path(nemo_rl_specdec.__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "nemo_rl_specdec", "configs")

pytestmark = pytest.mark.skipif(not (CHECKOUT / "pyproject.toml").is_file(),
                                reason="runs from a source checkout (it builds the wheel from it)")


def _run(cmd: list, cwd: Path, env: dict | None = None) -> str:
    res = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"{' '.join(map(str, cmd))} exited {res.returncode}:\n{res.stdout}\n{res.stderr}"
    return res.stdout


def _files(root: Path, pattern: str = "*") -> set:
    return {p.relative_to(root).as_posix() for p in root.rglob(pattern)
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        s = CHECKOUT / name
        if s.is_dir():
            shutil.copytree(s, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(s, src / name)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
          "-w", tmp / "dist", src], cwd=tmp)
    (whl,) = (tmp / "dist").glob("nemo_rl_specdec-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv outside the checkout with the wheel installed."""
    env_dir = tmp_path_factory.mktemp("venv") / "v"
    _run([sys.executable, "-m", "venv", "--without-pip", env_dir], cwd=env_dir.parent)
    py = env_dir / "bin" / "python"
    site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=env_dir).strip())
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "specdec_test_deps.pth").write_text("".join(f"{d}\n" for d in sorted(deps)))
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    _run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", "-q", wheel],
         cwd=env_dir.parent, env=clean)  # a checkout on PYTHONPATH would look installed already
    return env_dir


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> tuple[Path, dict]:
    """A working directory outside the checkout, and an environment that does not point into it."""
    cwd = tmp_path_factory.mktemp("elsewhere")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return cwd, env


def test_the_wheel_carries_every_module_config_and_asset(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    pkg = CHECKOUT / "nemo_rl_specdec"
    want = ({f"nemo_rl_specdec/{f}" for f in _files(pkg)}
            | {f"nemo_rl_specdec/configs/{f}" for f in _files(configs_dir())})
    assert any(n.startswith("nemo_rl_specdec/assets/tiny/policy/") for n in want)
    assert "nemo_rl_specdec/configs/tiny_cpu.yaml" in want and "nemo_rl_specdec/configs/sim/cpu_tiny.yaml" in want
    assert sorted(want - names) == []


def test_the_wheel_carries_the_user_tools_not_the_development_tools(wheel):
    """What users run stays in the package (`nemo_rl_specdec.tools`: time_forward, train_eagle3 and
    its loop); the development tools of the top-level tools/ (asset trainers, device and cost checks,
    the type gate's reach, the pinned-vLLM environments) are not in the wheel."""
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"nemo_rl_specdec/tools/{m}.py" for m in ("time_forward", "train_eagle3", "draft_training")} <= names
    dev = sorted(p.stem for p in (CHECKOUT / "tools").glob("*.py") if p.stem != "__init__")
    assert {"device_check", "train_tiny", "type_coverage"} <= set(dev)
    assert [n for n in names if n.startswith("tools/")] == []
    assert [n for n in names if n.endswith(".py") and Path(n).stem in dev] == []


def _read_by_scenarios() -> set:
    """The data files bundled scenarios and hardware profiles read (`hardware.roofline.measured`,
    `hybrid.bench_json`, a profile's `draft_layers`), relative to configs/."""
    import yaml

    read = set()
    for path in [*configs_dir().joinpath("sim").rglob("*.yaml"), *configs_dir().joinpath("hardware").glob("*.yaml")]:
        raw = yaml.safe_load(path.read_text()) or {}
        roofline = (raw.get("hardware") or {}).get("roofline") or {}
        layers = raw.get("draft_layers") or {}
        for data in (roofline.get("measured"), (raw.get("hybrid") or {}).get("bench_json"), *layers.get("measured", []),
                     layers.get("timed_on")):
            if isinstance(data, str):
                read.add(f"sim/{data}")
    return read


def test_the_wheel_carries_no_measurement_archive(wheel):
    """Besides code and assets, the wheel holds run files, scenarios and the data files a bundled
    scenario reads; measurement archives (bench results, fits, rounds of a cross-check) live in the
    checkout's benchmarks/, outside the package."""
    names = zipfile.ZipFile(wheel).namelist()
    prefix = "nemo_rl_specdec/configs/"
    data = {n[len(prefix):] for n in names if n.startswith(prefix) and not n.endswith((".yaml", ".py"))}
    read = _read_by_scenarios()
    assert {"sim/measured/h100_qwen3_8b_forward.json", "sim/measured/h200_qwen3_8b_forward.json"} <= read
    assert sorted(data - read) == []
    assert not [n for n in names if n.startswith("benchmarks/") or re.search(r"/round\d+/", n)]
    assert (CHECKOUT / "benchmarks" / "cpu_crosscheck").is_dir()   # the archive is kept, outside the package


def test_the_installed_package_is_the_wheel_not_the_checkout(venv, outside):
    cwd, env = outside
    out = _run([venv / "bin" / "python", "-c", "import nemo_rl_specdec, nemo_rl_specdec.resources as r; "
                "print(nemo_rl_specdec.__file__); print(r.configs_dir()); print(r.asset_path('tiny'))"], cwd, env)
    files = [Path(line) for line in out.splitlines()]
    assert all(f.is_relative_to(venv) for f in files), files
    assert files[1].name == "configs" and files[1].parent == files[0].parent
    assert (files[2] / "policy" / "model.safetensors").is_file()
    assert not (cwd / "configs").exists() and not Path(files[0]).is_relative_to(CHECKOUT)


def test_validate_a_bundled_run_file_from_the_wheel(venv, outside):
    cwd, env = outside
    out = json.loads(_run([venv / "bin" / "nemo-rl-specdec", "validate", "tiny_cpu.yaml",
                           "policy.generation.speculative_decoding.drafter=draft_model"], cwd, env))
    assert Path(out["source"]).is_relative_to(venv)
    draft = Path(out["vllm_speculative_config"]["model"])
    assert draft.is_relative_to(venv) and draft.parts[-2:] == asset_path("tiny", "draft").parts[-2:]
    assert (draft / "model.safetensors").is_file()


def test_simulate_a_bundled_scenario_from_the_wheel(venv, outside):
    cwd, env = outside
    out = _run([venv / "bin" / "nemo-rl-specdec", "simulate", "nvidia_qwen3_8b_rlzero", "--json", cwd / "r.json"],
               cwd, env)
    assert "scenario nvidia_qwen3_8b_rlzero" in out and "calibration" in out
    assert json.loads((cwd / "r.json").read_text())["rollout_speedup"] > 1
    out = _run([venv / "bin" / "nemo-rl-specdec", "simulate", "sim/predictions/s3_nvidia_rlthink_k5.yaml"], cwd, env)
    assert "scenario s3_nvidia_rlthink_k5" in out
