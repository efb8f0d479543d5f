"""YAML files with command-line overrides: read (OmegaConf), override, resolve. The run files
(config/run.py), the simulator's scenarios (sim/scenario/) and the NeMo-RL run files
(config/loader.py) all load through here; each adds only its own inheritance rule.

Overrides use NeMo-RL's (Hydra) spelling:
- `a.b=v` sets a key, `+a.b=v` adds one, `++a.b=v` adds or sets one. All three merge here (a
  mapping value merges into the mapping it replaces); the caller's schema still rejects unknown keys.
- `~a.b` deletes a key, which must exist.
Values are parsed as YAML by OmegaConf (`1e-4` is a float, `[1, 2]` a list); `${...}` interpolations are
kept until `resolve`. Every error is a ConfigError (or the caller's subclass) naming the file, and the
override when one is at fault.

Resolvers available in every file: `${specdec_asset:tiny/policy}` (a bundled asset, resources.py),
`${specdec_model:smollm2}` (a real model's checkpoint directory; made where it is first used, never
here: models/), and
NeMo-RL's arithmetic helpers `add`, `mul`, `div`, `max`.

They are registered with OmegaConf only while this module resolves a file, and removed afterwards, so
none is left behind in a process that goes on to run NeMo-RL: NeMo-RL registers its own (v0.7.0 has no
`add`), and a run file it cannot resolve must fail under our launcher as it does under its own. A name
already registered (by NeMo-RL) is used as it is and left in place.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nemo_rl_specdec.config.schema import ConfigError

OVERRIDE_FORMS = "key=value, +key=value, ++key=value or ~key"


def _resolve_model(name: str) -> str:
    from nemo_rl_specdec.models import resolve

    return resolve(name)


def _asset(name: str) -> str:
    from nemo_rl_specdec.resources import asset_path

    return str(asset_path(name))


RESOLVERS = {
    "specdec_asset": _asset,
    "specdec_model": _resolve_model,
    # the arithmetic NeMo-RL registers under the same names
    "add": lambda a, b: a + b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "max": lambda a, b: max(a, b),
}


def one_line(e: Exception) -> str:
    """An OmegaConf error as one line: its message, and the key it names."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    key = getattr(e, "full_key", None)
    return f"{msg} (key {key})" if key and str(key) not in msg else msg


@contextmanager
def resolvers() -> Iterator[None]:
    """RESOLVERS registered with OmegaConf for the duration of the block; a name already registered (e.g.
    by NeMo-RL) is kept and left registered, and the ones registered here are removed on exit."""
    from omegaconf import OmegaConf

    # OmegaConf 2.4 deprecates register_new_resolver in favour of register_resolver (same call)
    register: Callable[..., Any] = getattr(OmegaConf, "register_resolver", None) or OmegaConf.register_new_resolver
    added = []
    try:
        for name, fn in RESOLVERS.items():
            if not OmegaConf.has_resolver(name):
                register(name, fn)
                added.append(name)
        yield
    finally:
        for name in added:
            OmegaConf.clear_resolver(name)


def read(path: str | Path, error: type[ConfigError] = ConfigError, what: str = "YAML file") -> Any:
    """The file as an (unresolved) omegaconf DictConfig; unreadable YAML or a top level that is not
    a mapping is an `error` naming the file."""
    import yaml
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg = OmegaConf.load(path)
    except FileNotFoundError:
        raise error(f"{what} {str(path)!r} not found") from None
    except IsADirectoryError:
        raise error(f"{path}: is a directory; allowed: a {what} (YAML)") from None
    except UnicodeDecodeError as e:
        raise error(f"{path}: not a text file (byte {e.start} is not UTF-8); allowed: a {what} (YAML)") from None
    except RecursionError:
        raise error(f"{path}: nested too deep to read (interpolations or structures); allowed: a {what} of "
                    "ordinary depth") from None
    except (OSError, OmegaConfBaseException, yaml.YAMLError) as e:
        raise error(f"{path}: cannot read the {what}: {' '.join(str(e).split())}") from None
    if not isinstance(cfg, DictConfig):
        raise error(f"{path}: a {what} must be a mapping of keys (got a {type(cfg).__name__})")
    return cfg


def parse_override(override: str, source: str | Path, error: type[ConfigError] = ConfigError,
                   example: str = "a.b=1") -> tuple[str, str, str | None]:
    """(op, key, value text) of one override: op is "set" (`=`, `+`, `++`) or "delete" (`~`)."""
    bad = error(f"override {override!r} of {source}: expected {OVERRIDE_FORMS} (e.g. {example})")
    if override.startswith("~"):
        key = override[1:]
        if not key.strip() or "=" in key or key.startswith(("+", "~")):
            raise bad
        return "delete", key, None
    body = override[2:] if override.startswith("++") else override[1:] if override.startswith("+") else override
    key, eq, value = body.partition("=")
    if not eq or not key.strip() or key.startswith(("+", "~")):
        raise bad
    if value.startswith("="):
        raise error(f"override {override!r} of {source}: the value starts with '=' (did you mean {key}={value[1:]}?); "
                    f"expected {OVERRIDE_FORMS}")
    return "set", key, value


def _scalar_above(cfg: Any, key: str) -> tuple[str, Any] | None:
    """The first key above `key` that holds a value other than a mapping or list (so `key` cannot
    go below it), and that value; an interpolation is resolved to tell (`${specdec_asset:...}` is a
    path, a string). None when there is none, or when an interpolation cannot be resolved yet."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    node, parts = cfg, key.split(".")
    for i, part in enumerate(parts[:-1]):
        if not OmegaConf.is_dict(node) or part not in node:
            return None
        try:
            with resolvers():
                node = node[part]
        except OmegaConfBaseException:  # an interpolation that resolves only once the run is composed
            return None
        if node is not None and not OmegaConf.is_config(node):
            return ".".join(parts[: i + 1]), node
    return None


def _clash(base: Any, child: Any, path: str = "") -> tuple[str, str, str] | None:
    """The first key where `child` puts a list over a mapping or the reverse (which OmegaConf cannot
    merge): (key, what the child has, what it would replace); None when there is none."""
    from omegaconf import OmegaConf

    if not (OmegaConf.is_dict(base) and OmegaConf.is_dict(child)):
        return None
    for key in child:
        if key not in base or OmegaConf.is_interpolation(child, key) or OmegaConf.is_interpolation(base, key):
            continue
        b, c = base._get_node(key), child._get_node(key)
        kinds = ["a mapping" if OmegaConf.is_dict(x) else "a list" if OmegaConf.is_list(x) else None for x in (c, b)]
        where = f"{path}.{key}" if path else str(key)
        if None not in kinds and kinds[0] != kinds[1]:
            return where, kinds[0], kinds[1]  # type: ignore[return-value]
        found = _clash(b, c, where)
        if found:
            return found
    return None


def merge(base: Any, child: Any, source: str | Path, error: type[ConfigError] = ConfigError,
          parent: str = "the file it extends") -> Any:
    """`child` merged over `base` (OmegaConf.merge); a key where one holds a list and the other a
    mapping is an `error` naming the key, as is any other merge failure."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    found = _clash(base, child)
    if found:
        key, has, replaces = found
        raise error(f"{source}: {key}: got {has}; allowed: {replaces}, as in {parent} (a list and a mapping "
                    "do not merge)")
    try:
        return OmegaConf.merge(base, child)
    except (OmegaConfBaseException, TypeError) as e:
        raise error(f"{source}: cannot merge it over {parent}: {one_line(e)}") from None


def apply_overrides(cfg: Any, overrides: Sequence[str], source: str | Path,
                    error: type[ConfigError] = ConfigError, example: str = "a.b=1") -> Any:
    """Apply `overrides` in order to `cfg` (in place; also returned)."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for ov in overrides:
        op, key, value = parse_override(ov, source, error, example)
        try:
            if op == "delete":
                parent_key, _, leaf = key.rpartition(".")
                node = OmegaConf.select(cfg, parent_key) if parent_key else cfg
                if not OmegaConf.is_dict(node) or leaf not in node:
                    raise error(f"override {ov!r} of {source}: {key} does not exist, so it cannot be deleted")
                node.pop(leaf)
            else:
                above = _scalar_above(cfg, key)
                if above is not None:
                    raise error(f"override {ov!r} of {source}: {above[0]} is a value ({above[1]!r}), not a mapping "
                                "with keys below it")
                cfg.merge_with_dotlist([f"{key}={value}"])
        except (OmegaConfBaseException, yaml.YAMLError, ValueError) as e:
            if isinstance(e, ConfigError):
                raise
            why = " ".join(str(e).split()) if isinstance(e, yaml.YAMLError) else one_line(e)
            raise error(f"override {ov!r} of {source}: {why[:300]}") from None
    return cfg


def resolve(cfg: Any, source: str | Path, error: type[ConfigError] = ConfigError, hint: str = "") -> Any:
    """`cfg` as plain Python with every `${...}` resolved (a mapping for a mapping, a list for a list:
    the caller checks the shape); a failing interpolation is an `error` naming the file (and `hint`,
    appended)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        with resolvers():
            return OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:
        if "RecursionError" in str(e):
            raise error(f"{source}: interpolations (${{...}}) nest too deep to resolve (at key "
                        f"{getattr(e, 'full_key', None)}); allowed: chains of a few hundred at most") from None
        raise error(f"{source}: {one_line(e)}{hint}") from None
    except RecursionError:
        raise error(f"{source}: interpolations (${{...}}) nest too deep to resolve; allowed: chains of a few "
                    "hundred at most") from None


def load(path: str | Path, overrides: Sequence[str] = (), error: type[ConfigError] = ConfigError,
         what: str = "YAML file", example: str = "a.b=1") -> dict:
    """read + apply_overrides + resolve: the file with its overrides as plain Python."""
    return resolve(apply_overrides(read(path, error, what), overrides, path, error, example), path, error)
