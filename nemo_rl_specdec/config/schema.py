"""The strict pydantic base every block of our YAML schema derives from, and the errors that
name a key path: `format_errors` turns a pydantic ValidationError into one line per key at fault,
`<prefix>.<dotted key>: got <value>; allowed: <what is>`, for the run config (config/run.py), the
simulator's scenarios (sim/scenario/) and the hardware profiles (cost/profile.py) alike.
Bottom-level: config/run.py, the cost blocks and each drafter's sub-block build on it."""
from __future__ import annotations

import difflib
import functools
import operator
import types
import typing
from typing import Annotated, Any, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError


class ConfigError(ValueError):
    """Invalid run configuration. The message names the dotted key path, value, and what is allowed."""


class PathError(ValueError):
    """Raised inside a model's validator when the offending key is not the one being validated:
    `rel_path` is the key's dotted path relative to that model (`format_errors` puts the model's own
    location in front of it)."""

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
    """Unknown keys are errors; `true` is not an int, "8" is not a number, and NaN and infinity are
    not numbers inside our blocks."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False)


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


# the field type of a `k_by_batch_size` key (the run config's and the scenarios' scheduling blocks):
# the table checked by `k_by_batch_size_table`
KByBatchSize = Annotated[list[tuple[int, int, int]] | None, BeforeValidator(k_by_batch_size_table)]


def schedule_lookup(schedule: typing.Sequence[typing.Sequence[int]] | None, batch: int, default_k: int) -> int:
    """k for a batch size under a [(lo, hi, k), ...] schedule, with vLLM's semantics: gaps and
    batches past the last range carry the previous k forward; capped at default_k."""
    if not schedule:
        return default_k
    k = default_k
    for lo, hi, kk in schedule:
        if batch < lo:
            break
        k = kk
        if batch <= hi:
            break
    return min(k, default_k)


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


# --------------------------------------------------------------------------- error messages

class _Cut(str):
    """A value's repr cut short for an error message; shown as is."""

    def __repr__(self) -> str:
        return str(self)


def cut(text: str, limit: int) -> str:
    """`text`, or its first `limit` - 3 characters and "..." when it is longer than `limit` (the
    package's one cutter of text for messages, errors and reports)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def short(value: Any, limit: int = 80) -> Any:
    """`value`, or its repr cut to `limit` characters when that is longer (error messages quote
    values, and a whole block or a long list would bury the message)."""
    text = repr(value)
    return value if len(text) <= limit else _Cut(cut(text, limit))


def _num(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def _unwrap(ann: Any) -> tuple[Any, bool]:
    """(the annotation inside Optional[...], whether it was Optional)."""
    args = typing.get_args(ann)
    if typing.get_origin(ann) in (Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else functools.reduce(operator.or_, rest)), True
    return ann, False


def _field_at(root: type, loc: tuple) -> tuple[Any | None, Any]:
    """(the field named by a validation error's `loc`, the model that holds it); (None, model) when
    `loc` ends inside a list or mapping or does not name a field, with the model reached last."""
    ann: Any = root
    info: Any = None
    holder: Any = root
    for part in loc:
        ann, _ = _unwrap(ann)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            holder, info = ann, ann.model_fields.get(part) if isinstance(part, str) else None
            if info is None:
                return None, holder
            ann = info.annotation
            continue
        origin, args = typing.get_origin(ann), typing.get_args(ann)
        if origin in (list, tuple) and isinstance(part, int) and args:
            ann, info = args[0], None
        elif origin is dict and args:
            ann, info = args[1], None
        else:
            return None, holder
    return info, holder


def _range(info: Any) -> str | None:
    """What a numeric field allows, from its bounds: "an integer from 1 to 64", "a finite number > 0
    and <= 1", with its unit, "or null" when it may be null; None for other fields."""
    ann, optional = _unwrap(info.annotation)
    if ann not in (int, float):
        return None
    lo = hi = None
    lo_op, hi_op = ">=", "<="
    for m in info.metadata:             # pydantic's Gt / Ge / Lt / Le constraints
        if getattr(m, "gt", None) is not None:
            lo, lo_op = m.gt, ">"
        elif getattr(m, "ge", None) is not None:
            lo = m.ge
        elif getattr(m, "lt", None) is not None:
            hi, hi_op = m.lt, "<"
        elif getattr(m, "le", None) is not None:
            hi = m.le
    kind = "an integer" if ann is int else "a finite number"
    if lo is not None and hi is not None and lo_op == ">=" and hi_op == "<=":
        text = f"{kind} from {_num(lo)} to {_num(hi)}"
    else:
        bounds = [f"{op} {_num(v)}" for op, v in ((lo_op, lo), (hi_op, hi)) if v is not None]
        text = f"{kind} {' and '.join(bounds)}" if bounds else kind
    unit = (info.json_schema_extra or {}).get("unit") if isinstance(info.json_schema_extra, dict) else None
    return text + (f" ({unit})" if unit else "") + (" or null" if optional else "")


# the errors of a number out of range or of the wrong type: the field's bounds say what is allowed
_NUMERIC_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "int_type", "float_type",
                   "int_from_float", "finite_number", "int_parsing", "float_parsing", "int_parsing_size"}


def _got(value: Any, error_type: str) -> str:
    """The value at fault, with its type where the type is what is wrong (`true`, "3", 2.5)."""
    what = {bool: "a boolean", str: "a string", float: "a float"}.get(type(value))
    typed = error_type in _NUMERIC_ERRORS or error_type.startswith("bool")
    return f"{short(value)!r}" + (f" ({what})" if what and typed else "")


def format_errors(err: ValidationError, root: type[BaseModel], prefix: str, docs: str) -> list[str]:
    """One line per key at fault: `<prefix>.<dotted key>: got <value>; allowed: <what is>`. A number's
    allowed range is read from its field in `root` (the model validated); an unknown key is named
    with the nearest known one and the keys allowed there (see `docs`); a `PathError` raised in a
    model's validator names its key relative to that model."""
    out: dict[str, list[str]] = {}
    for e in err.errors():
        # the members of a union show up in the location ("literal['a','b']", "list[int]"): the key is the rest
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and "[" in p))
        ctx_err = (e.get("ctx") or {}).get("error")
        if isinstance(ctx_err, PathError):
            path = ".".join([prefix, *(str(p) for p in loc), ctx_err.rel_path])
            out.setdefault(path, []).append(f"got {short(ctx_err.value)!r}; allowed: {ctx_err.allowed}")
            continue
        if e["type"] == "literal_error" and loc != tuple(e["loc"]) and isinstance(e.get("input"), (list, dict)):
            continue            # a list is not one of the union's words: its other member says what is wrong
        path = ".".join([prefix, *(str(p) for p in loc)])
        if e["type"] == "extra_forbidden":
            _, holder = _field_at(root, loc[:-1] + ("\0",))
            known = list(holder.model_fields) if holder is not None else []
            close = difflib.get_close_matches(str(loc[-1]), known, n=1) if known else []
            hint = f"did you mean '{close[0]}'? " if close else ""
            out.setdefault(path, []).append(f"unknown key (got {short(e.get('input'))!r}); {hint}allowed keys: "
                                            f"{known} ({docs}; unknown keys are not ignored)")
        elif e["type"] == "missing":
            out.setdefault(path, []).append("missing; this key is required")
        else:
            info, _ = _field_at(root, loc)
            allowed = _range(info) if info is not None and e["type"] in _NUMERIC_ERRORS else None
            if allowed is None:
                allowed = e["msg"].removeprefix("Value error, ")
            out.setdefault(path, []).append(f"got {_got(e.get('input'), e['type'])}; allowed: {allowed}")
    lines = []
    for path, msgs in out.items():
        if len(msgs) > 1 and all(m.startswith("got ") for m in msgs):   # one value, several forms allowed
            got = msgs[0].partition("; allowed: ")[0]
            lines.append(f"{path}: {got}; allowed: " + " | ".join(m.partition("; allowed: ")[2] for m in msgs))
        else:
            lines += [f"{path}: {m}" for m in msgs]
    return lines
