"""Development tools, outside the package and its wheel: the tiny-asset trainers, the device and
cost checks, the type gate's reach and the pinned-vLLM environments. Run from the repository root:

    python -m tools.NAME [...]
"""
