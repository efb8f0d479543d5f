"""GRPO in NeMo-RL with lossless speculative decoding: the launch script to copy.

Use it where you would use NeMo-RL's `examples/run_grpo.py`, inside NeMo-RL's environment, with
nemo-rl-specdec installed there (`uv pip install /path/to/nemo_rl_specdec-*.whl`, README "Install",
or `uv pip install -e /path/to/checkout`):

    uv run python examples/run_grpo_specdec.py --config configs/qwen3_8b_suffix.yaml
    uv run python examples/run_grpo_specdec.py --config my_run.yaml \\
        grpo.max_num_steps=100 policy.generation.speculative_decoding.num_speculative_tokens=6

`--config` is your NeMo-RL run file with a `policy.generation.speculative_decoding` block; the
bundled example runs (`qwen3_8b_*.yaml`, `nemotron3_super_mtp.yaml`) are found by name. Overrides use
NeMo-RL's (Hydra) spelling and reach NeMo-RL unchanged.

What `main` does (nemo_rl_specdec/run_grpo.py; docs/nemo_rl.md, "Launch"):
1. compose the run file and validate the block before NeMo-RL is imported (bad block: exit 2);
2. check that NeMo-RL is importable and has every hook the run needs (else: exit 1);
3. with the block enabled, install the speculative-decoding generation workers into NeMo-RL;
4. run NeMo-RL's own `examples/run_grpo.py` main, sync or async as the run file says.
With the block absent or `enabled: false`, NeMo-RL runs unchanged.

Same as `python -m nemo_rl_specdec.run_grpo`.
"""
import sys

from nemo_rl_specdec.run_grpo import main

if __name__ == "__main__":
    sys.exit(main())
