"""The one door for run files: every command (`validate`, `generate`, `demo`, `bench`) and the
NeMo-RL launcher read a run file through `compose`, without importing NeMo-RL.

Same inheritance rules as NeMo-RL's `load_config` (a `defaults:` entry or list, relative to the
file that names it, parents merged first, `_override_: true` replaces a section instead of
merging), plus one addition: a `defaults` entry starting with `nemo_rl:` is resolved against the
NeMo-RL checkout (`nemo_rl:examples/configs/grpo_math_1B.yaml`), so our example configs can
inherit NeMo-RL's own base config wherever NeMo-RL is installed.

Reading, command-line overrides (NeMo-RL's Hydra spelling: `a.b=v`, `+a.b=v`, `++a.b=v`, `~a.b`) and
interpolation are config/yaml_loader.py's. NeMo-RL re-parses the same overrides with Hydra when it starts.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from nemo_rl_specdec.config import yaml_loader
from nemo_rl_specdec.config.schema import ConfigError
from nemo_rl_specdec.resources import config_lookups, configs_dir

NEMO_RL_PREFIX = "nemo_rl:"


def find_nemo_rl_root(env: Any = None) -> Path | None:
    """The NeMo-RL checkout (the directory holding `nemo_rl/` and `examples/`), without importing it:
    `NEMO_RL_ROOT`, else where an installed `nemo_rl` package lives."""
    env = os.environ if env is None else env
    if env.get("NEMO_RL_ROOT"):
        return Path(env["NEMO_RL_ROOT"]).expanduser().resolve()
    spec = importlib.util.find_spec("nemo_rl")
    if spec is None or spec.origin is None:  # absent, or a directory without NeMo-RL's __init__.py
        return None
    return Path(spec.origin).resolve().parent.parent


def resolve_config_path(path: str | None) -> Path:
    """A run file path; names not found from the working directory (`tiny_cpu.yaml`,
    `configs/tiny_cpu.yaml`) are looked up in the bundled configs/ (resources.py)."""
    if path is None:
        path = "tiny_cpu.yaml"
    p = Path(path)
    if p.exists():
        return p
    for candidate in config_lookups(p):
        if candidate.is_file():
            return candidate
    raise ConfigError(f"run file {path!r} not found (looked in ., {configs_dir()})")


class Composed:
    """A composed (unresolved) run config, and what could not be composed."""

    def __init__(self, cfg: Any, source: Path, missing_parents: list[str], uses_nemo_rl_parent: bool,
                 file_keys: dict[str, set] | None = None):
        self.cfg = cfg  # omegaconf.DictConfig, interpolations unresolved
        self.source = source
        self.missing_parents = missing_parents
        self.uses_nemo_rl_parent = uses_nemo_rl_parent
        # of a run file with `defaults:` parents (a NeMo-RL run file): the keys its files define, by dotted
        # section (`grpo`, `policy.generation`, ...), before any override; None for a self-contained file
        self.file_keys = file_keys

    def resolved(self) -> dict:
        hint = ""
        if self.missing_parents:
            hint = f" (parent configs not found: {self.missing_parents}; is NeMo-RL installed / NEMO_RL_ROOT set?)"
        return yaml_loader.resolve(self.cfg, self.source, hint=hint)

    def to_yaml(self) -> str:
        from omegaconf import OmegaConf

        return OmegaConf.to_yaml(self.cfg)


def _parent_path(entry: str, base_dir: Path, nemo_rl_root: Path | None) -> Path | None:
    if entry.startswith(NEMO_RL_PREFIX):
        if nemo_rl_root is None:
            return None
        return nemo_rl_root / entry[len(NEMO_RL_PREFIX):]
    p = Path(entry)
    return p if p.is_absolute() else base_dir / p


def _merge(base: Any, child: Any, source: Path) -> Any:
    from omegaconf import DictConfig, OmegaConf

    for key in list(child.keys()):
        if OmegaConf.is_missing(child, key):
            continue
        val = child[key]
        if isinstance(val, DictConfig) and val.get("_override_", False):
            val.pop("_override_")
            if key in base:
                base.pop(key)
    return yaml_loader.merge(base, child, source, parent="its defaults: parents")


def _load(path: Path, nemo_rl_root: Path | None, missing: list[str], flags: dict) -> Any:
    from omegaconf import ListConfig, OmegaConf

    cfg = yaml_loader.read(path, what="run file")
    if "defaults" not in cfg:
        return cfg
    defaults = cfg.pop("defaults")
    if isinstance(defaults, ListConfig):
        entries = [str(d) for d in defaults]
    else:
        entries = [str(defaults)]
    base = OmegaConf.create({})
    for entry in entries:
        if entry.startswith(NEMO_RL_PREFIX):
            flags["nemo_rl_parent"] = True
        parent = _parent_path(entry, path.parent, nemo_rl_root)
        if parent is None or not parent.exists():
            missing.append(entry if parent is None else str(parent))
            continue
        base = _merge(base, _load(parent, nemo_rl_root, missing, flags), path)
    flags["parents"] = True
    return _merge(base, cfg, path)


def _section_keys(cfg: Any, prefix: str = "") -> dict[str, set]:
    """{dotted section: its keys} of every mapping in `cfg` (the top level is "")."""
    from omegaconf import OmegaConf

    out = {prefix: set(map(str, cfg.keys()))}
    for k in cfg.keys():
        if OmegaConf.is_dict(cfg._get_node(k)):
            out.update(_section_keys(cfg._get_node(k), f"{prefix}.{k}" if prefix else str(k)))
    return out


def compose(path: str | Path | None, overrides: list[str] | tuple[str, ...] = (),
            nemo_rl_root: Path | None = None) -> Composed:
    """Load `path` with inheritance, apply overrides; parents that cannot be found are reported, not fatal.
    A path not found from the working directory is looked up in the bundled configs/ (`qwen3_8b_suffix.yaml`)."""
    from omegaconf.errors import OmegaConfBaseException

    path = resolve_config_path(None if path is None else str(path))
    missing: list[str] = []
    flags: dict = {}
    try:
        cfg = _load(path, nemo_rl_root, missing, flags)
    except OmegaConfBaseException as e:
        raise ConfigError(f"{path}: {e}") from None
    file_keys = _section_keys(cfg) if flags.get("parents") else None
    cfg = yaml_loader.apply_overrides(cfg, list(overrides), path, example="++grpo.max_num_steps=100")
    return Composed(cfg, path, missing, bool(flags.get("nemo_rl_parent")), file_keys)
