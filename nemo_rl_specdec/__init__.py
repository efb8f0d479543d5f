"""nemo-rl-specdec: lossless speculative decoding for NeMo-RL rollouts.

Layers (data flows downward only): config -> engine (vLLM, no NeMo-RL) -> drafters;
nemo_rl/ is a thin adapter that imports NeMo-RL lazily.
"""
__version__ = "0.1.0"
