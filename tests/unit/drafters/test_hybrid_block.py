"""The hybrid drafter's block: parts that cannot be combined are refused at validation with the key
path and the reason; a valid block maps to the model part's vLLM method, greedy, with vLLM's
synchronous scheduling; the model part's refresh modes govern both halves."""
from __future__ import annotations

import json

import pytest

from nemo_rl_specdec.config.run import BLOCK_PATH as B, ConfigError, load_run_config, to_vllm_speculative_config
from nemo_rl_specdec.drafters.hybrid import ModelAcceptance
from nemo_rl_specdec.drafters.registry import drafter
from nemo_rl_specdec.drafters.roles import Declared, ModelWeights, Refreshable, VllmMapping

RUN = "configs/tiny_cpu.yaml"


def _cfg(*over: str):
    return load_run_config(RUN, [f"{B}.enabled=true", f"{B}.drafter=hybrid", *[f"{B}.{o}" for o in over]])


@pytest.mark.parametrize("over, path, why", [
    (["hybrid.model=ngram"], "hybrid.model", "'ngram' is a history drafter"),
    (["hybrid.model=suffix"], "hybrid.model", "'suffix' is a history drafter"),
    (["hybrid.history=ngram"], "hybrid.history", "only DAS drafts"),
    (["hybrid.history=eagle3"], "hybrid.history", "'eagle3' is a model drafter"),
    (["hybrid.model=hybrid"], "hybrid.model", "one of"),
    (["hybrid.model=eagle3", "eagle3.model=null"], "eagle3.model", "a checkpoint path"),
    (["hybrid.model=draft_model", "draft_model.model=null"], "draft_model.model", "a checkpoint path"),
    (["suffix.backend=vllm", "suffix.max_cached_requests=10000"], "suffix.backend", "'das' with drafter 'hybrid'"),
    (["draft_sample_method=probabilistic"], "draft_sample_method", "history drafts have none"),
    (["scheduling.k=auto", "scheduling.budget=uniform"], "scheduling.k", "null with drafter 'hybrid'"),
    (["num_speculative_tokens=4", "hybrid.model_k=5"], "hybrid.model_k", "at most num_speculative_tokens (4)"),
    (["hybrid.tail_requests=0"], "hybrid.tail_requests", "an integer >= 1 or null"),
    (["hybrid.tail_requests=2.5"], "hybrid.tail_requests", "an integer >= 1 or null"),
    (["hybrid.model=dflash", "refresh.mode=refit"], "refresh.mode", "model part 'dflash'"),
])
def test_parts_that_cannot_be_combined_are_refused_with_the_key_path(over, path, why):
    with pytest.raises(ConfigError) as e:
        _cfg(*over)
    msg = str(e.value)
    assert f"{B}.{path}" in msg and why in msg, msg


def test_mtp_as_the_model_part_needs_a_policy_with_mtp_layers(tmp_path):
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    with pytest.raises(ConfigError, match=rf"{B}\.hybrid\.model: got 'mtp'.*no MTP layers"):
        load_run_config(RUN, [f"policy.model_name={policy}", f"{B}.enabled=true", f"{B}.drafter=hybrid",
                              f"{B}.hybrid.model=mtp"])
    (policy / "config.json").write_text(json.dumps({"num_nextn_predict_layers": 1}))
    assert load_run_config(RUN, [f"policy.model_name={policy}", f"{B}.enabled=true", f"{B}.drafter=hybrid",
                                 f"{B}.hybrid.model=mtp"]).spec.hybrid.model == "mtp"


def d_args(spec) -> dict:
    return drafter(spec, VllmMapping).engine_args(spec)


@pytest.mark.parametrize("model", ["eagle3", "dflash", "draft_model"])
def test_the_block_maps_to_the_model_parts_method_greedy_and_synchronous(model):
    spec = _cfg(f"hybrid.model={model}").spec
    sc = to_vllm_speculative_config(spec, temperature=1.0)
    assert sc["method"] == model and sc["model"] == getattr(spec, model).model
    assert sc["draft_sample_method"] == "greedy" and "disable_padded_drafter_batch" not in sc  # vLLM's padded path
    assert d_args(spec) == {"async_scheduling": False}  # list drafts need synchronous scheduling
    d = drafter(spec, Refreshable)
    assert drafter(spec, Declared).checkpoint(spec) == getattr(spec, model).model
    assert drafter(spec, ModelWeights) is drafter(model, ModelWeights)  # its weights are the model part's
    # the store takes rollouts
    assert d.rollout_prompt_tail(spec) == drafter("suffix", Refreshable).rollout_prompt_tail(spec)


def test_the_model_parts_refresh_modes_govern_both_halves():
    assert _cfg().spec.refresh.mode == "online"  # eagle3's default
    assert _cfg("refresh.mode=refit").spec.refresh.mode == "refit"
    assert _cfg("hybrid.model=dflash").spec.refresh.mode == "online"
    with pytest.raises(ConfigError, match=rf"{B}\.refresh\.mode: got 'rebuild'"):
        _cfg("refresh.mode=rebuild")


def test_model_acceptance_is_the_marginal_by_position_and_never_rises():
    m = ModelAcceptance(3)
    assert m.rates().tolist() == [0.5, 0.5, 0.5]  # the prior where nothing was verified yet
    for _ in range(9):
        m.record(3, 1)  # first token accepted, second rejected
    m.record(2, 2)
    r = m.rates()
    assert r[0] == pytest.approx(10.5 / 11) and r[1] == pytest.approx(1.5 / 11)
    assert r[2] <= r[1]  # position 3 was drafted 9 times, never accepted: and cut to the running minimum


def test_the_choice_keeps_trying_a_model_half_verified_on_few_drafts_and_drops_one_that_keeps_missing():
    """The weights the per-step choice reads (`optimistic`): one early miss (a tail-only model half
    sees a few dozen drafts a rollout) leaves the first position above the prior's 0.5, where the
    plain estimate falls to 0.25 and the model would never be drafted, so never measured, again;
    twenty misses bring it near its estimate; with many drafts the two agree."""
    m = ModelAcceptance(2)
    m.record(2, 0)
    assert m.rates()[0] == pytest.approx(0.25) and m.optimistic()[0] > 0.5
    for _ in range(19):
        m.record(2, 0)
    assert m.optimistic()[0] < 0.1 and m.optimistic()[0] >= m.rates()[0]
    many = ModelAcceptance(1)
    for i in range(2000):
        many.record(1, i % 2)
    assert many.optimistic()[0] - many.rates()[0] < 0.02
