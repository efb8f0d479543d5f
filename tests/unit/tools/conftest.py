"""The development tools live in the repository's top-level tools/, outside the package (and its
wheel): their tests import them as `tools.NAME`, with the checkout's root first on sys.path."""
import sys
from pathlib import Path

REPO = str(Path(__file__).resolve().parents[3])
if REPO not in sys.path:
    sys.path.insert(0, REPO)
