"""`dflash.rebuild_context_kv` after an in-place load: each packed qkv projection is read back
through its kernel on the weight's device and in its dtype, vLLM's builder sees the full weights,
and the packed layers get their emptied Parameter back."""
from types import SimpleNamespace

import pytest
import torch

from nemo_rl_specdec.drafters.dflash import rebuild_context_kv


class _PackedKernel:
    """A GEMM over a weight it keeps packed on the host; like a GPU kernel it refuses an input on
    another device or of another dtype than the layer's. On the meta device (a stand-in for a GPU,
    without values) it returns an output of the right shape there."""

    def __init__(self, packed: torch.Tensor):
        self.packed = packed  # (out, in)

    def apply(self, layer, x, bias=None):
        w = layer.weight
        if x.device != w.device or x.dtype != w.dtype:
            raise RuntimeError(f"expected the input on {w.device} as {w.dtype}, got it on {x.device} as {x.dtype}")
        if x.is_meta:
            return torch.empty(x.shape[0], self.packed.shape[0], device=x.device, dtype=x.dtype)
        return x @ self.packed.to(x.dtype).t()


class _PackedLinear(torch.nn.Module):
    def __init__(self, packed: torch.Tensor, device: str, dtype: torch.dtype):
        super().__init__()
        self.input_size_per_partition = packed.shape[1]
        self.weight = torch.nn.Parameter(torch.empty(0, dtype=dtype, device=device), requires_grad=False)
        self.quant_method = _PackedKernel(packed)


def _draft(device: str, dtype: torch.dtype, layers: int = 2, hidden: int = 8, qkv: int = 12):
    """vLLM's DFlash draft as `rebuild_context_kv` reads it; its builder keeps the weights it saw."""
    g = torch.Generator().manual_seed(0)
    packed = [torch.randn(qkv, hidden, generator=g).to(dtype) for _ in range(layers)]
    inner = torch.nn.Module()
    inner.layers = torch.nn.ModuleList()
    for w in packed:
        layer = torch.nn.Module()
        layer.self_attn = torch.nn.Module()
        layer.self_attn.qkv_proj = _PackedLinear(w, device, dtype)
        inner.layers.append(layer)
    built = []
    inner._build_fused_kv_buffers = lambda: built.append(
        [layer.self_attn.qkv_proj.weight for layer in inner.layers])
    return SimpleNamespace(model=inner), packed, built


@pytest.mark.parametrize("device, dtype", [("meta", torch.bfloat16), ("cpu", torch.bfloat16), ("cpu", torch.float32)])
def test_the_builder_sees_each_packed_weight_read_back_on_its_device_and_dtype(device, dtype):
    model, packed, built = _draft(device, dtype)
    emptied = [layer.self_attn.qkv_proj.weight for layer in model.model.layers]
    rebuild_context_kv(model)
    (seen,) = built
    for w, want in zip(seen, packed, strict=True):
        assert (w.device, w.dtype, tuple(w.shape)) == (torch.device(device), dtype, tuple(want.shape))
        if device != "meta":
            assert torch.equal(w, want)  # the identity through the kernel gives W exactly
    # the packed layers keep their emptied Parameter: their kernel holds the weight
    assert all(layer.self_attn.qkv_proj.weight is e for layer, e in zip(model.model.layers, emptied, strict=True))
