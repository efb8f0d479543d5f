"""Shared pytest configuration."""


def pytest_configure(config):
    config.addinivalue_line("markers", "nemo_rl: needs NeMo-RL installed; skipped where `import nemo_rl` fails")
