"""The test suite's own layout."""
from collections import Counter
from pathlib import Path


def test_test_modules_have_unique_basenames():
    """pytest imports test modules by basename (tests/ has no packages): two files of one name
    collide at collection, or only once an opt-in module stops skipping itself."""
    tests = Path(__file__).resolve().parents[1]
    names = Counter(p.name for p in tests.rglob("test_*.py"))
    assert sorted(n for n, c in names.items() if c > 1) == []
