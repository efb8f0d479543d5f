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
