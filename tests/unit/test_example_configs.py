"""Every run file in configs/ passes `nemo-rl-specdec validate`; the NeMo-RL example runs are
also consistent with what NeMo-RL 0.6.0 requires of them (checked without NeMo-RL: the rules
below are the ones NeMo-RL's GRPO entry and setup enforce, see docs/nemo_rl.md)."""
from __future__ import annotations

import json

import pytest

from nemo_rl_specdec import cli
from nemo_rl_specdec.adapter import translate
from nemo_rl_specdec.config import loader as config_loader
from nemo_rl_specdec.config.run import to_vllm_speculative_config
from nemo_rl_specdec.resources import configs_dir

ALL = sorted(configs_dir().glob("*.yaml"))
NEMO_RL_RUNS = [p for p in ALL if any(line.startswith("defaults: " + config_loader.NEMO_RL_PREFIX)
                                      for line in p.read_text().splitlines())]

EXPECTED_METHOD = {
    "suffix": "custom_class",
    "ngram": "ngram",
    "eagle3": "eagle3",
    "draft_model": "draft_model",
    "mtp": "mtp",
}


def test_the_bundled_run_files_are_found():
    assert {"tiny_cpu.yaml", "tiny_mtp_cpu.yaml", "smollm2_cpu.yaml"} <= {p.name for p in ALL}, configs_dir()
    assert len(NEMO_RL_RUNS) >= len(EXPECTED_METHOD)


def test_there_are_example_runs_for_every_drafter_and_both_pipelines():
    drafters = set()
    modes = set()
    for p in NEMO_RL_RUNS:
        raw = config_loader.compose(p).resolved()
        drafters.add(raw["policy"]["generation"]["speculative_decoding"]["drafter"])
        modes.add(bool(raw.get("grpo", {}).get("async_grpo", {}).get("enabled")))
    assert drafters == set(EXPECTED_METHOD)
    assert modes == {False, True}


@pytest.mark.parametrize("path", ALL, ids=[p.name for p in ALL])
def test_validate_accepts_every_config(path, capsys):
    assert cli.main(["validate", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    block = out["speculative_decoding"]
    if block["enabled"]:
        assert out["vllm_speculative_config"]["num_speculative_tokens"] == block["num_speculative_tokens"]


@pytest.mark.parametrize("path", NEMO_RL_RUNS, ids=[p.name for p in NEMO_RL_RUNS])
def test_nemo_rl_example_is_consistent(path):
    composed = config_loader.compose(path)
    assert composed.uses_nemo_rl_parent  # inherits NeMo-RL's own base config
    raw = composed.resolved()
    spec = translate.check_run(raw)      # what run_grpo checks before importing NeMo-RL
    assert spec is not None and spec.enabled
    policy, grpo = raw["policy"], raw.get("grpo", {})
    gen = policy["generation"]

    exports = bool(policy.get("draft", {}).get("enabled"))
    trains_mtp = bool(policy.get("megatron_cfg", {}).get("mtp_num_layers"))
    out, has_refit = translate.apply_to_generation_config(dict(gen), exports, trains_mtp)
    sc = out["vllm_kwargs"]["speculative_config"]
    assert sc == to_vllm_speculative_config(spec, gen.get("temperature", 1.0))
    assert sc["method"] == EXPECTED_METHOD[spec.drafter]
    source = translate.drafter_weight_source(spec, exports, trains_mtp)
    if spec.drafter in ("suffix", "ngram") or source == translate.SOURCE_REFIT_STREAM:
        assert has_refit  # NeMo-RL keeps load_format=dummy: no extra full load from disk

    if spec.drafter == "eagle3":
        assert exports and policy["draft"]["model_name"] == spec.eagle3.model
        assert policy["megatron_cfg"]["enabled"] and not policy.get("sequence_packing", {}).get("enabled")
    if spec.drafter == "mtp" and spec.refresh.mode == "refit":
        assert trains_mtp and policy["megatron_cfg"]["enabled"]
    if spec.drafter == "draft_model":
        assert spec.draft_model.model and spec.refresh.mode == "online"

    # sizes NeMo-RL checks at setup
    assert gen["max_new_tokens"] <= gen["vllm_cfg"]["max_model_len"] == policy["max_total_sequence_length"]
    assert gen["vllm_cfg"]["max_model_len"] > spec.num_speculative_tokens + 1

    if grpo.get("async_grpo", {}).get("enabled"):
        # NeMo-RL: async GRPO needs async vLLM engines on their own GPUs, importance-sampling
        # correction, and no dynamic sampling / reward scaling / reward shaping.
        assert gen["vllm_cfg"]["async_engine"] is True
        assert gen["colocated"]["enabled"] is False
        assert raw["loss_fn"]["use_importance_sampling_correction"] is True
        assert not grpo.get("use_dynamic_sampling")
        assert not grpo.get("reward_scaling", {}).get("enabled")
        assert not grpo.get("reward_shaping", {}).get("enabled")
        assert spec.refresh.max_policy_lag >= 1
    else:
        assert spec.refresh.max_policy_lag == 0

    cluster = raw["cluster"]
    total = cluster["gpus_per_node"] * cluster["num_nodes"]
    tp = gen["vllm_cfg"]["tensor_parallel_size"]
    if gen.get("colocated", {}).get("enabled", True):
        assert total % tp == 0
    else:
        res = gen["colocated"]["resources"]
        inference = res["gpus_per_node"] * res["num_nodes"]
        assert inference < total and inference % tp == 0
    if raw["grpo"].get("num_prompts_per_step") and policy.get("train_global_batch_size"):
        per_step = grpo["num_prompts_per_step"] * grpo["num_generations_per_prompt"]
        assert per_step % policy["train_global_batch_size"] == 0
