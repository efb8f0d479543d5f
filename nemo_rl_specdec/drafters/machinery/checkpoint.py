"""A model drafter's checkpoint on disk (DFlash's draft, Eagle3's head, MTP's layer in its policy's
files): its safetensors read, its tensors loaded into the drafter's module and checked, and the
module's tensors as a checkpoint holds them. Imports safetensors and torch only when called.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from nemo_rl_specdec.train.distill import check_trainable


def read_safetensors(directory: str | Path, rename: Callable[[str], str | None] | None = None) -> dict:
    """The tensors of the `*.safetensors` files in `directory` (files in name order; a later file's
    tensor replaces an earlier one's of the same name). With `rename`: only the tensors it names
    (None: skipped), under that name, each read alone (a policy's other tensors are never loaded)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    tensors: dict = {}
    for f in sorted(Path(directory).glob("*.safetensors")):
        if rename is None:
            tensors.update(load_file(str(f)))
            continue
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():
                name = rename(key)
                if name is not None:
                    tensors[name] = fh.get_tensor(key)
    return tensors


def load_checkpoint(module: Any, tensors: dict, where: Any, layout: str, *, untrained: Iterable[str] = ()) -> None:
    """`tensors` into `module` (every one of its parameters and buffers, nothing else), after checking
    that all but the `untrained` names are in a dtype the distillation trains (`check_trainable`). A
    ValueError `<where>: <layout> (missing [...], unexpected [...])` when the names do not match."""
    skip = set(untrained)
    check_trainable({k: v for k, v in tensors.items() if k not in skip}, where)
    missing, unexpected = module.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        raise ValueError(f"{where}: {layout} (missing {missing[:4]}, unexpected {unexpected[:4]})")


def state_tensors(module: Any) -> dict:
    """The module's state dict as a checkpoint holds it: detached, contiguous copies."""
    return {k: v.detach().clone().contiguous() for k, v in module.state_dict().items()}


__all__ = ["load_checkpoint", "read_safetensors", "state_tensors"]
