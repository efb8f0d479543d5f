"""`LazyTorchModules`: classes built once on first use, named at their module's top level so that
their instances pickle, and declared names only (config validation imports no torch:
tests/unit/test_config.py checks the CLI)."""
from __future__ import annotations

import pickle
import sys
import types

import pytest

from nemo_rl_specdec.drafters.machinery.lazy_torch import LazyTorchModules


def _module(build_calls: list) -> types.ModuleType:
    mod = types.ModuleType("lazy_probe")

    def build() -> dict:
        build_calls.append(1)

        class Head:   # a local class: its __qualname__ is build.<locals>.Head until the helper names it
            def __init__(self, n):
                self.n = n

        return {"Head": Head}

    mod.torch_modules = LazyTorchModules(mod.__name__, ("Head",), build)
    mod.__getattr__ = mod.torch_modules.module_getattr
    return mod


def test_built_once_on_first_use_and_pickled_by_module_attribute(monkeypatch):
    calls: list = []
    mod = _module(calls)
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    assert calls == []
    head_cls = mod.Head   # the module's __getattr__ builds them
    assert calls == [1] and mod.torch_modules().Head is head_cls and calls == [1]
    assert head_cls.__qualname__ == "Head"
    head_cls.__module__ = mod.__name__   # as a class defined in a function of that module is
    assert pickle.loads(pickle.dumps(head_cls(3))).n == 3
    with pytest.raises(AttributeError, match="no attribute 'Tail'"):
        mod.Tail  # noqa: B018
    assert calls == [1]


def test_a_build_that_does_not_give_the_declared_names_is_refused():
    lazy = LazyTorchModules("lazy_probe", ("Head", "Tail"), lambda: {"Head": type("Head", (), {})})
    with pytest.raises(RuntimeError, match=r"built \['Head'\], declared \['Head', 'Tail'\]"):
        lazy()


def test_the_drafters_classes_pickle_from_their_modules():
    torch = pytest.importorskip("torch")
    from nemo_rl_specdec.drafters.machinery import layers

    norm = pickle.loads(pickle.dumps(layers.RMSNorm(4, 1e-6)))
    assert type(norm) is layers.RMSNorm and torch.equal(norm.weight, torch.ones(4))
