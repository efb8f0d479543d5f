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


def save(obj: Any, f: Any) -> None:
    """`obj` (dicts, lists, numbers, strings, numpy arrays, tensors) into the binary file `f`."""
    import torch

    torch.save(_plain(obj), f)


def load(f: Any) -> Any:
    """What `save` wrote into `f` (tensors, never code)."""
    import torch

    return torch.load(f, weights_only=True)


def to_bytes(obj: Any) -> bytes:
    """`obj` as bytes for an RPC."""
    buf = io.BytesIO()
    save(obj, buf)
    return buf.getvalue()


def from_bytes(blob: bytes) -> Any:
    return load(io.BytesIO(blob))


def digest(obj: Any) -> str:
    """A content digest of a state (tensors by dtype, shape and bytes; other leaves by repr), equal
    exactly when two states are bit-identical: what a resume's restore is checked against."""
    import hashlib

    import torch

    h = hashlib.blake2b(digest_size=16)

    def walk(x: Any) -> None:
        x = _plain(x)
        if isinstance(x, dict):
            for k in sorted(x, key=str):
                h.update(f"<{k!s}>".encode())
                walk(x[k])
        elif isinstance(x, (list, tuple)):
            h.update(b"[")
            for v in x:
                walk(v)
            h.update(b"]")
        elif isinstance(x, torch.Tensor):
            t = x.detach().to("cpu").contiguous()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        else:
            h.update(repr(x).encode())

    walk(obj)
    return h.hexdigest()


__all__ = ["digest", "from_bytes", "load", "save", "to_bytes"]
