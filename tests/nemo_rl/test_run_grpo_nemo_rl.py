"""The entry point's NeMo-RL side with a real NeMo-RL: example runs compose with NeMo-RL's base
config and pass its MasterConfig; the block survives; NeMo-RL's configure_generation_config,
wrapped by us, keeps the cheap dummy load where the drafter has no weights of its own; the
substitutions install and uninstall. No GPUs needed. Skipped where NeMo-RL is not installed."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

from nemo_rl_specdec.nemo_rl import api as _api  # noqa: E402

pytestmark = [
    pytest.mark.nemo_rl,
    pytest.mark.skipif(not _api.nemo_rl_available(), reason="NeMo-RL is not installed"),
]

from nemo_rl_specdec.nemo_rl import api, config_loader, run_grpo, translate  # noqa: E402

CONFIGS = sorted(p for p in (Path(__file__).resolve().parents[2] / "configs").glob("*.yaml")
                 if "defaults: nemo_rl:" in p.read_text())


def composed(path):
    from nemo_rl.utils.config import register_omegaconf_resolvers

    register_omegaconf_resolvers()
    c = config_loader.compose(path, [], api.find_nemo_rl_root())
    assert c.missing_parents == []
    return c.resolved()


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_example_passes_nemo_rl_master_config_and_keeps_the_block(path):
    from nemo_rl.algorithms.grpo import MasterConfig

    raw = composed(path)
    cfg = MasterConfig(**raw)
    assert cfg.policy["generation"]["speculative_decoding"] == raw["policy"]["generation"]["speculative_decoding"]
    assert translate.check_run(raw) is not None


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_wrapped_configure_generation_config(path):
    from nemo_rl.models.generation import configure_generation_config

    raw = composed(path)
    policy = raw["policy"]
    wrapped = run_grpo.make_configure_wrapper(configure_generation_config)
    tok = SimpleNamespace(pad_token_id=0, eos_token_id=1)
    exports = bool(policy["draft"]["enabled"])
    trains_mtp = bool((policy.get("megatron_cfg") or {}).get("mtp_num_layers"))
    gen = wrapped(policy["generation"], tok, has_refit_draft_weights=exports, trains_mtp=trains_mtp)
    spec = translate.enabled_spec(gen)
    assert gen["vllm_kwargs"]["speculative_config"]["num_speculative_tokens"] == spec.num_speculative_tokens
    source = translate.drafter_weight_source(spec, exports, trains_mtp)
    if source in (translate.SOURCE_NONE, translate.SOURCE_REFIT_STREAM, translate.SOURCE_CHECKPOINT_ONCE):
        assert gen["vllm_cfg"]["load_format"] == "dummy"
    else:
        assert gen["vllm_cfg"]["load_format"] == "auto"


def test_install_and_uninstall_on_real_nemo_rl():
    from nemo_rl.algorithms import grpo
    from nemo_rl.distributed.ray_actor_environment_registry import ACTOR_ENVIRONMENT_REGISTRY
    from nemo_rl.models.generation.vllm import vllm_generation

    before = (grpo.VllmGeneration, vllm_generation.resolve_generation_worker_cls)
    env = {}
    undo = run_grpo.install(env)
    try:
        assert translate.OUR_SYNC_WORKER in ACTOR_ENVIRONMENT_REGISTRY
        cfg = {"speculative_decoding": {"enabled": True, "drafter": "ngram"}, "backend": "vllm", "temperature": 1.0}
        assert vllm_generation.resolve_generation_worker_cls(api.SYNC_WORKER, cfg) == translate.OUR_SYNC_WORKER
        assert issubclass(grpo.VllmGeneration, before[0])
        assert env["PYTHONPATH"]
    finally:
        run_grpo.uninstall(undo)
    assert (grpo.VllmGeneration, vllm_generation.resolve_generation_worker_cls) == before
    assert translate.OUR_SYNC_WORKER not in ACTOR_ENVIRONMENT_REGISTRY
