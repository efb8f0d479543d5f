"""The vLLM process patches that need no engine: the benign-warning filter on vLLM's loggers."""
import logging

from nemo_rl_specdec.engine import vllm_compat


def _records(logger: logging.Logger) -> list:
    seen: list = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    logger.addHandler(Keep())
    return seen


def test_benign_warnings_are_dropped_and_others_kept():
    lg = logging.getLogger("vllm.specdec_test_compat")
    seen = _records(lg)
    vllm_compat.quiet_benign_vllm_warnings()
    vllm_compat.quiet_benign_vllm_warnings()  # idempotent: one filter per logger
    lg.warning("%s for layer 3", vllm_compat.BENIGN_VLLM_WARNINGS[0])
    lg.warning("KV cache is full")
    assert seen == ["KV cache is full"]
    assert sum(isinstance(f, vllm_compat._BenignVllmWarnings) for f in lg.filters) == 1


def test_loggers_outside_vllm_are_untouched():
    lg = logging.getLogger("specdec_test_not_vllm")
    seen = _records(lg)
    vllm_compat.quiet_benign_vllm_warnings()
    lg.warning(vllm_compat.BENIGN_VLLM_WARNINGS[0])
    assert seen == [vllm_compat.BENIGN_VLLM_WARNINGS[0]]


COMPILED_THEN_REGISTER = (
    "import numba\n"
    "numba.njit(lambda x: x + 1)(1)  # llvmlite.binding.ffi is now in sys.modules\n"
    "from vllm.platforms import current_platform as p\n"
    "{patch}"
    "p.register_triton_kernel_overrides()\n"
    "print('REGISTERED')\n"
)


def _run(code: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)


def test_kernel_registration_survives_a_process_where_numba_has_compiled():
    """vLLM's registration scans every module and crashes on llvmlite's ffi `lib` (what numba leaves
    in sys.modules once it compiled: vLLM's n-gram matcher, our n-gram proposer); an engine started
    after that in the same process (a test session, a bench) failed at start."""
    bare = _run(COMPILED_THEN_REGISTER.format(patch=""))
    ours = _run(COMPILED_THEN_REGISTER.format(
        patch="from nemo_rl_specdec.engine import vllm_compat\nvllm_compat.register_cpu_kernels_once()\n"))
    assert "REGISTERED" in ours.stdout, ours.stderr[-2000:]
    if "REGISTERED" in bare.stdout:
        print("this vLLM's registration no longer trips over llvmlite: the guard is not needed")
    else:
        assert "_lib_fn_wrapper" in bare.stderr, bare.stderr[-2000:]
