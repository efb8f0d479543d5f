"""Torch module classes a drafter file builds on first use, so that declaring a drafter (config
validation, the CLI) imports no torch.

    def _build() -> dict:
        import torch

        class Head(torch.nn.Module): ...
        return {"Head": Head}

    torch_modules = LazyTorchModules(__name__, ("Head",), _build)
    __getattr__ = torch_modules.module_getattr   # `module.Head` builds them too

`torch_modules()` is the namespace of the classes (built once). Each class is named at the top of
its module (`__qualname__`), and the module's `__getattr__` resolves that name, so instances
pickle by module attribute.
"""
from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace


class LazyTorchModules:
    """The torch module classes `names` of module `module`, built by `build()` on first use."""

    def __init__(self, module: str, names: tuple[str, ...], build: Callable[[], dict]):
        self.module, self.names, self._build = module, tuple(names), build
        self._classes: SimpleNamespace | None = None

    def __call__(self) -> SimpleNamespace:
        if self._classes is None:
            classes = self._build()
            if set(classes) != set(self.names):
                raise RuntimeError(f"{self.module}: built {sorted(classes)}, declared {sorted(self.names)}")
            for name, cls in classes.items():
                cls.__qualname__ = name
            self._classes = SimpleNamespace(**classes)
        return self._classes

    def module_getattr(self, name: str) -> type:
        """The module's `__getattr__`: its lazily built classes by name."""
        if name in self.names:
            return getattr(self(), name)
        raise AttributeError(f"module {self.module!r} has no attribute {name!r}")


__all__ = ["LazyTorchModules"]
