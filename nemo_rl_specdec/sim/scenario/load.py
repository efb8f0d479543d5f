"""Loading a scenario: the file and what it `extends`, `key=value` overrides, interpolation
(config/yaml_loader.py), a `hardware_profile` merged in, and validation with one line per key at fault."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from nemo_rl_specdec.config import yaml_loader
from nemo_rl_specdec.config.schema import format_errors, short
from nemo_rl_specdec.sim.scenario.comparison import RENAMED_SWEEP_KEYS
from nemo_rl_specdec.sim.scenario.files import first_line, resolve_scenario_path
from nemo_rl_specdec.sim.scenario.limits import ScenarioError
from nemo_rl_specdec.sim.scenario.profile import with_profile
from nemo_rl_specdec.sim.scenario.schema import Scenario
from nemo_rl_specdec.sim.scenario.speculation import RENAMED_SPECULATION_KEYS


def validate_scenario(raw: Any, source: str | Path | None = None) -> Scenario:
    """The scenario of a resolved mapping; a ScenarioError naming `source` (the file) and each key at
    fault, one per line, otherwise."""
    where = f"{source}: " if source is not None else ""
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}scenario: got {type(raw).__name__}; allowed: a mapping of scenario keys")
    keys = [str(k) for k in raw]
    if not raw:
        raise ScenarioError(f"{where}the scenario is empty; allowed: a mapping with at least hardware: and "
                            "acceptance: (docs/simulator.md)")
    if "policy" in raw and "hardware" not in raw:
        raise ScenarioError(f"{where}a run file (it has a policy: block), not a simulator scenario; allowed: a "
                            "scenario with hardware: and acceptance: (configs/sim/); run files are for validate, "
                            "generate, demo and bench")
    unknown = [k for k in keys if k not in Scenario.model_fields and k != "hardware_profile"]
    if unknown and not {"hardware", "acceptance"} & set(keys):
        raise ScenarioError(f"{where}not a simulator scenario: no hardware: or acceptance:, and keys a scenario does "
                            f"not have ({short(unknown)}); allowed: a mapping with hardware: and acceptance: "
                            "(docs/simulator.md)")
    lines = [f"scenario.{block}.{k}: renamed to {block}.{renames[k]} (the run config's name)"
             for block, renames in (("speculation", RENAMED_SPECULATION_KEYS), ("sweep", RENAMED_SWEEP_KEYS))
             if isinstance(raw.get(block), dict) for k in raw[block] if k in renames]
    if lines:
        more = f" (and {len(lines) - 1} more below)" if len(lines) > 1 else ""
        raise ScenarioError(where + lines[0] + more + "".join(f"\n  {line}" for line in lines[1:]))
    if "hardware_profile" in raw:
        raw = with_profile(raw, where)
    try:
        sc = Scenario.model_validate(raw)
    except ValidationError as e:
        lines = format_errors(e, Scenario, "scenario", "docs/simulator.md")
        more = f" (and {len(lines) - 1} more below)" if len(lines) > 1 else ""
        raise ScenarioError(where + lines[0] + more + "".join(f"\n  {line}" for line in lines[1:])) from None
    if source is not None:
        sc._source = str(source)
    return sc


def _load_tree(path: Path, seen: tuple[Path, ...] = ()):
    from omegaconf.errors import OmegaConfBaseException

    if path.resolve() in seen:
        raise ScenarioError(f"{path}: `extends` forms a cycle ({' -> '.join(str(s) for s in seen)})")
    cfg = yaml_loader.read(path, ScenarioError, what="scenario")
    if "extends" not in cfg:
        return cfg
    try:
        parent = cfg.pop("extends")
    except OmegaConfBaseException as e:
        raise ScenarioError(f"{path}: extends: {first_line(e)}; allowed: a scenario file name") from None
    if parent is None:
        return cfg
    if not isinstance(parent, str):
        raise ScenarioError(f"{path}: extends: got {short(parent)!r}; allowed: a scenario file name (looked up next "
                            "to the file, then in configs/sim/)")
    base = _load_tree(resolve_scenario_path(parent, path.parent), seen + (path.resolve(),))
    return yaml_loader.merge(base, cfg, path, ScenarioError, parent=f"the scenario it extends ({parent})")


def load_scenario(path: str, overrides: list[str] | tuple[str, ...] = ()) -> Scenario:
    """Load a scenario YAML (and what it `extends`), apply overrides, resolve (config/yaml_loader.py), validate.
    Every error is a ScenarioError naming the file."""
    p = resolve_scenario_path(path)
    try:
        cfg = yaml_loader.apply_overrides(_load_tree(p), overrides, p, ScenarioError,
                                          example="speculation.num_speculative_tokens=4")
        raw = yaml_loader.resolve(cfg, p, ScenarioError)
    except RecursionError:
        raise ScenarioError(f"{p}: nested too deeply to read (mappings, lists or `extends` hundreds of levels "
                            "deep); allowed: a scenario as in configs/sim/") from None
    return validate_scenario(raw, p)
