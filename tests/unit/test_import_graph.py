"""The package's import graph: no circles, and every arrow points down the layers.

Every `import` / `from ... import` of the package's own modules counts, also those inside
functions (a lazy import is still an arrow); imports under `if TYPE_CHECKING:` do not (they never
run). A module's layer is that of its top-level module or subpackage.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "nemo_rl_specdec"

# bottom -> top; a unit imports only units of lower layers, never its own layer's
LAYERS = [
    {"resources", "config"},  # the package's files: bundled configs and assets, the cache directory; config/'s index
    {"config.schema", "rollouts", "lockstep", "metrics", "stats", "openmp", "update", "models", "drafter_state"},
    {"config.yaml_loader"},  # YAML files with overrides (run files, scenarios, NeMo-RL run files)
    {"config.loader"},  # the one door for run files: `defaults:` composition, NeMo-RL's checkout found
    {"cost"},           # the one step-cost function, hardware profiles, traces, their fits and pricing
    {"train"},          # the online distillation loop (drafters subclass its Distiller)
    {"drafters"},       # one file per drafter, the registry, and machinery/ they are built from
    {"config.run"},     # the run file and its YAML block, built from the registry
    {"scheduling"},
    {"engine"},         # what runs inside a vLLM worker (NeMo-RL's and our driver's)
    {"driver"},         # our local CPU driver: Engine, EngineGroup, their traces (never on the NeMo-RL path)
    {"sim"},
    {"demo"},
    {"adapter"},      # the NeMo-RL adapter
    {"bench"},
    {"tools", "cli", "run_grpo", "__init__"},  # tools: what users run; the development tools are the top-level tools/
]
LAYER = {unit: i for i, units in enumerate(LAYERS) for unit in units}


def _modules(pkg: Path = PKG) -> dict:
    out = {}
    for p in pkg.rglob("*.py"):
        parts = p.relative_to(pkg.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def _type_checking_lines(tree: ast.AST) -> set:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _edges(mods: dict) -> dict:
    edges: dict = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_lines(tree)
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from pkg import submodule` is an arrow to the submodule, else to the module
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module
                           for a in node.names]
            else:
                continue
            for t in targets:
                if t in mods and t != name:
                    edges.setdefault(name, set()).add(t)
    return edges


# rooms whose modules sit on different layers: config/ holds every config module, from the block's
# primitives (below the drafters) to the block built from the registry (above them)
ROOMS_OF_LAYERS = {"config"}


def _unit(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 2 and parts[1] in ROOMS_OF_LAYERS:
        return ".".join(parts[1:3])
    return parts[1] if len(parts) > 1 else "__init__"


def _cycles(graph: dict) -> list:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


@pytest.fixture(scope="module")
def graph():
    mods = _modules()
    assert len(mods) > 50, f"found only {len(mods)} modules under {PKG}"
    return mods, _edges(mods)


def test_every_unit_has_a_layer(graph):
    mods, _ = graph
    missing = sorted({_unit(m) for m in mods} - set(LAYER))
    assert not missing, f"modules/subpackages without a layer in LAYERS: {missing}"


def test_no_import_circles(graph):
    _, edges = graph
    assert edges, "no imports found: the walk is broken"
    assert _cycles(edges) == []


def test_arrows_point_down(graph):
    _, edges = graph
    up = sorted(f"{a} -> {b}" for a, bs in edges.items() for b in bs
                if _unit(a) != _unit(b) and LAYER[_unit(a)] <= LAYER[_unit(b)])
    assert up == [], "imports that point up (or sideways) the layers:\n" + "\n".join(up)


def test_the_nemo_rl_path_never_imports_our_driver():
    """engine/ (what runs inside NeMo-RL's vLLM workers) and adapter/ never import the local driver
    (driver/): counting lazy imports, those under `if TYPE_CHECKING:`, and dotted names in strings
    (`importlib.import_module`, a class vLLM or Ray resolves by name)."""
    found = []
    for name, path in _modules().items():
        if _unit(name) not in ("engine", "adapter"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                     if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else
                     [node.value] if isinstance(node, ast.Constant) and isinstance(node.value, str) else [])
            found += [f"{name} -> {n}" for n in names
                      if n == "nemo_rl_specdec.driver" or n.startswith("nemo_rl_specdec.driver.")]
    assert found == [], "the NeMo-RL path imports our local driver:\n" + "\n".join(found)


def test_the_package_never_imports_the_development_tools(graph):
    """The repository's top-level tools/ is not in the wheel: no module of the package imports it."""
    mods, _ = graph
    found = []
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
            found += [f"{name} -> {n}" for n in names if n == "tools" or n.startswith("tools.")]
    assert found == []


def test_the_walk_counts_lazy_imports_and_skips_type_checking(tmp_path):
    pkg = tmp_path / "nemo_rl_specdec"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from nemo_rl_specdec.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                     "    from nemo_rl_specdec import a\n")
    edges = _edges(_modules(pkg))
    assert edges == {"nemo_rl_specdec.a": {"nemo_rl_specdec.sub.b"}}
    assert _cycles(edges) == []
    (pkg / "sub" / "b.py").write_text("import nemo_rl_specdec.a\n")
    assert _cycles(_edges(_modules(pkg))) == [["nemo_rl_specdec.a", "nemo_rl_specdec.sub.b"]]
