"""The hybrid drafter inside NeMo-RL: translate accepts it on main (the model part's vLLM method,
greedy, synchronous scheduling; rollouts reach the engines for its history half) and the
preflight refuses it where the workers' vLLM predates the model runner it drafts through (NeMo-RL
v0.7.0: no custom_class), naming the key and the reason."""
from __future__ import annotations

import sys

import pytest
from fakes import gen_cfg, spec  # noqa: E402

from nemo_rl_specdec.adapter import preflight, translate
from nemo_rl_specdec.config.run import ConfigError

EAGLE = {"model": "/ckpt/eagle3"}
# what NeMo-RL v0.7.0's vLLM reports (no custom_class method)
FACTS_V070 = {"vllm": "0.11.2", "python": "/venv/bin/python", "methods": ["draft_model", "eagle3", "ngram", "mtp"],
              "fields": ["method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"]}


def test_translate_accepts_the_hybrid_and_hands_the_engines_rollouts():
    g = gen_cfg(drafter="hybrid", eagle3=EAGLE, refresh={"mode": "frozen"})
    translate.apply_to_generation_config(g)
    sc = g["vllm_kwargs"]["speculative_config"]
    assert sc["method"] == "eagle3" and sc["model"] == "/ckpt/eagle3"
    assert sc["draft_sample_method"] == "greedy"
    assert g["vllm_kwargs"]["async_scheduling"] is False  # the hybrid's list drafts need synchronous scheduling
    assert translate.rollouts_wanted(translate.enabled_spec(g))  # the history half's store


def test_preflight_on_mains_vllm_keeps_the_hybrids_config():
    facts = preflight.worker_facts(sys.executable)  # this environment's vLLM (what main pins)
    g = gen_cfg(drafter="hybrid", eagle3=EAGLE, refresh={"mode": "frozen"})
    translate.apply_to_generation_config(g)
    before = dict(g["vllm_kwargs"]["speculative_config"])
    preflight.check(translate.enabled_spec(g), g, "unused", facts=facts)
    assert g["vllm_kwargs"]["speculative_config"] == before


def test_preflight_refuses_the_hybrid_on_a_vllm_without_custom_class():
    sc = {"method": "eagle3", "model": "/ckpt/eagle3", "num_speculative_tokens": 4, "draft_sample_method": "greedy"}
    with pytest.raises(ConfigError, match=r"speculative_decoding\.drafter: got 'hybrid'.*vLLM 0\.11\.2.*no "
                                          r"custom_class method.*a drafter of one part"):
        preflight.adapt_speculative_config(sc, FACTS_V070, spec(drafter="hybrid", eagle3=EAGLE))
    # the model part alone runs there
    out = preflight.adapt_speculative_config({"method": "eagle3", "model": "/ckpt/eagle3", "num_speculative_tokens": 4},
                                             FACTS_V070, spec(drafter="eagle3", eagle3=EAGLE))
    assert out["method"] == "eagle3"


def test_the_model_parts_nemo_rl_rules_apply_to_the_hybrid():
    # eagle3's rule: the trainer's Eagle head must be the engines' checkpoint
    with pytest.raises(ConfigError, match=r"eagle3\.model: got '/ckpt/eagle3'.*policy\.draft\.model_name"):
        from nemo_rl_specdec.drafters.registry import drafter
        from nemo_rl_specdec.drafters.roles import NemoRLRules

        s = spec(drafter="hybrid", eagle3=EAGLE)
        drafter(s, NemoRLRules).check_nemo_rl(s, {"draft": {"enabled": True, "model_name": "/other"}})


def test_a_run_that_asks_vllm_for_async_scheduling_is_refused_with_the_hybrid():
    g = gen_cfg(drafter="hybrid", eagle3=EAGLE, refresh={"mode": "frozen"})
    g["vllm_kwargs"] = {"async_scheduling": True}
    with pytest.raises(ConfigError, match=r"vllm_kwargs\.async_scheduling: got True; allowed: False .*'hybrid'"):
        translate.apply_to_generation_config(g)


def test_the_hybrids_metrics_reach_nemo_rls_logger_as_engine_metrics():
    from nemo_rl_specdec.adapter.metrics import engine_reported_metrics

    states = [{"metrics": {"hybrid/step/share_model": 0.25, "hybrid/step/model_skipped": 3.0}},
              {"metrics": {"hybrid/step/share_model": 0.75, "hybrid/step/model_skipped": 5.0}}]
    assert engine_reported_metrics(states) == {"specdec/engine/hybrid/step/model_skipped": 4.0,
                                               "specdec/engine/hybrid/step/share_model": 0.5}
