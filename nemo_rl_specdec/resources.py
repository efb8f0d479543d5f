"""Where the package's files are: the bundled example run files and simulator scenarios
(`configs/`), the tiny models (`assets/`), and the one cache directory for what it makes at run time.
Every module that needs one asks here.

Both are found through `importlib.resources` from the package itself. An installed wheel carries
them as package data, `nemo_rl_specdec/configs/` and `nemo_rl_specdec/assets/` (pyproject.toml maps
the checkout's top-level `configs/` there). Run from a source checkout (an editable install, or the
checkout on PYTHONPATH), `configs/` is the checkout's own, beside the package.
"""
from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path

PACKAGE = "nemo_rl_specdec"
CACHE_ENV = "NEMO_RL_SPECDEC_CACHE"
DEFAULT_CACHE = Path("~/.cache/nemo_rl_specdec")


def package_dir() -> Path:
    """The directory the running `nemo_rl_specdec` was imported from."""
    return Path(str(files(PACKAGE)))


def configs_dir() -> Path:
    """The bundled `configs/`: package data in a wheel; the checkout's top-level configs/ in a checkout."""
    pkg = package_dir()
    for d in (pkg / "configs", pkg.parent / "configs"):
        if d.is_dir():
            return d
    raise FileNotFoundError(f"the bundled configs/ is missing: looked in {pkg / 'configs'} (a wheel install) and "
                            f"{pkg.parent / 'configs'} (a source checkout); reinstall nemo-rl-specdec")


def config_path(*parts: str) -> Path:
    """A file or folder below the bundled configs/ (`config_path("sim", "predictions")`)."""
    return configs_dir().joinpath(*parts)


def config_lookups(name: str | Path, *folders: str) -> list[Path]:
    """Where a bundled file or folder called `name` may lie, in order: below each of configs/'s
    `folders` (`"sim"`), then below configs/ itself. A leading `configs/` (as a checkout spells it,
    `configs/tiny_cpu.yaml`) is dropped, so the same spelling works from an installed wheel."""
    p = Path(name)
    if p.is_absolute():
        return []
    if p.parts[:1] == ("configs",):
        p = Path(*p.parts[1:])
    root = configs_dir()
    return [root / folder / p for folder in (*folders, "")]


def asset_path(*parts: str) -> Path:
    """A file or folder below the bundled assets/ (`asset_path("tiny", "policy")`), the target of
    `${specdec_asset:tiny/policy}` in a run file."""
    return package_dir().joinpath("assets", *parts)


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """The cache root: `override`, else $NEMO_RL_SPECDEC_CACHE, else ~/.cache/nemo_rl_specdec.

    The only place the package reads the home directory: converted models (models/) and the
    import link for NeMo-RL's worker venvs (adapter/translate.py) live below it, and `make test`
    points it at a fresh directory (tests/conftest.py)."""
    raw = override if override is not None else (os.environ.get(CACHE_ENV) or DEFAULT_CACHE)
    return Path(raw).expanduser().resolve()
