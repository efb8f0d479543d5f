"""The vLLM process patches that need no engine: the benign-warning filter on vLLM's loggers."""
import logging

from nemo_rl_specdec.engine import vllm_compat


def _records(logger: logging.Logger) -> list:
    seen: list = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    logger.addHandler(Keep())
    return seen


def test_benign_warnings_are_dropped_and_others_kept():
    lg = logging.getLogger("vllm.specdec_test_compat")
    seen = _records(lg)
    vllm_compat.quiet_benign_vllm_warnings()
    vllm_compat.quiet_benign_vllm_warnings()  # idempotent: one filter per logger
    lg.warning("%s for layer 3", vllm_compat.BENIGN_VLLM_WARNINGS[0])
    lg.warning("KV cache is full")
    assert seen == ["KV cache is full"]
    assert sum(isinstance(f, vllm_compat._BenignVllmWarnings) for f in lg.filters) == 1


def test_loggers_outside_vllm_are_untouched():
    lg = logging.getLogger("specdec_test_not_vllm")
    seen = _records(lg)
    vllm_compat.quiet_benign_vllm_warnings()
    lg.warning(vllm_compat.BENIGN_VLLM_WARNINGS[0])
    assert seen == [vllm_compat.BENIGN_VLLM_WARNINGS[0]]
