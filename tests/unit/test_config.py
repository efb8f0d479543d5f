"""The `policy.generation.speculative_decoding` block: defaults, every documented key, the vLLM
translation, loading (resolver, interpolation, overrides), invalid blocks and the `validate` CLI.

No engine is started or imported here.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import BaseModel

from nemo_rl_specdec import cli
from nemo_rl_specdec.config.run import (
    BLOCK_PATH,
    ConfigError,
    RunConfig,
    SpecDecConfig,
    draft_sample_method,
    load_run_config,
    to_vllm_speculative_config,
    validate_run_dict,
)
from nemo_rl_specdec.drafters.base import LIST
from nemo_rl_specdec.drafters.registry import drafter as drafter_of
from nemo_rl_specdec.drafters.roles import Declared
from nemo_rl_specdec.resources import asset_path, config_path

REPO = Path(__file__).resolve().parents[2]
TINY = config_path("tiny_cpu.yaml")
DOC = REPO / "docs" / "configuration.md"
B = BLOCK_PATH


def run_dict(block=None, **generation) -> dict:
    gen = {"temperature": 1.0, **generation}
    if block is not None:
        gen["speculative_decoding"] = block
    return {"policy": {"model_name": "some/policy", "generation": gen}}


def spec_of(block: dict, **generation) -> SpecDecConfig:
    return validate_run_dict(run_dict(block, **generation)).spec


def nested(dotted: str, value) -> dict:
    """`a.b.c`, v -> {"a": {"b": {"c": v}}}"""
    out: dict = {}
    node = out
    parts = dotted.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return out


def merge(a: dict, b: dict) -> dict:
    out = copy.deepcopy(a)
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def getpath(obj, dotted: str):
    for p in dotted.split("."):
        obj = getattr(obj, p)
    return obj


def leaf_keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    keys = set()
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys |= leaf_keys(ann, f"{prefix}{name}.")
        else:
            keys.add(f"{prefix}{name}")
    return keys


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


# --------------------------------------------------------------------------- defaults

EXPECTED_DEFAULTS = {
    "enabled": False,
    "drafter": "suffix",
    "num_speculative_tokens": 24,  # suffix: vLLM's own default there (SuffixConfig.default_k)
    "draft_sample_method": "auto",
    "suffix": {"backend": "das", "window_steps": 4, "scope": "both", "max_tree_depth": 64,
               "max_match_len": 16, "max_spec_factor": 1.0, "min_token_prob": 0.1, "max_memory_mb": 512.0,
               "max_cached_requests": 10000, "share_in_flight": "cold"},
    "ngram": {"backend": "vllm", "prompt_lookup_min": 2, "prompt_lookup_max": 4},
    "draft_model": {"model": None},
    "eagle3": {"model": None, "draft_vocab_size": None},
    "dflash": {"model": None},
    "mtp": {},
    "hybrid": {"history": "suffix", "model": "eagle3", "model_k": None, "tail_requests": None},
    "refresh": {"mode": "rebuild", "every_n_steps": 1, "max_policy_lag": 0,
                "distill": {"lr": 1e-3, "epochs": 2, "micro_batch_tokens": 4096, "max_tokens": 8192,
                            "max_transient_gb": None}},
    "scheduling": {"placement": "contiguous", "budget": "adaptive", "k_by_batch_size": None, "k": None,
                   "long_fraction": 0.25, "short_fraction": 0.25},
    "on_refresh_error": "raise",
    "auto_disable": True,  # resolved per drafter: on for DAS (the default drafter)
    "resume": "carry",
}


def test_defaults_of_an_empty_block():
    assert spec_of({}).model_dump() == EXPECTED_DEFAULTS


def test_absent_block_means_defaults_and_speculation_off():
    cfg = validate_run_dict(run_dict())
    assert cfg.spec.model_dump() == EXPECTED_DEFAULTS
    assert to_vllm_speculative_config(cfg.spec) is None


def test_expected_defaults_cover_every_key_of_the_schema():
    def flatten(d, prefix=""):
        out = set()
        for k, v in d.items():
            out |= flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}"}
        return out

    assert flatten(EXPECTED_DEFAULTS) == leaf_keys(SpecDecConfig)


def test_validation_does_not_share_defaults_between_blocks():
    # the refresh-mode default is filled in per drafter; one block must not leak into the next
    assert spec_of({"drafter": "suffix"}).refresh.mode == "rebuild"
    assert spec_of({"drafter": "draft_model"}).refresh.mode == "online"
    assert spec_of({"drafter": "suffix"}).refresh.mode == "rebuild"
    assert SpecDecConfig().refresh.mode == "rebuild"
    assert SpecDecConfig(drafter="mtp").refresh.mode == "refit"


# --------------------------------------------------------------------------- every key, every allowed value

# (dotted key inside the block, value, extra block keys needed for the value to make sense)
ALLOWED = [
    ("enabled", True, {}),
    ("enabled", False, {}),
    ("drafter", "suffix", {}),
    ("drafter", "ngram", {}),
    ("drafter", "mtp", {}),
    ("drafter", "draft_model", {"enabled": True, "draft_model": {"model": "/ckpt/draft"}}),
    ("drafter", "eagle3", {"enabled": True, "eagle3": {"model": "/ckpt/eagle3"}}),
    ("num_speculative_tokens", 1, {}),
    ("num_speculative_tokens", 3, {}),
    ("num_speculative_tokens", 64, {}),
    ("draft_sample_method", "auto", {}),
    ("draft_sample_method", "greedy", {}),
    ("draft_sample_method", "probabilistic", {}),
    ("suffix.backend", "das", {}),
    ("suffix.backend", "vllm", {}),
    ("suffix.window_steps", 1, {}),
    ("suffix.window_steps", 16, {}),
    ("suffix.scope", "problem", {}),
    ("suffix.scope", "global", {}),
    ("suffix.scope", "both", {}),
    ("suffix.max_tree_depth", 1, {}),
    ("suffix.max_tree_depth", 4096, {}),
    ("suffix.max_match_len", 2, {}),
    ("suffix.max_spec_factor", 0.5, {}),
    ("suffix.max_spec_factor", 2.0, {}),
    ("suffix.min_token_prob", 0.0, {}),
    ("suffix.min_token_prob", 1.0, {}),
    ("suffix.max_memory_mb", 64.0, {}),
    ("suffix.max_memory_mb", 4096, {}),
    ("suffix.max_cached_requests", 0, {"suffix": {"backend": "vllm"}}),
    ("suffix.max_cached_requests", 500, {"suffix": {"backend": "vllm"}}),
    ("suffix.share_in_flight", "cold", {}),
    ("suffix.share_in_flight", "always", {}),
    ("suffix.share_in_flight", "off", {}),
    ("ngram.backend", "vllm", {}),
    ("ngram.backend", "specdec", {"enabled": True, "drafter": "ngram"}),
    ("ngram.prompt_lookup_min", 1, {}),
    ("ngram.prompt_lookup_min", 4, {}),
    ("ngram.prompt_lookup_max", 2, {}),
    ("ngram.prompt_lookup_max", 9, {}),
    ("draft_model.model", "/ckpt/draft", {}),
    ("draft_model.model", "Qwen/Qwen3-0.6B", {}),
    ("draft_model.model", None, {}),
    ("eagle3.model", "/ckpt/eagle3", {}),
    ("eagle3.model", None, {}),
    ("eagle3.draft_vocab_size", 32000, {"drafter": "eagle3", "eagle3": {"model": "/h"}}),  # checked on a local head
    ("eagle3.draft_vocab_size", None, {}),
    ("dflash.model", "/ckpt/dflash", {}),
    ("dflash.model", None, {}),
    ("hybrid.history", "suffix", {}),
    ("hybrid.model", "eagle3", {}),
    ("hybrid.model", "dflash", {}),
    ("hybrid.model_k", None, {}),
    ("hybrid.model_k", 3, {}),
    ("hybrid.tail_requests", None, {}),
    ("hybrid.tail_requests", 4, {}),
    ("refresh.mode", "rebuild", {"drafter": "suffix"}),
    ("refresh.mode", "frozen", {"drafter": "suffix"}),
    ("refresh.mode", "frozen", {"drafter": "ngram"}),
    ("refresh.mode", "online", {"drafter": "draft_model"}),
    ("refresh.mode", "refit", {"drafter": "draft_model"}),
    ("refresh.mode", "frozen", {"drafter": "draft_model"}),
    ("refresh.mode", "online", {"drafter": "eagle3"}),
    ("refresh.mode", "refit", {"drafter": "eagle3"}),
    ("refresh.mode", "frozen", {"drafter": "eagle3"}),
    ("refresh.mode", "refit", {"drafter": "mtp"}),
    ("refresh.mode", "online", {"drafter": "mtp"}),
    ("refresh.mode", "frozen", {"drafter": "mtp"}),
    ("refresh.every_n_steps", 1, {}),
    ("refresh.every_n_steps", 5, {"refresh": {"max_policy_lag": 4}}),  # lags up to 4 versions between refreshes
    ("refresh.max_policy_lag", 0, {}),
    ("refresh.max_policy_lag", 2, {}),
    ("refresh.distill.lr", 3e-4, {"drafter": "eagle3", "eagle3": {"model": "/h"}}),
    ("refresh.distill.epochs", 1, {"drafter": "draft_model", "draft_model": {"model": "/d"}}),
    ("refresh.distill.micro_batch_tokens", 2048, {"drafter": "draft_model", "draft_model": {"model": "/d"}}),
    ("refresh.distill.max_tokens", None, {"drafter": "draft_model", "draft_model": {"model": "/d"}}),
    ("refresh.distill.max_tokens", 65536, {"drafter": "eagle3", "eagle3": {"model": "/h"}}),
    ("refresh.distill.max_transient_gb", 4.0, {"drafter": "eagle3", "eagle3": {"model": "/h"}}),
    ("refresh.distill.max_transient_gb", None, {}),
    ("scheduling.placement", "contiguous", {}),
    ("scheduling.placement", "round_robin", {}),
    ("scheduling.placement", "length_aware", {}),
    ("scheduling.budget", "uniform", {}),
    ("scheduling.budget", "length_aware", {}),
    ("scheduling.budget", "das", {}),
    ("scheduling.budget", "adaptive", {"enabled": True, "drafter": "suffix"}),
    ("scheduling.k_by_batch_size", None, {}),
    ("scheduling.k_by_batch_size", [(1, 8, 8), (9, 32, 4), (33, 1024, 0)], {}),
    ("scheduling.k", None, {}),
    ("scheduling.k", "auto", {"enabled": True, "drafter": "draft_model", "draft_model": {"model": "/ckpt"}}),
    ("auto_disable", True, {"enabled": True, "drafter": "eagle3", "eagle3": {"model": "/h"},
                            "scheduling": {"k": "auto"}}),
    ("scheduling.long_fraction", 1.0, {"scheduling": {"short_fraction": 0.0}}),
    ("scheduling.long_fraction", 0.1, {}),
    ("scheduling.short_fraction", 0.0, {}),
    ("scheduling.short_fraction", 0.5, {}),
    ("on_refresh_error", "raise", {}),
    ("auto_disable", True, {"enabled": True, "drafter": "suffix"}),
    ("auto_disable", False, {"enabled": True, "drafter": "suffix"}),
    ("auto_disable", False, {"enabled": True, "drafter": "ngram"}),
    ("auto_disable", True, {"enabled": True, "drafter": "ngram", "ngram": {"backend": "specdec"}}),
    ("on_refresh_error", "disable", {}),
    ("resume", "carry", {}),
    ("resume", "fresh", {}),
]


@pytest.mark.parametrize("key,value,extra", ALLOWED, ids=[f"{k}={v!r}" for k, v, _ in ALLOWED])
def test_each_allowed_value_round_trips(key, value, extra):
    block = merge(extra, nested(key, value))
    spec = spec_of(block)
    assert getpath(spec, key) == value
    # JSON dump -> validate again gives the same block (what `validate` prints can be fed back)
    again = spec_of(json.loads(json.dumps(spec.model_dump(mode="json"))))
    assert again == spec
    assert getpath(again, key) == value


def test_allowed_values_cover_every_documented_key():
    assert {k for k, _, _ in ALLOWED} == leaf_keys(SpecDecConfig)


def test_yaml_lists_become_k_by_batch_size_tuples():
    spec = spec_of({"scheduling": {"k_by_batch_size": [[1, 4, 6], [5, 64, 2]]}})
    assert spec.scheduling.k_by_batch_size == [(1, 4, 6), (5, 64, 2)]


# --------------------------------------------------------------------------- refresh defaults per drafter

@pytest.mark.parametrize("drafter,mode", [
    ("suffix", "rebuild"), ("ngram", "frozen"), ("draft_model", "online"), ("eagle3", "online"), ("mtp", "refit"),
])
def test_default_refresh_mode_per_drafter(drafter, mode):
    assert spec_of({"drafter": drafter}).refresh.mode == mode


@pytest.mark.parametrize("key,value,backend,other", [
    ("window_steps", 8, "vllm", "das"), ("scope", "problem", "vllm", "das"), ("max_match_len", 8, "vllm", "das"),
    ("max_memory_mb", 64.0, "vllm", "das"), ("share_in_flight", "always", "vllm", "das"),
    ("max_cached_requests", 500, "das", "vllm"),
])
def test_suffix_keys_the_backend_does_not_read_are_refused(key, value, backend, other):
    with pytest.raises(ConfigError, match=rf"{B}\.suffix\.{key}: got .*its default .* with backend '{backend}': "
                                          rf"only backend '{other}' reads it"):
        spec_of({"drafter": "suffix", "suffix": {"backend": backend, key: value}})


def test_vllm_suffix_takes_no_rollouts_so_its_refresh_is_frozen():
    assert spec_of({"drafter": "suffix", "suffix": {"backend": "vllm"}}).refresh.mode == "frozen"
    with pytest.raises(ConfigError, match=rf"{B}\.refresh\.mode: got 'rebuild'; allowed: one of \['frozen'\] for "
                                          r"drafter 'suffix' with suffix.backend 'vllm'"):
        spec_of({"drafter": "suffix", "suffix": {"backend": "vllm"}, "refresh": {"mode": "rebuild"}})


def test_distill_settings_are_refused_outside_online_refresh():
    with pytest.raises(ConfigError, match=rf"{B}\.refresh\.distill\.lr: got 0.01.*refresh.mode 'online' only"):
        spec_of({"drafter": "suffix", "refresh": {"distill": {"lr": 0.01}}})
    spec = spec_of({"drafter": "draft_model", "draft_model": {"model": "/ckpt"}, "refresh": {"distill": {"lr": 0.01}}})
    assert spec.refresh.distill.lr == 0.01 and spec.refresh.distill.epochs == 2
    with pytest.raises(ConfigError, match=rf"{B}\.refresh\.distill\.max_tokens"):
        spec_of({"drafter": "eagle3", "eagle3": {"model": "/h"}, "refresh": {"distill": {"max_tokens": 0}}})


def test_with_spec_switching_drafter_takes_the_new_drafters_refresh_default():
    cfg = validate_run_dict(run_dict({"enabled": True, "drafter": "suffix"}))
    assert cfg.spec.refresh.mode == "rebuild"
    other = cfg.with_spec(drafter="draft_model", draft_model={"model": "/ckpt/draft"})
    assert other.spec.drafter == "draft_model"
    assert other.spec.refresh.mode == "online"
    # the original is untouched
    assert cfg.spec.drafter == "suffix"
    assert cfg.raw["policy"]["generation"]["speculative_decoding"]["drafter"] == "suffix"


def test_with_spec_keeps_an_explicit_refresh_mode_and_validates():
    cfg = validate_run_dict(run_dict({"enabled": True, "drafter": "suffix", "refresh": {"mode": "frozen"}}))
    assert cfg.with_spec(drafter="ngram").spec.refresh.mode == "frozen"
    with pytest.raises(ConfigError, match=rf"{B}\.num_speculative_tokens"):
        cfg.with_spec(num_speculative_tokens=0)


# --------------------------------------------------------------------------- vLLM speculative_config

def test_vllm_config_ngram():
    spec = spec_of({"enabled": True, "drafter": "ngram", "num_speculative_tokens": 5,
                    "ngram": {"prompt_lookup_min": 3, "prompt_lookup_max": 6}})
    assert to_vllm_speculative_config(spec) == {
        "method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 3, "prompt_lookup_max": 6,
    }


def test_vllm_config_suffix_das_is_our_custom_proposer():
    spec = spec_of({"enabled": True, "drafter": "suffix", "num_speculative_tokens": 12})
    assert to_vllm_speculative_config(spec) == {
        "method": "custom_class", "model": "nemo_rl_specdec.drafters.suffix.DASProposer", "num_speculative_tokens": 12,
    }


def test_vllm_config_suffix_vllm_backend():
    spec = spec_of({"enabled": True, "drafter": "suffix", "num_speculative_tokens": 16,
                    "suffix": {"backend": "vllm", "max_tree_depth": 32, "max_cached_requests": 100,
                               "max_spec_factor": 1.5, "min_token_prob": 0.2}})
    assert to_vllm_speculative_config(spec) == {
        "method": "suffix", "num_speculative_tokens": 16,
        "suffix_decoding_max_tree_depth": 32, "suffix_decoding_max_cached_requests": 100,
        "suffix_decoding_max_spec_factor": 1.5, "suffix_decoding_min_token_prob": 0.2,
    }


def test_vllm_config_draft_model():
    spec = spec_of({"enabled": True, "drafter": "draft_model", "num_speculative_tokens": 4,
                    "draft_model": {"model": "/ckpt/draft"}})
    assert to_vllm_speculative_config(spec, temperature=1.0) == {
        "method": "draft_model", "model": "/ckpt/draft", "num_speculative_tokens": 4,
        "draft_sample_method": "probabilistic",
    }


def test_vllm_config_eagle3():
    spec = spec_of({"enabled": True, "drafter": "eagle3", "num_speculative_tokens": 3,
                    "eagle3": {"model": "/ckpt/eagle3"}})
    assert to_vllm_speculative_config(spec, temperature=0.6) == {
        "method": "eagle3", "model": "/ckpt/eagle3", "num_speculative_tokens": 3,
        "draft_sample_method": "probabilistic",
    }


def test_vllm_config_mtp_reads_the_drafter_from_the_target():
    spec = spec_of({"enabled": True, "drafter": "mtp", "num_speculative_tokens": 2})
    assert to_vllm_speculative_config(spec, temperature=1.0) == {
        "method": "mtp", "num_speculative_tokens": 2, "draft_sample_method": "probabilistic",
    }


@pytest.mark.parametrize("drafter", ["suffix", "ngram", "draft_model", "eagle3", "mtp"])
def test_disabled_block_maps_to_no_speculation(drafter):
    spec = spec_of({"enabled": False, "drafter": drafter})
    assert to_vllm_speculative_config(spec) is None


MODEL_BLOCKS = {
    "draft_model": {"drafter": "draft_model", "draft_model": {"model": "/ckpt/draft"}},
    "eagle3": {"drafter": "eagle3", "eagle3": {"model": "/ckpt/eagle3"}},
    "mtp": {"drafter": "mtp"},
}


@pytest.mark.parametrize("drafter", sorted(MODEL_BLOCKS))
@pytest.mark.parametrize("temperature,expected", [(0.0, "greedy"), (0.3, "probabilistic"), (1.0, "probabilistic")])
def test_auto_draft_sampling_for_model_drafters(drafter, temperature, expected):
    spec = spec_of({"enabled": True, **MODEL_BLOCKS[drafter]})
    assert spec.draft_sample_method == "auto"
    assert draft_sample_method(spec, temperature) == expected
    assert to_vllm_speculative_config(spec, temperature)["draft_sample_method"] == expected


@pytest.mark.parametrize("drafter", sorted(MODEL_BLOCKS))
@pytest.mark.parametrize("method", ["greedy", "probabilistic"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_explicit_draft_sampling_wins_over_auto(drafter, method, temperature):
    spec = spec_of({"enabled": True, "draft_sample_method": method, **MODEL_BLOCKS[drafter]})
    assert to_vllm_speculative_config(spec, temperature)["draft_sample_method"] == method


def _is_list_drafter(spec) -> bool:
    """A drafter that may return any draft length per request (per-request budgets apply)."""
    return drafter_of(spec.drafter, Declared).kind == LIST


@pytest.mark.parametrize("drafter", ["suffix", "ngram"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_list_drafters_draft_greedily_and_pass_no_sample_method(drafter, temperature):
    spec = spec_of({"enabled": True, "drafter": drafter})
    assert _is_list_drafter(spec)
    assert draft_sample_method(spec, temperature) == "greedy"
    assert "draft_sample_method" not in to_vllm_speculative_config(spec, temperature)


def test_model_drafters_are_not_list_drafters():
    for block in MODEL_BLOCKS.values():
        assert not _is_list_drafter(spec_of(block))


@pytest.mark.parametrize("block", [
    {"drafter": "suffix"},
    {"drafter": "suffix", "suffix": {"backend": "vllm"}},
    {"drafter": "ngram"},
    *MODEL_BLOCKS.values(),
], ids=["suffix-das", "suffix-vllm", "ngram", *sorted(MODEL_BLOCKS)])
def test_k_by_batch_size_maps_to_vllm_per_batch_size_k(block):
    table = [[1, 8, 8], [9, 64, 3], [65, 4096, 0]]
    spec = spec_of({"enabled": True, **block, "num_speculative_tokens": 8, "scheduling": {"k_by_batch_size": table}})
    out = to_vllm_speculative_config(spec)
    assert out["num_speculative_tokens_per_batch_size"] == table
    assert out["num_speculative_tokens"] == 8


@pytest.mark.parametrize("block, k", [
    ({"drafter": "suffix"}, 24),
    ({"drafter": "suffix", "suffix": {"backend": "vllm"}}, 24),
    ({"drafter": "ngram"}, 8),
    ({"drafter": "suffix", "num_speculative_tokens": 8}, 8),
], ids=["suffix-das", "suffix-vllm", "ngram", "suffix-set"])
def test_unset_k_is_the_drafters_default_and_reaches_vllm(block, k):
    """num_speculative_tokens unset: the drafter's default (suffix: 24, vLLM's own for method suffix),
    which is what vLLM is started with; a value the block sets is kept, and a re-validated dump keeps it."""
    spec = spec_of({"enabled": True, **block})
    assert spec.num_speculative_tokens == k
    assert to_vllm_speculative_config(spec)["num_speculative_tokens"] == k
    assert spec_of(spec.model_dump()).num_speculative_tokens == k


def test_no_k_by_batch_size_means_no_per_batch_key():
    out = to_vllm_speculative_config(spec_of({"enabled": True, "drafter": "ngram"}))
    assert "num_speculative_tokens_per_batch_size" not in out


# ------------------------------------------------------------------- loading: resolver, interpolation, overrides

def test_tiny_cpu_run_file_loads():
    cfg = load_run_config(str(TINY))
    assert isinstance(cfg, RunConfig)
    assert cfg.source == str(TINY)
    assert cfg.spec.enabled and cfg.spec.drafter == "suffix"
    assert cfg.spec.scheduling.placement == "length_aware"
    assert cfg.generation.temperature == 1.0
    assert cfg.get("grpo.mode") == "sync"
    assert cfg.get("grpo.nope", "dflt") == "dflt"


def test_bare_run_file_name_is_found_in_configs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # away from the checkout: found in the bundled configs/ (resources.py)
    for name in ("tiny_cpu.yaml", "configs/tiny_cpu.yaml"):
        assert load_run_config(name).source == str(TINY)
    with pytest.raises(ConfigError, match=r"run file 'tiny_gpu\.yaml' not found \(looked in \., .*configs\)"):
        load_run_config("tiny_gpu.yaml")


def test_specdec_asset_resolver_gives_absolute_bundled_paths():
    cfg = load_run_config(str(TINY))
    assert cfg.model_path == str(asset_path("tiny", "policy"))
    assert cfg.spec.draft_model.model == str(asset_path("tiny", "draft"))
    assert Path(cfg.spec.eagle3.model).is_absolute()


def test_specdec_asset_resolver_in_a_user_file(tmp_path):
    p = write(tmp_path, """
        policy:
          model_name: ${specdec_asset:tiny/policy}
          generation:
            speculative_decoding:
              enabled: true
              drafter: draft_model
              draft_model: {model: "${specdec_asset:tiny/draft}"}
    """)
    cfg = load_run_config(str(p))
    assert to_vllm_speculative_config(cfg.spec)["model"] == str(asset_path("tiny", "draft"))


def test_interpolation_and_mul_resolver(tmp_path):
    p = write(tmp_path, """
        k: 4
        policy:
          model_name: m
          generation:
            temperature: 0.0
            speculative_decoding:
              enabled: true
              drafter: ngram
              num_speculative_tokens: ${k}
              ngram: {prompt_lookup_min: 2, prompt_lookup_max: "${mul:${k},2}"}
              scheduling:
                k_by_batch_size: [[1, 16, "${k}"], [17, 256, 1]]
    """)
    spec = load_run_config(str(p)).spec
    assert spec.num_speculative_tokens == 4
    assert spec.ngram.prompt_lookup_max == 8
    assert spec.scheduling.k_by_batch_size == [(1, 16, 4), (17, 256, 1)]


def test_missing_interpolation_target_is_a_config_error(tmp_path):
    p = write(tmp_path, """
        policy:
          model_name: m
          generation:
            speculative_decoding: {num_speculative_tokens: "${nowhere.k}"}
    """)
    with pytest.raises(ConfigError, match="nowhere"):
        load_run_config(str(p))


def test_override_of_a_top_level_key_of_the_block():
    cfg = load_run_config(str(TINY), [f"{B}.drafter=ngram", f"{B}.num_speculative_tokens=3"])
    assert cfg.spec.drafter == "ngram" and cfg.spec.num_speculative_tokens == 3
    assert cfg.spec.refresh.mode == "frozen"  # ngram's default, not suffix's
    assert to_vllm_speculative_config(cfg.spec)["method"] == "ngram"


def test_overrides_of_nested_keys():
    cfg = load_run_config(str(TINY), [
        f"{B}.refresh.mode=frozen",
        f"{B}.suffix.window_steps=2",
        f"{B}.suffix.scope=problem",
        f"{B}.scheduling.k_by_batch_size=[[1,4,8],[5,64,2]]",
        f"{B}.refresh.max_policy_lag=1",
    ])
    s = cfg.spec
    assert s.refresh.mode == "frozen" and s.refresh.max_policy_lag == 1
    assert s.suffix.window_steps == 2 and s.suffix.scope == "problem"
    assert s.suffix.backend == "das"  # untouched siblings keep the file's values
    assert s.scheduling.k_by_batch_size == [(1, 4, 8), (5, 64, 2)]
    assert s.scheduling.placement == "length_aware"


def test_override_outside_the_block_changes_the_translation():
    cfg = load_run_config(str(TINY), [f"{B}.drafter=draft_model", "policy.generation.temperature=0"])
    assert cfg.spec.refresh.mode == "online"
    assert to_vllm_speculative_config(cfg.spec, cfg.generation.temperature)["draft_sample_method"] == "greedy"


def test_later_override_wins_and_may_interpolate():
    cfg = load_run_config(str(TINY), [
        f"{B}.num_speculative_tokens=4",
        f"{B}.num_speculative_tokens=6",
        f"{B}.suffix.window_steps=${{{B}.num_speculative_tokens}}",
    ])
    assert cfg.spec.num_speculative_tokens == 6
    assert cfg.spec.suffix.window_steps == 6


def test_override_adding_a_new_valid_subkey(tmp_path):
    p = write(tmp_path, "policy: {model_name: m}\n")
    cfg = load_run_config(str(p), [f"{B}.enabled=true", f"{B}.drafter=mtp"])
    assert cfg.spec.enabled and cfg.spec.drafter == "mtp" and cfg.spec.refresh.mode == "refit"


# --------------------------------------------------------------------------- invalid blocks

# (id, block, full dotted path that must be in the message, fragments naming what is allowed)
INVALID = [
    ("drafter-unknown", {"drafter": "medusa"}, f"{B}.drafter",
     ["'suffix'", "'eagle3'", "'draft_model'", "'mtp'", "'ngram'", "medusa"]),
    ("enabled-string", {"enabled": "yes"}, f"{B}.enabled", ["valid boolean"]),
    ("enabled-int", {"enabled": 2}, f"{B}.enabled", ["valid boolean"]),
    ("k-zero", {"num_speculative_tokens": 0}, f"{B}.num_speculative_tokens", ["an integer from 1 to 64"]),
    ("k-too-big", {"num_speculative_tokens": 65}, f"{B}.num_speculative_tokens", ["an integer from 1 to 64"]),
    ("k-string", {"num_speculative_tokens": "8"}, f"{B}.num_speculative_tokens",
     ["got '8' (a string); allowed: an integer from 1 to 64"]),
    ("k-bool", {"num_speculative_tokens": True}, f"{B}.num_speculative_tokens",
     ["got True (a boolean); allowed: an integer"]),
    ("k-fraction", {"num_speculative_tokens": 2.5}, f"{B}.num_speculative_tokens",
     ["got 2.5 (a float); allowed: an integer"]),
    ("sample-method", {"draft_sample_method": "random"}, f"{B}.draft_sample_method",
     ["'auto'", "'greedy'", "'probabilistic'"]),
    ("on-refresh-error", {"on_refresh_error": "ignore"}, f"{B}.on_refresh_error", ["'raise'", "'disable'"]),
    ("typo-top", {"drafer": "ngram"}, f"{B}.drafer",
     ["unknown key", "did you mean 'drafter'", "num_speculative_tokens"]),
    ("typo-top-2", {"num_spec_tokens": 4}, f"{B}.num_spec_tokens", ["unknown key", "'num_speculative_tokens'"]),
    ("unknown-subblock", {"medusa": {"heads": 4}}, f"{B}.medusa", ["unknown key", "'eagle3'", "'mtp'"]),
    ("typo-suffix", {"suffix": {"window_step": 4}}, f"{B}.suffix.window_step",
     ["unknown key", "did you mean 'window_steps'"]),
    ("suffix-backend", {"suffix": {"backend": "arctic"}}, f"{B}.suffix.backend", ["'das'", "'vllm'"]),
    ("suffix-window", {"suffix": {"window_steps": 0}}, f"{B}.suffix.window_steps", ["an integer >= 1"]),
    ("suffix-scope", {"suffix": {"scope": "prompt"}}, f"{B}.suffix.scope", ["'problem'", "'global'", "'both'"]),
    ("suffix-depth", {"suffix": {"max_tree_depth": 5000}}, f"{B}.suffix.max_tree_depth",
     ["an integer from 1 to 4,096"]),
    ("suffix-spec-factor", {"suffix": {"max_spec_factor": 0}}, f"{B}.suffix.max_spec_factor", ["a finite number > 0"]),
    ("suffix-spec-factor-inf", {"suffix": {"max_spec_factor": float("inf")}}, f"{B}.suffix.max_spec_factor",
     ["got inf (a float); allowed: a finite number > 0"]),
    ("suffix-min-prob", {"suffix": {"min_token_prob": 1.5}}, f"{B}.suffix.min_token_prob",
     ["a finite number from 0 to 1"]),
    ("suffix-memory", {"suffix": {"max_memory_mb": -1}}, f"{B}.suffix.max_memory_mb", ["a finite number > 0"]),
    ("suffix-cached", {"suffix": {"max_cached_requests": -1}}, f"{B}.suffix.max_cached_requests",
     ["an integer >= 0"]),
    ("suffix-not-mapping", {"suffix": "das"}, f"{B}.suffix", ["valid dictionary"]),
    ("ngram-min", {"ngram": {"prompt_lookup_min": 0}}, f"{B}.ngram.prompt_lookup_min", ["an integer >= 1"]),
    ("ngram-order", {"ngram": {"prompt_lookup_min": 5, "prompt_lookup_max": 2}}, f"{B}.ngram.prompt_lookup_min",
     ["<= prompt_lookup_max (2)"]),
    ("typo-ngram", {"ngram": {"prompt_lookup_minimum": 1}}, f"{B}.ngram.prompt_lookup_minimum",
     ["unknown key", "'prompt_lookup_min'"]),
    ("draft-model-missing", {"enabled": True, "drafter": "draft_model"}, f"{B}.draft_model.model",
     ["checkpoint path", "'draft_model'"]),
    ("draft-model-empty", {"enabled": True, "drafter": "draft_model", "draft_model": {"model": ""}},
     f"{B}.draft_model.model", ["checkpoint path"]),
    ("draft-model-type", {"draft_model": {"model": 123}}, f"{B}.draft_model.model", ["valid string"]),
    ("typo-draft-model", {"draft_model": {"path": "/ckpt"}}, f"{B}.draft_model.path", ["unknown key", "'model'"]),
    ("eagle3-missing", {"enabled": True, "drafter": "eagle3"}, f"{B}.eagle3.model", ["checkpoint path", "'eagle3'"]),
    # the head's config names its aux layers and the policy checkpoint its MTP layers: no key would act
    ("eagle3-aux", {"eagle3": {"aux_layer_ids": [1, 2]}}, f"{B}.eagle3.aux_layer_ids", ["unknown key"]),
    ("typo-eagle3", {"eagle3": {"modle": "/ckpt"}}, f"{B}.eagle3.modle", ["unknown key", "did you mean 'model'"]),
    ("mtp-layers", {"mtp": {"num_layers": 1}}, f"{B}.mtp.num_layers", ["unknown key", "allowed keys: []"]),
    ("refresh-mode-unknown", {"refresh": {"mode": "sometimes"}}, f"{B}.refresh.mode",
     ["'frozen'", "'refit'", "'online'", "'rebuild'"]),
    ("refresh-suffix-refit", {"drafter": "suffix", "refresh": {"mode": "refit"}}, f"{B}.refresh.mode",
     ["['rebuild', 'frozen']", "'suffix'", "'refit'"]),
    ("refresh-ngram-online", {"drafter": "ngram", "refresh": {"mode": "online"}}, f"{B}.refresh.mode",
     ["['frozen']", "'ngram'"]),
    ("refresh-draft-rebuild", {"drafter": "draft_model", "refresh": {"mode": "rebuild"}}, f"{B}.refresh.mode",
     ["['online', 'refit', 'frozen']", "'draft_model'"]),
    ("refresh-eagle3-rebuild", {"drafter": "eagle3", "refresh": {"mode": "rebuild"}}, f"{B}.refresh.mode",
     ["['online', 'refit', 'frozen']", "'eagle3'"]),
    ("refresh-mtp-rebuild", {"drafter": "mtp", "refresh": {"mode": "rebuild"}}, f"{B}.refresh.mode",
     ["['refit', 'online', 'frozen']", "'mtp'"]),
    ("refresh-every", {"refresh": {"every_n_steps": 0}}, f"{B}.refresh.every_n_steps", ["an integer >= 1"]),
    ("refresh-cadence-beyond-lag", {"refresh": {"every_n_steps": 3, "max_policy_lag": 1}},
     f"{B}.refresh.max_policy_lag", [">= 2", "every_n_steps=3"]),
    ("refresh-lag", {"refresh": {"max_policy_lag": -1}}, f"{B}.refresh.max_policy_lag",
     ["an integer >= 0"]),
    ("typo-refresh", {"refresh": {"every_n_step": 2}}, f"{B}.refresh.every_n_step",
     ["unknown key", "did you mean 'every_n_steps'"]),
    ("refresh-not-mapping", {"refresh": 5}, f"{B}.refresh", ["valid dictionary"]),
    ("placement", {"scheduling": {"placement": "random"}}, f"{B}.scheduling.placement",
     ["'contiguous'", "'round_robin'", "'length_aware'"]),
    ("budget", {"scheduling": {"budget": "infinite"}}, f"{B}.scheduling.budget",
     ["'uniform'", "'length_aware'", "'das'", "'adaptive'"]),
    ("budget-adaptive-ngram", {"enabled": True, "drafter": "ngram", "scheduling": {"budget": "adaptive"}},
     f"{B}.scheduling.budget", ["uniform | length_aware | das for drafter 'ngram'", "suffix.backend: das"]),
    ("budget-adaptive-vllm-suffix", {"enabled": True, "drafter": "suffix", "suffix": {"backend": "vllm"},
                                     "refresh": {"mode": "frozen"}, "scheduling": {"budget": "adaptive"}},
     f"{B}.scheduling.budget", ["for drafter 'suffix'", "the DAS suffix drafter (suffix.backend: das)",
                                "ngram.backend: specdec"]),
    ("auto-disable-ngram", {"enabled": True, "drafter": "ngram", "auto_disable": True}, f"{B}.auto_disable",
     ["false or unset for drafter 'ngram'", "the DAS suffix drafter", "ngram.backend: specdec",
      "k_by_batch_size with k=0"]),
    ("auto-disable-off-under-adaptive", {"enabled": True, "auto_disable": False, "scheduling": {"budget": "adaptive"}},
     f"{B}.auto_disable", ["true or unset with scheduling.budget: adaptive"]),
    ("auto-disable-not-bool", {"auto_disable": "yes"}, f"{B}.auto_disable", ["valid boolean"]),
    ("ngram-backend", {"ngram": {"backend": "numba"}}, f"{B}.ngram.backend", ["'vllm'", "'specdec'"]),
    ("typo-scheduling", {"scheduling": {"k_by_batchsize": [[1, 2, 3]]}}, f"{B}.scheduling.k_by_batchsize",
     ["unknown key", "'k_by_batch_size'"]),
    ("scheduling-not-mapping", {"scheduling": []}, f"{B}.scheduling", ["valid dictionary"]),
    ("kbb-overlap", {"scheduling": {"k_by_batch_size": [[1, 8, 4], [4, 16, 2]]}}, f"{B}.scheduling.k_by_batch_size",
     ["entry 1", "ascending and not overlap"]),
    ("kbb-descending", {"scheduling": {"k_by_batch_size": [[9, 16, 2], [1, 8, 4]]}},
     f"{B}.scheduling.k_by_batch_size", ["entry 1", "ascending"]),
    ("kbb-k-above-num-spec", {"num_speculative_tokens": 4, "scheduling": {"k_by_batch_size": [[1, 8, 6]]}},
     f"{B}.scheduling.k_by_batch_size", ["<= num_speculative_tokens (4)"]),
    ("kbb-negative-k", {"scheduling": {"k_by_batch_size": [[1, 8, -1]]}}, f"{B}.scheduling.k_by_batch_size",
     ["k must be >= 0"]),
    ("kbb-lo-zero", {"scheduling": {"k_by_batch_size": [[0, 8, 2]]}}, f"{B}.scheduling.k_by_batch_size",
     ["1 <= lo <= hi"]),
    ("kbb-hi-below-lo", {"scheduling": {"k_by_batch_size": [[8, 4, 2]]}}, f"{B}.scheduling.k_by_batch_size",
     ["1 <= lo <= hi"]),
    ("kbb-short-entry", {"scheduling": {"k_by_batch_size": [[1, 8]]}}, f"{B}.scheduling.k_by_batch_size",
     ["[batch_lo, batch_hi, k]"]),
    ("kbb-float-entry", {"scheduling": {"k_by_batch_size": [[1, 8, 2.5]]}}, f"{B}.scheduling.k_by_batch_size",
     ["[batch_lo, batch_hi, k] of integers"]),
    ("kbb-not-list", {"scheduling": {"k_by_batch_size": "1-8:4"}}, f"{B}.scheduling.k_by_batch_size",
     ["list of [batch_lo, batch_hi, k]"]),
    ("long-fraction", {"scheduling": {"long_fraction": 0}}, f"{B}.scheduling.long_fraction",
     ["a finite number > 0 and <= 1"]),
    ("short-fraction", {"scheduling": {"short_fraction": 1.0}}, f"{B}.scheduling.short_fraction",
     ["a finite number >= 0 and < 1"]),
    ("fractions-sum", {"scheduling": {"long_fraction": 0.8, "short_fraction": 0.5}},
     f"{B}.scheduling.short_fraction", ["long_fraction + short_fraction must be <= 1"]),
]


@pytest.mark.parametrize("block,path,allowed", [i[1:] for i in INVALID], ids=[i[0] for i in INVALID])
def test_invalid_block_is_rejected_with_key_path_and_allowed_values(block, path, allowed):
    with pytest.raises(ConfigError) as ei:
        validate_run_dict(run_dict(block))
    msg = str(ei.value)
    # the full dotted path as a whole key (followed by ':'), not just a prefix of a longer key
    assert f"{path}:" in msg, msg
    for frag in allowed:
        assert frag in msg, (frag, msg)


# blocks whose problem is the block itself or the mapping that holds it
INVALID_RUN = [
    ("block-list", run_dict([{"enabled": True}]), B, ["a mapping"]),
    ("block-string", run_dict("suffix"), B, ["a mapping"]),
    ("block-null", {"policy": {"model_name": "m", "generation": {"speculative_decoding": None}}}, B, ["a mapping"]),
    ("block-name-typo", {"policy": {"model_name": "m", "generation": {"speculative_decodng": {"enabled": True}}}},
     "policy.generation.speculative_decodng", ["unknown key", "'speculative_decoding'"]),
    ("generation-typo", {"policy": {"model_name": "m", "generaton": {"speculative_decoding": {"enabled": True}}}},
     "policy.generaton", ["unknown key", "'generation'"]),
    ("generation-not-mapping", {"policy": {"model_name": "m", "generation": ["x"]}}, "policy.generation",
     ["a mapping"]),
]


@pytest.mark.parametrize("raw,path,allowed", [i[1:] for i in INVALID_RUN], ids=[i[0] for i in INVALID_RUN])
def test_invalid_block_placement_is_rejected(raw, path, allowed):
    with pytest.raises(ConfigError) as ei:
        validate_run_dict(raw)
    msg = str(ei.value)
    assert f"{path}:" in msg, msg
    for frag in allowed:
        assert frag in msg, (frag, msg)


def test_there_are_at_least_30_distinct_invalid_blocks():
    blocks = [json.dumps(b, sort_keys=True) for _, b, _, _ in INVALID]
    blocks += [json.dumps(r, sort_keys=True) for _, r, _, _ in INVALID_RUN]
    assert len(set(blocks)) == len(blocks) >= 30


def test_every_problem_in_a_block_is_reported_at_once():
    with pytest.raises(ConfigError) as ei:
        validate_run_dict(run_dict({"drafter": "medusa", "refresh": {"mod": "x"}, "suffix": {"scope": "all"}}))
    msg = str(ei.value)
    for path in (f"{B}.drafter:", f"{B}.refresh.mod:", f"{B}.suffix.scope:"):
        assert path in msg


def test_error_message_shows_the_bad_value():
    with pytest.raises(ConfigError, match=r"got 'sometimes'"):
        validate_run_dict(run_dict({"refresh": {"mode": "sometimes"}}))


def test_disabled_block_still_rejects_typos_and_bad_modes():
    with pytest.raises(ConfigError, match=rf"{B}\.refresh\.mode"):
        validate_run_dict(run_dict({"enabled": False, "drafter": "ngram", "refresh": {"mode": "refit"}}))
    with pytest.raises(ConfigError, match=rf"{B}\.enabeld"):
        validate_run_dict(run_dict({"enabeld": False}))


def test_disabled_model_drafter_may_omit_its_checkpoint():
    spec = spec_of({"enabled": False, "drafter": "draft_model"})
    assert spec.draft_model.model is None and to_vllm_speculative_config(spec) is None


def test_run_file_without_policy_or_model_name():
    with pytest.raises(ConfigError, match="policy"):
        validate_run_dict({"grpo": {}})
    with pytest.raises(ConfigError, match=r"policy\.model_name"):
        validate_run_dict({"policy": {"generation": {}}})


def test_assignment_is_validated_too():
    spec = SpecDecConfig()
    with pytest.raises(ValueError):
        spec.num_speculative_tokens = 0
    with pytest.raises(ValueError):
        spec.refresh.mode = "sometimes"


# --------------------------------------------------------------------------- invalid files and overrides

def test_typo_in_an_override_key_is_not_ignored():
    with pytest.raises(ConfigError) as ei:
        load_run_config(str(TINY), [f"{B}.refresh.mod=frozen"])
    assert f"{B}.refresh.mod:" in str(ei.value) and "did you mean 'mode'" in str(ei.value)


def test_share_in_flight_off_written_unquoted_in_yaml_is_off(tmp_path):
    """YAML 1.1 reads `off` as false; the setting's value `off` must still be what arrives."""
    f = tmp_path / "run.yaml"
    f.write_text("policy:\n  model_name: org/policy\n  generation:\n    speculative_decoding:\n"
                 "      suffix:\n        share_in_flight: off\n")
    assert load_run_config(str(f)).spec.suffix.share_in_flight == "off"
    assert load_run_config("tiny_cpu.yaml", [f"{B}.suffix.share_in_flight=off"]).spec.suffix.share_in_flight == "off"
    with pytest.raises(ConfigError, match=rf"{B}\.suffix\.share_in_flight: got True"):
        load_run_config("tiny_cpu.yaml", [f"{B}.suffix.share_in_flight=on"])


def test_bad_value_in_an_override_names_the_key():
    with pytest.raises(ConfigError) as ei:
        load_run_config(str(TINY), [f"{B}.drafter=medusa"])
    assert f"{B}.drafter:" in str(ei.value) and "'ngram'" in str(ei.value)


def test_override_making_the_refresh_mode_unfit():
    with pytest.raises(ConfigError, match=rf"{B}\.refresh\.mode: got 'rebuild'.*'draft_model'"):
        load_run_config(str(TINY), [f"{B}.drafter=draft_model", f"{B}.refresh.mode=rebuild"])


def test_hydra_style_plus_overrides_add_or_override_keys():
    """`+key=value` / `++key=value`, as NeMo-RL's CLI takes them, merge like `key=value` (they
    used to create a literal key named `+bench`)."""
    cfg = load_run_config(str(TINY), ["+bench.das.steps=7", f"++{B}.num_speculative_tokens=3"])
    assert cfg.get("bench.das.steps") == 7 and "+bench" not in cfg.raw
    assert cfg.spec.num_speculative_tokens == 3
    with pytest.raises(ConfigError, match="did you mean|allowed"):
        load_run_config(str(TINY), [f"+{B}.num_speculative_tokenz=3"])  # adding a key does not bypass the schema


@pytest.mark.parametrize("override,fragment", [
    (f"{B}.drafter", "expected key=value"),
    ("=ngram", "expected key=value"),
    ("+++x=1", "expected key=value"),
    ("~x=1", "expected key=value"),
    (f"{B}.scheduling.k_by_batch_size=[[1,4,2]", f"{B}.scheduling.k_by_batch_size=[[1,4,2]"),
])
def test_bad_override_syntax(override, fragment):
    with pytest.raises(ConfigError) as ei:
        load_run_config(str(TINY), [override])
    assert "override" in str(ei.value) and fragment in str(ei.value)


def test_override_below_a_scalar_is_rejected():
    with pytest.raises(ConfigError, match=rf"{B}\.enabled"):
        load_run_config(str(TINY), [f"{B}.enabled.really=true"])


def test_malformed_yaml_is_a_config_error(tmp_path):
    p = write(tmp_path, "policy: {model_name: m\n  generation: [\n")
    with pytest.raises(ConfigError, match=str(p)):
        load_run_config(str(p))


def test_missing_run_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_run_config(str(tmp_path / "nope.yaml"))


def test_typo_in_a_yaml_file(tmp_path):
    p = write(tmp_path, """
        policy:
          model_name: m
          generation:
            speculative_decoding:
              enabled: true
              scheduling: {placement: length_aware, budgt: das}
    """)
    with pytest.raises(ConfigError, match=rf"{B}\.scheduling\.budgt: unknown key"):
        load_run_config(str(p))


# --------------------------------------------------------------------------- CLI

def test_cli_validate_ok(capsys):
    assert cli.main(["validate", str(TINY)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["source"] == str(TINY)
    assert out["speculative_decoding"]["drafter"] == "suffix"
    assert out["speculative_decoding"]["refresh"]["mode"] == "rebuild"
    assert out["vllm_speculative_config"] == {
        "method": "custom_class", "model": "nemo_rl_specdec.drafters.suffix.DASProposer", "num_speculative_tokens": 24,
    }


def test_cli_validate_with_overrides(capsys):
    rc = cli.main(["validate", str(TINY), f"{B}.drafter=draft_model", f"{B}.num_speculative_tokens=4",
                   f"{B}.scheduling.k_by_batch_size=[[1,8,4],[9,64,0]]"])
    assert rc == 0
    vcfg = json.loads(capsys.readouterr().out)["vllm_speculative_config"]
    assert vcfg == {
        "method": "draft_model", "model": str(asset_path("tiny", "draft")),
        "num_speculative_tokens": 4, "draft_sample_method": "probabilistic",
        "num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 64, 0]],
    }


def test_cli_validate_greedy_rollouts_draft_greedily(capsys):
    assert cli.main(["validate", str(TINY), f"{B}.drafter=eagle3", "policy.generation.temperature=0"]) == 0
    assert json.loads(capsys.readouterr().out)["vllm_speculative_config"]["draft_sample_method"] == "greedy"


def test_cli_validate_disabled_prints_null_config(capsys):
    assert cli.main(["validate", str(TINY), f"{B}.enabled=false"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["speculative_decoding"]["enabled"] is False and out["vllm_speculative_config"] is None


def test_cli_validate_invalid_exits_2_with_the_key_path(capsys):
    assert cli.main(["validate", str(TINY), f"{B}.refresh.mode=refit"]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err.startswith("error:")
    assert f"{B}.refresh.mode:" in cap.err and "['rebuild', 'frozen']" in cap.err


def test_cli_validate_invalid_file_exits_2(capsys, tmp_path):
    p = write(tmp_path, """
        policy:
          model_name: m
          generation:
            speculative_decoding: {enabled: true, refresh: {mode: rebuild, every_n_step: 1}}
    """)
    assert cli.main(["validate", str(p)]) == 2
    assert f"{B}.refresh.every_n_step:" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["validate", str(TINY), f"{B}.drafter"],          # override without '='
    ["validate", str(TINY), "--frobnicate"],           # unknown option
    ["validate", "/nonexistent/run.yaml"],             # missing file
])
def test_cli_validate_bad_arguments_exit_2(capsys, argv):
    assert cli.main(argv) == 2
    assert "error" in capsys.readouterr().err


def test_cli_validate_imports_no_engine():
    code = (
        "import sys, io, contextlib\n"
        "from nemo_rl_specdec.cli import main\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        f"    rc = main(['validate', {str(TINY)!r}, '{B}.drafter=draft_model'])\n"
        "assert rc == 0, rc\n"
        "assert 'vllm_speculative_config' in buf.getvalue()\n"
        "heavy = sorted(m for m in ('vllm', 'torch', 'ray', 'transformers', 'nemo_rl') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "HEAVY []" in res.stdout, res.stdout


# --------------------------------------------------------------------------- docs stay in sync

@pytest.mark.parametrize("block, on", [
    ({"enabled": True}, True),                                       # DAS judges every step itself
    ({"enabled": True, "drafter": "ngram"}, False),                  # vLLM's proposer: k fixed at start
    ({"enabled": True, "drafter": "ngram", "ngram": {"backend": "specdec"}}, True),  # ours: judges each step
    ({"enabled": True, "suffix": {"backend": "vllm"}, "refresh": {"mode": "frozen"}}, False),
    ({"enabled": True, "drafter": "draft_model", "draft_model": {"model": "/d"}}, False),
])
def test_auto_disable_defaults_to_on_where_the_drafter_judges_each_step(block, on):
    assert SpecDecConfig(**block).auto_disable is on


def test_reference_doc_documents_every_key():
    text = DOC.read_text()
    missing = [k for k in sorted(leaf_keys(SpecDecConfig)) if f"`{k}`" not in text]
    assert not missing, f"docs/configuration.md lacks: {missing}"


# --------------------------------------------------------------------------- scheduling.k: auto

DM = {"enabled": True, "drafter": "draft_model", "draft_model": {"model": "/ckpt"}}


def test_k_auto_turns_auto_disable_on_and_starts_vllm_in_its_per_batch_size_mode():
    spec = spec_of(merge(DM, {"num_speculative_tokens": 6, "scheduling": {"k": "auto"}}))
    assert spec.auto_disable is True
    assert to_vllm_speculative_config(spec)["num_speculative_tokens_per_batch_size"] == [[1, 1, 6]]
    assert spec_of(merge(DM, {"scheduling": {"k": "auto"}, "auto_disable": False})).auto_disable is False
    assert "num_speculative_tokens_per_batch_size" not in to_vllm_speculative_config(spec_of(DM))


@pytest.mark.parametrize("block,key,allowed", [
    ({"scheduling": {"k": "automatic"}}, r"scheduling\.k", "auto"),
    ({"scheduling": {"k": 4}}, r"scheduling\.k", "auto"),
    ({"enabled": True, "drafter": "suffix", "scheduling": {"k": "auto"}}, r"scheduling\.k", "budget: adaptive"),
    ({"enabled": True, "drafter": "ngram", "scheduling": {"k": "auto"}}, r"scheduling\.k", "model drafter"),
    (merge(DM, {"scheduling": {"k": "auto", "k_by_batch_size": [[1, 4, 2]]}}), r"scheduling\.k_by_batch_size",
     "null with scheduling.k: auto"),
    (merge(DM, {"scheduling": {"k": "auto", "budget": "length_aware"}}), r"scheduling\.budget", "uniform"),
])
def test_bad_k_auto_is_refused_with_its_key_path(block, key, allowed):
    with pytest.raises(ConfigError, match=rf"{B}\.{key}(?s:.*){allowed}"):
        spec_of(block)


def test_auto_disable_on_a_model_drafter_points_to_k_auto():
    with pytest.raises(ConfigError, match=rf"{B}\.auto_disable(?s:.*)scheduling\.k: auto"):
        spec_of(merge(DM, {"auto_disable": True}))


@pytest.mark.parametrize("block, budget", [
    ({}, "adaptive"),                                                       # DAS: our proposer judges each step
    ({"auto_disable": False}, "uniform"),                                   # every draft verified
    ({"suffix": {"backend": "vllm"}}, "uniform"),                           # vLLM's proposer: nothing judges steps
    ({"drafter": "ngram"}, "uniform"),
    ({"drafter": "ngram", "ngram": {"backend": "specdec"}}, "adaptive"),
    ({"drafter": "draft_model", "draft_model": {"model": "/d"}}, "uniform"),
    ({"scheduling": {"budget": "length_aware"}}, "length_aware"),           # a budget written is kept
])
def test_an_unset_budget_is_adaptive_where_our_proposer_judges_each_step(block, budget):
    assert spec_of({"enabled": True, **block}).scheduling.budget == budget
    assert spec_of({"enabled": False, **block}).scheduling.budget == budget


def test_adaptive_written_with_auto_disable_off_is_still_refused():
    with pytest.raises(ConfigError, match=r"auto_disable.*true or unset with scheduling.budget: adaptive"):
        spec_of({"enabled": True, "auto_disable": False, "scheduling": {"budget": "adaptive"}})
