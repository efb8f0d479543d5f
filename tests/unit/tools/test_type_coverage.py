"""The type gate's reach: `tools/type_coverage.py` counts the lines of the files `[tool.mypy]` names,
and mypy checks at least 60% of the package's lines."""
from __future__ import annotations

import textwrap
from pathlib import Path

from tools.type_coverage import coverage

ROOT = Path(__file__).resolve().parents[3]


def test_coverage_counts_the_named_files_and_folders(tmp_path):
    pkg = tmp_path / "nemo_rl_specdec"
    (pkg / "core").mkdir(parents=True)
    (pkg / "other").mkdir()
    (pkg / "top.py").write_text("a = 1\nb = 2\n")
    (pkg / "core" / "x.py").write_text("x = 1\n" * 5)
    (pkg / "core" / "y.py").write_text("y = 1\n" * 3)
    (pkg / "other" / "z.py").write_text("z = 1\n" * 10)
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent("""
        [tool.mypy]
        files = ["nemo_rl_specdec/top.py", "nemo_rl_specdec/core/"]
    """))
    covered, total, per_area = coverage(tmp_path / "pyproject.toml")
    assert (covered, total) == (10, 20)
    assert per_area == {"(top level)": 2, "core": 8}


def test_mypy_checks_most_of_the_package():
    covered, total, _ = coverage(ROOT / "pyproject.toml")
    assert covered / total >= 0.60, f"mypy checks {covered} of {total} package lines"
