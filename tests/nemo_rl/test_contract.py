"""Contract with an installed NeMo-RL: the recorded 0.6.0 API (tests/data/nemo_rl_0.6.0_api.json)
still describes it, and our subclasses build on the real classes with matching signatures.
Skipped where NeMo-RL cannot be imported (as on the machines this package is developed on)."""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import re
from pathlib import Path

import pytest

from nemo_rl_specdec.nemo_rl import api as _api  # noqa: E402

pytestmark = [
    pytest.mark.nemo_rl,
    pytest.mark.skipif(not _api.nemo_rl_available(), reason="NeMo-RL is not installed"),
]

from nemo_rl_specdec.nemo_rl import api, translate  # noqa: E402

RECORDED = json.loads((Path(__file__).resolve().parents[1] / "data" / "nemo_rl_0.6.0_api.json").read_text())


def kind_of(raw) -> str:
    if isinstance(raw, classmethod):
        return "classmethod"
    if isinstance(raw, staticmethod):
        return "staticmethod"
    fn = raw
    while True:
        if inspect.isasyncgenfunction(fn):
            return "asyncgen"
        if inspect.iscoroutinefunction(fn):
            return "async"
        inner = getattr(fn, "__wrapped__", None)
        if inner is None:
            return "sync"
        if inspect.isgeneratorfunction(inner) and not inspect.isgeneratorfunction(fn):
            return "contextmanager"
        fn = inner


def params_of(fn) -> list[str]:
    out = []
    for p in inspect.signature(fn).parameters.values():
        out.append({p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name)
    return out


def raw_member(cls, name):
    for k in cls.__mro__:
        if name in vars(k):
            return k, vars(k)[name]
    raise AttributeError(f"{cls.__qualname__} has no {name}")


def test_installed_version_is_reported():
    import nemo_rl

    version = getattr(nemo_rl, "__version__", "unknown")
    if not str(version).startswith(RECORDED["nemo_rl_version"]):
        pytest.xfail(f"NeMo-RL {version} installed, API recorded for {RECORDED['nemo_rl_version']}: "
                     "the tests below show whether anything we use changed")


@pytest.mark.parametrize("module", RECORDED["modules"])
def test_modules_import(module):
    importlib.import_module(module)


@pytest.mark.parametrize("fqn", sorted(RECORDED["classes"]))
def test_recorded_classes(fqn):
    cls = api.resolve(fqn)
    rec = RECORDED["classes"][fqn]
    for name, m in rec["methods"].items():
        owner, raw = raw_member(cls, name)
        fn = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
        assert params_of(fn) == m["params"], f"{fqn}.{name}"
        assert kind_of(raw) == m["kind"], f"{fqn}.{name}"
        if "defined_in" in m:
            assert f"{owner.__module__}.{owner.__qualname__}" == m["defined_in"], f"{fqn}.{name}"
    source = "\n".join(inspect.getsource(k) for k in cls.__mro__ if k.__module__.startswith("nemo_rl"))
    for attr in rec.get("instance_attributes", []):
        assert re.search(rf"self\.{attr}\b\s*(:[^=]*)?=", source), f"{fqn}: no `self.{attr} =` in its source"
    for prop in rec.get("properties", []):
        assert isinstance(raw_member(cls, prop)[1], property), f"{fqn}.{prop}"


@pytest.mark.parametrize("fqn", sorted(RECORDED["functions"]))
def test_recorded_functions(fqn):
    assert params_of(api.resolve(fqn)) == RECORDED["functions"][fqn]["params"]


def test_recorded_attributes():
    import ray

    for fqn, rec in RECORDED["attributes"].items():
        obj = api.resolve(fqn)
        if rec["type"] == "dict":
            assert isinstance(obj, dict) and set(rec["keys"]) <= set(obj), fqn
        elif rec["type"] == "str":
            assert isinstance(obj, str), fqn
        elif rec["type"] == "class":
            assert obj is api.resolve(rec["is"]), fqn
        elif rec["type"] == "ray_actor":
            assert isinstance(obj, ray.actor.ActorClass), fqn
        else:
            raise AssertionError(f"unknown recorded type {rec['type']} for {fqn}")


def _overrides(ours: type, base: type):
    for name, raw in vars(ours).items():
        if callable(raw) and not name.startswith("__") or name == "__init__":
            if hasattr(base, name):
                yield name, raw, raw_member(base, name)[1]


@pytest.mark.parametrize("ours_name, base_fqn", [
    ("workers.SpecDecVllmGenerationWorkerImpl", api.SYNC_WORKER_IMPL),
    ("workers.SpecDecVllmAsyncGenerationWorkerImpl", api.ASYNC_WORKER_IMPL),
    ("generation.SpecDecVllmGeneration", api.VLLM_GENERATION),
])
def test_our_subclasses_build_on_the_real_classes(ours_name, base_fqn):
    module, name = ours_name.split(".")
    ours = getattr(importlib.import_module(f"nemo_rl_specdec.nemo_rl.{module}"), name)
    base = api.resolve(base_fqn)
    assert issubclass(ours, base)
    checked = 0
    for meth, mine, theirs in _overrides(ours, base):
        assert params_of(mine) == params_of(theirs), f"{name}.{meth}"
        assert kind_of(mine) == kind_of(theirs), f"{name}.{meth}"
        checked += 1
    assert checked >= 4


def test_actor_classes_resolve_by_fqn():
    import ray

    for fqn in translate.WORKER_SUBSTITUTES.values():
        assert isinstance(api.resolve(fqn), ray.actor.ActorClass), fqn


def test_composite_extension_builds_on_the_real_host():
    pytest.importorskip("vllm")
    pytest.importorskip("nemo_rl_specdec.engine.worker_extension")
    from nemo_rl_specdec.nemo_rl import extension

    for name, (host_fqn, _) in extension.COMPOSITES.items():
        cls = getattr(extension, name)
        assert issubclass(cls, api.resolve(host_fqn))
        for hook in ("_load_weights", "_weight_update_lifecycle", "_get_drafter_model"):
            assert params_of(getattr(cls, hook)) == params_of(getattr(api.resolve(host_fqn), hook))


def test_run_grpo_script_has_the_bindings_we_patch():
    script = api.load_run_grpo_module()
    assert callable(script.main)
    assert script.configure_generation_config is api.resolve(api.CONFIGURE_GENERATION_CONFIG)
