"""The share of the package's lines that mypy checks: the files named by `[tool.mypy] files` in
pyproject.toml (a folder counts with every .py below it) over every .py line of the package.

    python -m tools.type_coverage [--pyproject pyproject.toml]

Lines are physical lines (blank lines and comments included), as `wc -l` counts them.
"""
from __future__ import annotations

import argparse
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the TOML reader mypy itself reads pyproject.toml with
    import tomli as tomllib


def _lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def coverage(pyproject: Path) -> tuple[int, int, dict[str, int]]:
    """(lines checked, package lines, lines checked per top-level area of the package)."""
    root = pyproject.parent
    package = root / "nemo_rl_specdec"
    entries = tomllib.loads(pyproject.read_text())["tool"]["mypy"]["files"]
    checked: set[Path] = set()
    for entry in entries:
        p = (root / entry).resolve()
        checked.update(p.rglob("*.py") if p.is_dir() else [p])
    every = sorted(p.resolve() for p in package.rglob("*.py"))
    per_area: dict[str, int] = {}
    for p in every:
        if p in checked:
            parts = p.relative_to(package.resolve()).parts
            area = parts[0] if len(parts) > 1 else "(top level)"
            per_area[area] = per_area.get(area, 0) + _lines(p)
    return sum(per_area.values()), sum(_lines(p) for p in every), per_area


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pyproject", default=str(Path(__file__).resolve().parents[1] / "pyproject.toml"))
    args = ap.parse_args(argv)
    covered, total, per_area = coverage(Path(args.pyproject))
    for area, n in sorted(per_area.items()):
        print(f"  {area:<14} {n:>6,}")
    print(f"mypy checks {covered:,} of {total:,} package lines ({100 * covered / total:.1f}%)")


if __name__ == "__main__":
    main()
