"""`python -m nemo_rl_specdec.run_grpo --config RUN.yaml [overrides]`: NeMo-RL GRPO with speculative decoding.

Thin shim; the entry point lives in `nemo_rl_specdec.nemo_rl.run_grpo` (see its docstring).
"""
import sys

from nemo_rl_specdec.nemo_rl.run_grpo import main

if __name__ == "__main__":
    sys.exit(main())
