"""The strict pydantic base every block of our YAML schema derives from, and the errors that
name a key path. Bottom-level: config.py and each drafter's sub-block build on it."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """Invalid run configuration. The message names the dotted key path, value, and what is allowed."""


class PathError(ValueError):
    """Raised inside validators when the offending key is not the one being validated; config.py
    turns it into a ConfigError on the full dotted path."""

    def __init__(self, rel_path: str, value: Any, allowed: str):
        self.rel_path, self.value, self.allowed = rel_path, value, allowed
        super().__init__(f"{rel_path}={value!r}: expected {allowed}")


class Strict(BaseModel):
    """Unknown keys are errors; `true` is not an int and "8" is not a number inside our block."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)


def int_setting(value: Any, path: str, lo: int, hi: int) -> int:
    """A setting that must be an integer in [lo, hi] (`true`, 2.5 and "8" are not): the value, or a
    ConfigError naming `path`."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"{path}: got {value!r}; allowed: an integer from {lo} to {hi}")
    return value


def float_setting(value: Any, path: str, lo: float, hi: float, *, lo_open: bool = False) -> float:
    """A setting that must be a finite number in [lo, hi] ((lo, hi] with `lo_open`)."""
    import math

    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
          and (lo < value if lo_open else lo <= value) and value <= hi)
    if not ok:
        raise ConfigError(f"{path}: got {value!r}; allowed: a finite number {'>' if lo_open else '>='} {lo} "
                          f"and <= {hi}")
    return float(value)
