"""`Host`: the base our mixins take for the type checker. They sit in front of NeMo-RL's and vLLM's
classes in the MRO (workers, their extensions, the policy worker) and call them with `super()`;
those classes are not followed (pyproject.toml), so the checker sees the host as Any. At run time a
mixin is a plain class, as before."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    Host = Any
else:
    Host = object
