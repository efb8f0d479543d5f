"""Online Eagle3 / MTP head distillation (no engine): isolation, export names, learning, bad input.

Runs on the bundled tiny assets (the Eagle3 head for tiny/policy, the MiMo-style tiny_mtp policy),
whose tensor names are the ones vLLM loads (tests/engine/test_eagle3.py, test_mtp.py)."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from nemo_rl_specdec.drafters.eagle3 import Eagle3Distiller
from nemo_rl_specdec.drafters.mtp import MTPDistiller
from nemo_rl_specdec.resources import asset_path
from nemo_rl_specdec.train.distill import DistillInputError

EAGLE3 = asset_path("tiny", "eagle3")
POLICY = asset_path("tiny", "policy")
MTP = asset_path("tiny_mtp")


def _rollouts(vocab: int, n: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [{"prompt_token_ids": torch.randint(3, vocab, (6,), generator=g).tolist(),
             "token_ids": torch.randint(3, vocab, (int(torch.randint(10, 30, (1,), generator=g)),),
                                        generator=g).tolist()} for _ in range(n)]


@pytest.fixture(scope="module", params=["eagle3", "mtp"])
def case(request, perturbed_policy):
    torch.set_num_threads(1)
    if request.param == "eagle3":
        return {"name": "eagle3", "teacher": perturbed_policy(POLICY, scale=0.3, seed=0),
                "make": lambda **kw: Eagle3Distiller(EAGLE3, **kw),
                "ckpt": EAGLE3 / "model.safetensors", "prefix": ""}
    return {"name": "mtp", "teacher": perturbed_policy(MTP, scale=0.3, seed=0),
            "make": lambda **kw: MTPDistiller(MTP, **kw),
            "ckpt": MTP / "model.safetensors", "prefix": "model.mtp_layers.0."}


def _ckpt_names(case) -> dict:
    from safetensors.torch import load_file

    return {k: v for k, v in load_file(str(case["ckpt"])).items() if k.startswith(case["prefix"])}


def test_training_moves_the_head_towards_the_policy_and_leaves_the_policy_untouched(case):
    teacher = case["teacher"]
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    d = case["make"](lr=2e-3, epochs=6, seed=0, micro_batch_tokens=128)
    ro = _rollouts(teacher.config.vocab_size)
    s1 = d.step(teacher, ro)
    s2 = d.step(teacher, ro)
    assert s1["kind"] == case["name"]
    assert s1["kl_last"] < s1["kl_first"] and s2["kl_last"] < s1["kl_first"]
    assert s2["top1_agreement_after"] > s1["top1_agreement_before"]
    # the head predicts the token after next: every response token but the first is a target
    assert s1["trained_positions"] == sum(len(r["token_ids"]) for r in ro)
    for k, v in teacher.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(p.grad is None for p in teacher.parameters())
    assert teacher.training is False


def test_export_names_are_the_checkpoint_names_vllm_loads_and_a_snapshot(case):
    ck = _ckpt_names(case)
    d = case["make"](lr=1e-3, epochs=1)
    sd = d.state_dict()
    assert set(sd) == set(ck)
    assert all(torch.equal(sd[k], ck[k]) and sd[k].shape == ck[k].shape for k in ck)  # loaded unchanged
    d.step(case["teacher"], _rollouts(case["teacher"].config.vocab_size, 4))
    now = d.state_dict()
    assert [k for k in ck if not torch.equal(now[k], ck[k])], "a training step changed no head tensor"
    assert all(torch.equal(sd[k], ck[k]) for k in ck), "state_dict() must be a snapshot"


def test_save_writes_a_checkpoint_that_loads_back_identically(case, tmp_path):
    d = case["make"](lr=1e-3, epochs=1)
    d.step(case["teacher"], _rollouts(case["teacher"].config.vocab_size, 4))
    if case["name"] == "eagle3":
        d.save(tmp_path / "h")
        again = Eagle3Distiller(tmp_path / "h")
    else:
        sd = {k: v.clone() for k, v in case["teacher"].state_dict().items()}
        d.save(tmp_path / "h", policy_state_dict=sd)
        again = MTPDistiller(tmp_path / "h")
        from safetensors.torch import load_file

        saved = load_file(str(tmp_path / "h" / "model.safetensors"))
        assert torch.equal(saved["model.layers.0.mlp.up_proj.weight"], sd["model.layers.0.mlp.up_proj.weight"])
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in d.state_dict().items())


def test_teacher_sharing_parameters_with_the_head_is_refused(case):
    d = case["make"](lr=1e-3)

    class Sharing(torch.nn.Module):
        def __init__(self, head, config):
            super().__init__()
            self.w = next(head.parameters())
            self.config = config

    with pytest.raises(DistillInputError, match="shares 1 parameter"):
        d.step(Sharing(d.module, case["teacher"].config), _rollouts(case["teacher"].config.vocab_size, 2))
    with pytest.raises(DistillInputError, match="itself"):
        d.step(d.module, _rollouts(case["teacher"].config.vocab_size, 2))


def test_bad_rollouts_and_mismatched_policies_are_clear_errors(case, tmp_path, perturbed_policy):
    d = case["make"](lr=1e-3)
    V = case["teacher"].config.vocab_size
    with pytest.raises(DistillInputError, match=r"rollouts\[0\].*outside the vocabulary"):
        d.step(case["teacher"], [{"prompt_token_ids": [3], "token_ids": [V]}])
    with pytest.raises(DistillInputError, match="no rollout has response tokens"):
        d.step(case["teacher"], [{"prompt_token_ids": [3], "token_ids": []}])
    with pytest.raises(DistillInputError, match="no position to train on"):
        d.step(case["teacher"], [{"prompt_token_ids": [3], "token_ids": [5]}])  # x_{t+2} never exists
    # the other policy: another hidden size
    other = perturbed_policy(MTP if case["name"] == "eagle3" else POLICY, scale=0.3, seed=0)
    with pytest.raises(DistillInputError, match="hidden_size"):
        d.step(other, _rollouts(V, 2))
    with pytest.raises(ValueError, match="lr"):
        case["make"](lr=0)


def test_checkpoints_without_a_head_are_refused(tmp_path, perturbed_policy):
    with pytest.raises(FileNotFoundError, match="head_dir"):
        Eagle3Distiller(tmp_path / "nope")
    with pytest.raises(DistillInputError, match="num_nextn_predict_layers"):
        MTPDistiller(POLICY)  # a policy without MTP layers
    bad = tmp_path / "eagle3"
    shutil.copytree(EAGLE3, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg.pop("eagle_config")
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="eagle_aux_hidden_state_layer_ids"):
        Eagle3Distiller(bad)
    with pytest.raises(DistillInputError, match="eagle_aux_hidden_state_layer_ids"):
        d = Eagle3Distiller(EAGLE3)
        d.layer_ids = [0, 9]
        d.step(perturbed_policy(POLICY, scale=0.3, seed=0), _rollouts(128, 2))


def test_aux_hidden_states_are_the_inputs_of_the_policys_layers(perturbed_policy):
    from nemo_rl_specdec.drafters.eagle3 import aux_hidden

    p = perturbed_policy(POLICY, scale=0.0, seed=0)
    ids = torch.randint(3, 128, (2, 12))
    seen = {}
    def keep(m, a, kw, j):
        seen[j] = (a[0] if a else kw["hidden_states"]).clone()

    hooks = [layer.register_forward_pre_hook(lambda m, a, kw, j=j: keep(m, a, kw, j), with_kwargs=True)
             for j, layer in enumerate(p.model.layers)]
    try:
        with torch.no_grad():
            out = p(input_ids=ids, output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    L = p.config.num_hidden_layers
    for a, j in zip(aux_hidden(out.hidden_states, [1, 2, 3], L), [1, 2, 3], strict=True):
        assert torch.equal(a, seen[j])
    with pytest.raises(ValueError, match="outside"):
        aux_hidden(out.hidden_states, [4], L)  # entry L is after the final norm, not a residual state
