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


def dotted_get(d: Any, dotted: str, default: Any = None) -> Any:
    """The value at `a.b.c` in nested dicts, or `default` where a part is missing or not a mapping."""
    node = d
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


class Strict(BaseModel):
    """Unknown keys are errors; `true` is not an int and "8" is not a number inside our block."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)


def k_by_batch_size_table(v: Any) -> list[tuple[int, int, int]] | None:
    """A `k_by_batch_size` schedule (`[[batch_lo, batch_hi, k], ...]`, vLLM's
    `num_speculative_tokens_per_batch_size`) as a list of tuples, checked: integer triples, ranges
    ascending and not overlapping from batch size 1, k >= 0 (0 turns speculation off). A ValueError
    names the entry at fault. Shared by the run config and the simulator's scenarios."""
    if v is None:
        return v
    if not isinstance(v, (list, tuple)):
        raise ValueError("a list of [batch_lo, batch_hi, k] entries")
    out = []
    for i, e in enumerate(v):
        if not (isinstance(e, (list, tuple)) and len(e) == 3
                and all(isinstance(x, int) and not isinstance(x, bool) for x in e)):
            raise ValueError(f"entry {i} ({e!r}): each entry is [batch_lo, batch_hi, k] of integers")
        out.append(tuple(e))
    prev_hi = 0
    for i, (lo, hi, k) in enumerate(out):
        if lo < 1 or hi < lo:
            raise ValueError(f"entry {i} ({lo}, {hi}, {k}): need 1 <= lo <= hi")
        if lo <= prev_hi:
            raise ValueError(f"entry {i} ({lo}, {hi}, {k}): ranges must be ascending and not overlap")
        if k < 0:
            raise ValueError(f"entry {i} ({lo}, {hi}, {k}): k must be >= 0 (0 turns speculation off)")
        prev_hi = hi
    if out and out[0][0] != 1:
        raise ValueError(f"entry 0 {out[0]}: the first range must start at batch size 1 (vLLM rejects "
                         "a schedule that leaves small batches without a k)")
    return out


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
