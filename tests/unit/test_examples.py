"""examples/run_grpo_specdec.py is the NeMo-RL launch script a user copies: it runs our entry point
(nemo_rl_specdec/run_grpo.py), so it checks the block before NeMo-RL is imported. (examples/generate_cpu.py
starts an engine: tests/engine/test_example_generate_cpu.py.)"""
from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

from nemo_rl_specdec import run_grpo

CHECKOUT = Path(__file__).resolve().parents[2]
LAUNCH = CHECKOUT / "examples" / "run_grpo_specdec.py"


def test_the_launch_script_is_our_entry_point():
    assert runpy.run_path(str(LAUNCH), run_name="example")["main"] is run_grpo.main


def test_the_launch_script_rejects_a_bad_block_before_nemo_rl_starts(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(CHECKOUT), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, str(LAUNCH), "--config", "qwen3_8b_suffix.yaml",
                          "policy.generation.speculative_decoding.drafter=medusa"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == run_grpo.EXIT_CONFIG, res.stderr
    assert "policy.generation.speculative_decoding.drafter: got 'medusa'" in res.stderr
