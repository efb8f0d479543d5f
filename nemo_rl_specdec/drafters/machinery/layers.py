"""The torch layers our plain-torch drafter mirrors share (Eagle3's head, DFlash's draft): the RMS
norm, the SwiGLU MLP under vLLM's parameter names, and the neox-style rotary embedding. The module
classes are built on first use, so that declaring a drafter (config validation, the CLI) imports no
torch. MTP's layer is transformers' own Qwen2 decoder layer, as vLLM's MiMo MTP layer is, and does
not use these.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_rl_specdec.drafters.machinery.lazy_torch import LazyTorchModules

if TYPE_CHECKING:
    import torch


def _build_torch_modules() -> dict:
    """The shared torch module classes (RMSNorm, SwiGLU)."""
    import torch
    import torch.nn.functional as F

    class RMSNorm(torch.nn.Module):
        def __init__(self, n: int, eps: float):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(n))
            self.eps = eps

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    class SwiGLU(torch.nn.Module):
        """A Qwen3/Llama MLP (gate, up, down; no biases), under vLLM's parameter names."""

        def __init__(self, H: int, inter: int):
            super().__init__()
            self.gate_proj = torch.nn.Linear(H, inter, bias=False)
            self.up_proj = torch.nn.Linear(H, inter, bias=False)
            self.down_proj = torch.nn.Linear(inter, H, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    return {"RMSNorm": RMSNorm, "SwiGLU": SwiGLU}


torch_modules = LazyTorchModules(__name__, ("RMSNorm", "SwiGLU"), _build_torch_modules)
__getattr__ = torch_modules.module_getattr


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding on [B, heads, T, hd] at integer positions [B, T] (on x's device; the
    tables in fp32, applied in x's dtype)."""
    import torch

    hd = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32, device=x.device) / hd))
    ang = pos.to(x.device).float().unsqueeze(-1) * inv  # [B, T, hd/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1).unsqueeze(1).to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1).unsqueeze(1).to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin
