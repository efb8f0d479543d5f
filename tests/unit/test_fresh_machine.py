"""What a fresh machine has: no cache from earlier work, and no optional extra.

- The test session's caches are its own (tests/conftest.py), so a pass here is a pass on a new
  machine: nothing is found that an earlier run converted or downloaded.
- The package reads the home directory in one place only, `resources.cache_dir()`, which the
  environment overrides; a new default read of `~/...` elsewhere fails here.
- Every bundled run file loads, validates and composes with an empty cache and without the
  `smollm2` extra, and converts or writes nothing while doing so.

The full proof is the one in docs/manual.md (Tests): a fresh clone, `HOME=$(mktemp -d)`, `make test`.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

from nemo_rl_specdec import cli, resources
from nemo_rl_specdec.config import loader as config_loader
from nemo_rl_specdec.config.run import load_run_config
from nemo_rl_specdec.models import smollm2

PKG = Path(resources.__file__).resolve().parent
PRIVATE = {"NEMO_RL_SPECDEC_CACHE", "HF_HOME", "VLLM_CACHE_ROOT"}


def test_the_session_sees_no_cache_of_earlier_work(private_cache_root):
    home_cache = resources.DEFAULT_CACHE.expanduser().resolve()
    for var in PRIVATE - ({"NEMO_RL_SPECDEC_CACHE"} if os.environ.get("SPECDEC_TEST_CACHE") else set()):
        assert Path(os.environ[var]).is_relative_to(private_cache_root), (var, os.environ[var])
    if not os.environ.get("SPECDEC_TEST_CACHE"):
        assert resources.cache_dir() != home_cache and resources.cache_dir().is_relative_to(private_cache_root)


def _home_reads(path: Path) -> list[str]:
    """`file:line: what` for each default read of the home directory in `path`: Path.home(), and
    string constants (not docstrings) that start with `~/` or `~user/`, name a `.cache` directory,
    or are the HOME / XDG_* variables."""
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "home":
            out.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            v = node.value
            if re.match(r"~\w*/", v) or ".cache" in v or v == "HOME" or v.startswith("XDG_"):
                out.append(f"{path.name}:{node.lineno}: {v[:60]!r}")
    return out


def test_the_package_reads_the_home_directory_only_through_cache_dir():
    reads = {str(p.relative_to(PKG)): _home_reads(p) for p in sorted(PKG.rglob("*.py"))}
    assert reads["resources.py"], "the scan finds nothing, not even cache_dir's default: it is broken"
    elsewhere = [r for name, rs in reads.items() if name != "resources.py" for r in rs]
    assert elsewhere == [], "home-directory state read outside resources.cache_dir():\n" + "\n".join(elsewhere)


def test_the_scan_finds_a_home_read(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('"""~/.cache in a docstring is prose."""\nfrom pathlib import Path\n'
                 'A = Path.home() / "x"\nB = "~/.cache/thing"\nC = os.environ["HOME"]\nD = "~a.b"\n')
    assert sorted(r.split(": ")[0] for r in _home_reads(f)) == ["m.py:3", "m.py:4", "m.py:5"]


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty cache, the smollm2 extra hidden, and any conversion step an error."""
    cache = tmp_path / "cache"
    monkeypatch.setenv(resources.CACHE_ENV, str(cache))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n in ("gguf", "accelerate") else real(n, *a))

    def never(*a, **k):
        raise AssertionError("loading a run file must not download or convert a model")

    for step in ("download_wheel", "extract_gguf", "convert", "ensure"):
        monkeypatch.setattr(smollm2, step, never)
    return cache


RUN_FILES = sorted(p.name for p in resources.configs_dir().glob("*.yaml"))


def test_there_are_run_files_to_check():
    assert {"tiny_cpu.yaml", "smollm2_cpu.yaml", "qwen3_8b_suffix.yaml"} <= set(RUN_FILES)


@pytest.mark.parametrize("name", RUN_FILES)
def test_a_run_file_loads_validates_and_composes_with_an_empty_cache_and_no_extra(fresh, name, capsys):
    if "defaults:" not in resources.config_path(name).read_text():  # a NeMo-RL run is only composed
        assert load_run_config(name).raw["policy"]["model_name"]
    assert cli.main(["validate", name]) == 0
    assert json.loads(capsys.readouterr().out)["source"].endswith(name)
    composed = config_loader.compose(name)  # as the NeMo-RL launcher reads it
    if not composed.missing_parents:
        assert composed.resolved()["policy"]["model_name"]
    assert not fresh.exists(), f"reading {name} wrote {sorted(fresh.rglob('*'))}"
