"""A drafter's saved state as bytes: what an engine worker and a policy worker hand the checkpoint
(adapter/checkpoint.py) and take back at a resume.

Dicts, lists, numbers, strings, None, numpy arrays and torch tensors go through `torch.save`;
numpy arrays come back as tensors (`torch.load(weights_only=True)` reads nothing else, so a state
file never runs code when it is read). Bytes, because vLLM's multiprocess engine core (NeMo-RL's
async engine) takes RPC arguments as msgpack.
"""
from __future__ import annotations

import io
from typing import Any


def _plain(obj: Any) -> Any:
    """numpy arrays as tensors (what `torch.load(weights_only=True)` reads back), recursively."""
    import numpy as np
    import torch

    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(obj))
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain(v) for v in obj) if isinstance(obj, list) else tuple(_plain(v) for v in obj)
    return obj


def to_bytes(obj: Any) -> bytes:
    """`obj` (dicts, lists, numbers, strings, numpy arrays, tensors) as bytes for an RPC or a file."""
    import torch

    buf = io.BytesIO()
    torch.save(_plain(obj), buf)
    return buf.getvalue()


def from_bytes(blob: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(blob), weights_only=True)



__all__ = ["from_bytes", "to_bytes"]
