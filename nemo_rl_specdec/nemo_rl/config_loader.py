"""Compose a NeMo-RL run file without importing NeMo-RL, so the block is checked before launch.

Same inheritance rules as NeMo-RL's `load_config` (a `defaults:` entry or list, relative to the
file that names it, parents merged first, `_override_: true` replaces a section instead of
merging), plus one addition: a `defaults` entry starting with `nemo_rl:` is resolved against the
NeMo-RL checkout (`nemo_rl:examples/configs/grpo_math_1B.yaml`), so our example configs can
inherit NeMo-RL's own base config wherever NeMo-RL is installed.

Command-line overrides use NeMo-RL's (Hydra) spelling: `a.b=v`, `+a.b=v`, `++a.b=v`, `~a.b`.
Values are parsed as YAML. NeMo-RL re-parses the same overrides with Hydra when it starts.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Optional, Union

import yaml

from nemo_rl_specdec.config import ConfigError

NEMO_RL_PREFIX = "nemo_rl:"


class Composed:
    """A composed (unresolved) run config, and what could not be composed."""

    def __init__(self, cfg: Any, source: Path, missing_parents: list[str], uses_nemo_rl_parent: bool):
        self.cfg = cfg  # omegaconf.DictConfig, interpolations unresolved
        self.source = source
        self.missing_parents = missing_parents
        self.uses_nemo_rl_parent = uses_nemo_rl_parent

    def resolved(self) -> dict:
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        register_resolvers()
        try:
            return OmegaConf.to_container(self.cfg, resolve=True)
        except OmegaConfBaseException as e:
            hint = ""
            if self.missing_parents:
                hint = f" (parent configs not found: {self.missing_parents}; is NeMo-RL installed / NEMO_RL_ROOT set?)"
            raise ConfigError(f"{self.source}: {e}{hint}") from None

    def to_yaml(self) -> str:
        from omegaconf import OmegaConf

        return OmegaConf.to_yaml(self.cfg)


def register_resolvers() -> None:
    """The arithmetic resolvers NeMo-RL registers (`add`, `mul`, `div`, `max`) and ours."""
    from omegaconf import OmegaConf

    from nemo_rl_specdec import config as _config

    register_ours = getattr(_config, "_register_resolvers", None)  # ${specdec_asset:...}
    if register_ours is not None:
        register_ours()
    for name, fn in (("add", lambda a, b: a + b), ("mul", lambda a, b: a * b),
                     ("div", lambda a, b: a / b), ("max", lambda a, b: max(a, b))):
        if not OmegaConf.has_resolver(name):
            with warnings.catch_warnings():  # newer omegaconf renames it; NeMo-RL uses this name too
                warnings.simplefilter("ignore", UserWarning)
                OmegaConf.register_new_resolver(name, fn)


def _parent_path(entry: str, base_dir: Path, nemo_rl_root: Optional[Path]) -> Optional[Path]:
    if entry.startswith(NEMO_RL_PREFIX):
        if nemo_rl_root is None:
            return None
        return nemo_rl_root / entry[len(NEMO_RL_PREFIX):]
    p = Path(entry)
    return p if p.is_absolute() else base_dir / p


def _merge(base: Any, child: Any) -> Any:
    from omegaconf import DictConfig, OmegaConf

    for key in list(child.keys()):
        if OmegaConf.is_missing(child, key):
            continue
        val = child[key]
        if isinstance(val, DictConfig) and val.get("_override_", False):
            val.pop("_override_")
            if key in base:
                base.pop(key)
    return OmegaConf.merge(base, child)


def _load(path: Path, nemo_rl_root: Optional[Path], missing: list[str], flags: dict) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if not path.exists():
        raise ConfigError(f"run file {str(path)!r} not found")
    cfg = OmegaConf.load(path)
    if not isinstance(cfg, DictConfig):
        raise ConfigError(f"{path}: a run file must be a mapping")
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
        base = _merge(base, _load(parent, nemo_rl_root, missing, flags))
    return _merge(base, cfg)


def _parse_value(text: str) -> Any:
    if "${" in text:
        return text
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def apply_overrides(cfg: Any, overrides: list[str]) -> Any:
    from omegaconf import OmegaConf

    for ov in overrides:
        if ov.startswith("~"):
            key = ov[1:].split("=", 1)[0]
            parent_key, _, leaf = key.rpartition(".")
            node = OmegaConf.select(cfg, parent_key) if parent_key else cfg
            if node is not None and leaf in node:
                node.pop(leaf)
            continue
        if "=" not in ov:
            raise ConfigError(f"override {ov!r}: expected key=value (NeMo-RL/Hydra style, e.g. ++a.b=1)")
        key, value = ov.split("=", 1)
        key = key.lstrip("+")
        OmegaConf.update(cfg, key, _parse_value(value), merge=True, force_add=True)
    return cfg


def compose(path: Union[str, Path], overrides: list[str] = (), nemo_rl_root: Optional[Path] = None) -> Composed:
    """Load `path` with inheritance, apply overrides; parents that cannot be found are reported, not fatal."""
    from omegaconf.errors import OmegaConfBaseException

    path = Path(path)
    missing: list[str] = []
    flags: dict = {}
    try:
        cfg = _load(path, nemo_rl_root, missing, flags)
        cfg = apply_overrides(cfg, list(overrides))
    except OmegaConfBaseException as e:
        raise ConfigError(f"{path}: {e}") from None
    return Composed(cfg, path, missing, bool(flags.get("nemo_rl_parent")))
