"""Eagle3's draft vocabulary: chosen from response-token frequencies, kept across steps, exported with
the d2t/t2d maps vLLM reads, and each bad input refused naming the key (a size above the policy's
vocabulary, a size the checkpoint does not have, a d2t or t2d that does not fit it)."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from nemo_rl_specdec.bench.distill import random_rollouts
from nemo_rl_specdec.config.run import ConfigError, validate_run_dict
from nemo_rl_specdec.drafters.eagle3 import Eagle3Distiller, choose_draft_vocab, load_head
from nemo_rl_specdec.resources import asset_path
from nemo_rl_specdec.train.distill import DistillInputError

HEAD = str(asset_path("tiny", "eagle3"))  # over the tiny policy's whole 128-token vocabulary


def test_the_most_frequent_tokens_are_chosen_in_ascending_order_ties_to_the_smaller_id():
    counts = torch.tensor([0, 5, 2, 5, 9, 2, 0])
    assert choose_draft_vocab(counts, 3).tolist() == [1, 3, 4]
    assert choose_draft_vocab(counts, 4).tolist() == [1, 2, 3, 4]
    with pytest.raises(ValueError, match=r"eagle3\.draft_vocab_size: got 8; allowed: 1 \.\. 7"):
        choose_draft_vocab(counts, 8)


@pytest.fixture(scope="module")
def policy():
    return AutoModelForCausalLM.from_pretrained(str(asset_path("tiny", "policy")), dtype=torch.float32)


@pytest.fixture(scope="module")
def reduced(policy, tmp_path_factory):
    """The bundled head distilled with a 48-token draft vocabulary for two steps, and saved."""
    rollouts = random_rollouts([(8, 40)] * 4, policy.config.vocab_size, seed=3)
    d = Eagle3Distiller(HEAD, draft_vocab_size=48, epochs=1, micro_batch_tokens=96, max_tokens=None)
    d.step(policy, rollouts)
    first = d.state_dict()
    d.step(policy, random_rollouts([(8, 40)] * 4, policy.config.vocab_size, seed=4))
    out = tmp_path_factory.mktemp("eagle3_vocab") / "head"
    d.save(out)
    return d, rollouts, first, out


def test_the_vocabulary_is_chosen_at_the_first_step_and_kept(reduced):
    d, rollouts, first, _ = reduced
    counts = torch.bincount(torch.tensor([t for r in rollouts for t in r["token_ids"]]), minlength=128)
    ids = (torch.arange(48) + first["d2t"]).tolist()
    assert ids == choose_draft_vocab(counts, 48).tolist()
    now = d.state_dict()
    assert torch.equal(now["d2t"], first["d2t"]) and now["lm_head.weight"].shape == (48, 192)
    assert now["t2d"].sum() == 48 and now["t2d"][ids].all()


def test_the_saved_head_loads_with_its_maps(reduced):
    d, _, _, out = reduced
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["vocab_size"], cfg["draft_vocab_size"]) == (128, 48)
    head, _ = load_head(out)
    assert head.lm_head.out_features == 48 and torch.equal(head.d2t, d.module.d2t.cpu())
    # a distiller from the saved head keeps its map; another size is refused naming the key
    assert Eagle3Distiller(out, epochs=1).draft_vocab_size == 48
    with pytest.raises(DistillInputError, match=r"eagle3\.draft_vocab_size: got 32, .* draft vocabulary of 48"):
        Eagle3Distiller(out, draft_vocab_size=32)


@pytest.mark.parametrize("corrupt, match", [
    (lambda t: t.pop("d2t"), "no d2t tensor"),
    (lambda t: t.__setitem__("d2t", t["d2t"][:-1]), r"d2t is int64 \[47\]; allowed: integers of shape \[48\]"),
    (lambda t: t.__setitem__("d2t", torch.tensor([0, -1] + [0] * 46)), "48 distinct policy ids"),  # ids 0, 0, ...
    (lambda t: t.__setitem__("d2t", t["d2t"] + 200), r"in \[0, 128\)"),
    (lambda t: t.__setitem__("t2d", torch.ones(128, dtype=torch.bool)), "t2d does not match d2t"),
])
def test_a_map_that_does_not_fit_the_checkpoint_is_refused(reduced, corrupt, match, tmp_path):
    _, _, _, out = reduced
    tensors = load_file(str(out / "model.safetensors"))
    corrupt(tensors)
    (tmp_path / "config.json").write_text((out / "config.json").read_text())
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"eagle3\.model: .*" + match):
        load_head(tmp_path)


def _spec(**eagle3):
    return {"enabled": True, "drafter": "eagle3", "eagle3": {"model": HEAD, **eagle3}}


def _validate(block: dict):
    run = {"policy": {"model_name": "some/policy", "generation": {"temperature": 1.0, "speculative_decoding": block}}}
    return validate_run_dict(run).spec


def test_the_block_checks_the_size_against_the_head():
    assert _validate(_spec(draft_vocab_size=128)).eagle3.draft_vocab_size == 128
    key = r"policy\.generation\.speculative_decoding\.eagle3\.draft_vocab_size"
    with pytest.raises(ConfigError, match=key + r": got 200; allowed: <= 128, the policy's vocabulary"):
        _validate(_spec(draft_vocab_size=200))
    with pytest.raises(ConfigError, match=key + r": got 64; allowed: 128, the draft vocabulary of the head"):
        _validate(_spec(draft_vocab_size=64))


def test_a_size_above_the_policys_vocabulary_is_refused_by_the_distiller():
    with pytest.raises(DistillInputError, match=r"eagle3\.draft_vocab_size: got 129; allowed: <= 128"):
        Eagle3Distiller(HEAD, draft_vocab_size=129)
