"""Where scenarios are found: a scenario file by path or by the name of a bundled one (next to the
scenario that names it, then in configs/sim/ and configs/), and the scenarios of a folder
(`simulate --all`)."""
from __future__ import annotations

from pathlib import Path

from nemo_rl_specdec.config.schema import short
from nemo_rl_specdec.resources import config_lookups, config_path
from nemo_rl_specdec.sim.scenario.limits import ScenarioError

SIM_CONFIGS = config_path("sim")


def first_line(e: Exception) -> str:
    """An error's first line (a YAML or JSON reader's message can run on for pages)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def is_path(path: Path, kind: str) -> bool:
    """path.is_file() / is_dir(), False for a path the OS cannot look up (too long, NUL byte)."""
    try:
        return path.is_file() if kind == "file" else path.is_dir()
    except (OSError, ValueError):
        return False


def resolve_scenario_path(path: str, relative_to: Path | None = None) -> Path:
    """A scenario path; bare names (`nvidia_qwen3_8b_rlzero.yaml`, with or without .yaml,
    `predictions/s1_nvidia_rlthink_k3`, `configs/sim/cpu_tiny.yaml`) are looked up next to
    `relative_to`, then in the bundled configs/sim/ and configs/ (resources.py)."""
    if not isinstance(path, str) or not path.strip() or "\0" in path:
        raise ScenarioError(f"scenario file {short(path)!r}: allowed: a path or the name of a bundled scenario")
    p = Path(path)
    tries = [p]
    if relative_to is not None:
        tries.append(relative_to / p)
    tries += config_lookups(p, "sim")
    if p.suffix not in (".yaml", ".yml"):
        tries += [t.with_name(t.name + ".yaml") for t in list(tries) if t.name]
    for t in tries:
        if is_path(t, "file"):
            return t
    if is_path(p, "dir"):
        raise ScenarioError(f"scenario file {path!r} is a directory; allowed: a scenario file (simulate --all DIR "
                            "simulates every *.yaml of a directory)")
    raise ScenarioError(f"scenario file {short(path)!r} not found (looked in ., {SIM_CONFIGS})")


def scenario_files(directory: str) -> list[Path]:
    """The `*.yaml` scenarios of a folder (`simulate --all`); a folder not found from the working
    directory (`configs/sim/predictions`, `predictions`) is looked up in the bundled configs/."""
    if "\0" not in directory:
        for d in [Path(directory), *config_lookups(directory, "sim")]:
            if is_path(d, "dir"):
                try:
                    files = sorted(f for f in d.glob("*.yaml") if is_path(f, "file"))
                except OSError as e:
                    raise ScenarioError(f"--all {directory!r}: cannot list the directory ({e.strerror})") from None
                if files:
                    return files
                break
    raise ScenarioError(f"--all {short(directory)!r}: not a directory with *.yaml scenarios (looked in ., "
                        f"{SIM_CONFIGS})")
