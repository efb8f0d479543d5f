"""The DFlash drafter without an engine: the bundled draft's layout, the torch mirror's block
semantics, the loss's shape contract, the online distiller, and the config rules.

That the mirror drafts exactly as vLLM's ``qwen3_dflash`` does is checked against a live engine in
tests/engine/test_dflash_mirror.py."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from nemo_rl_specdec.config.run import ConfigError, load_run_config
from nemo_rl_specdec.drafters.dflash import (
    DFlashDistiller,
    DFlashDraft,
    dflash_loss,
    load_draft,
    pick_anchors,
    query_blocks,
    target_hidden,
)
from nemo_rl_specdec.resources import asset_path
from nemo_rl_specdec.rollouts import TokenSequence
from nemo_rl_specdec.train.distill import DistillInputError, pad_batch

DRAFT = asset_path("tiny", "dflash")
POLICY = asset_path("tiny", "policy")
BLOCK = "policy.generation.speculative_decoding"


def _rollouts(vocab: int, n: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [{"prompt_token_ids": torch.randint(3, 70, (6,), generator=g).tolist(),
             "token_ids": torch.randint(3, 70, (int(torch.randint(12, 30, (1,), generator=g)),), generator=g).tolist()}
            for _ in range(n)]


@pytest.fixture(scope="module")
def teacher(perturbed_policy):
    torch.set_num_threads(1)
    return perturbed_policy(POLICY, scale=0.3, seed=0)


def test_bundled_draft_is_in_vllms_dflash_layout():
    from safetensors.torch import load_file

    cfg = json.loads((DRAFT / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"]
    pol = json.loads((POLICY / "config.json").read_text())
    d = cfg["dflash_config"]
    assert all(0 <= i < pol["num_hidden_layers"] for i in d["target_layer_ids"])
    assert pol["vocab_size"] > d["mask_token_id"] >= 78  # an id the tokenizer never produces
    assert cfg["hidden_size"] == pol["hidden_size"] and cfg["block_size"] >= 2
    names = set(load_file(str(DRAFT / "model.safetensors")))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_proj.weight",
            "layers.0.self_attn.k_norm.weight", "layers.0.mlp.down_proj.weight"} <= names
    assert not any(n.startswith(("embed_tokens", "lm_head")) for n in names)  # shares the policy's
    assert (DRAFT / "model.safetensors").stat().st_size < 5_000_000
    draft, _ = load_draft(DRAFT)
    assert set(draft.state_dict()) == names


def _toy(seed=0, H=16, blk=4):
    torch.manual_seed(seed)
    draft = DFlashDraft(H, 2, 4, 2, 4, 32, 2).eval()
    B, T, A = 2, 10, 3
    aux = torch.randn(B, T, 2 * H)
    anchors = torch.tensor([[3, 5, 8], [2, 4, 1]])
    valid = torch.tensor([[True, True, True], [True, True, False]])
    query = torch.randn(B, A, blk, H)
    return draft, aux, query, anchors, valid


def test_a_block_sees_the_context_before_its_anchor_and_nothing_after():
    draft, aux, query, anchors, valid = _toy()
    with torch.no_grad():
        out = draft(aux, query, anchors, valid)
        later = aux.clone()
        later[0, 5:] += torch.randn_like(later[0, 5:])  # positions >= 5: after anchor 3 and at anchor 5
        out2 = draft(later, query, anchors, valid)
        earlier = aux.clone()
        earlier[0, 2] += 1.0
        out3 = draft(earlier, query, anchors, valid)
    assert out.shape == (2, 3, 4, 16)
    assert torch.allclose(out[0, 0], out2[0, 0], atol=1e-6) and torch.allclose(out[0, 1], out2[0, 1], atol=1e-6)
    assert not torch.allclose(out[0, 2], out2[0, 2])  # anchor 8 sees positions 5..7
    assert not torch.allclose(out[0, 0], out3[0, 0])  # anchor 3 sees position 2
    assert torch.equal(out[1], draft(aux[1:], query[1:], anchors[1:], valid[1:])[0])  # rows are independent


def test_blocks_are_not_causal_inside_and_do_not_see_each_other():
    draft, aux, query, anchors, valid = _toy()
    with torch.no_grad():
        out = draft(aux, query, anchors, valid)
        q2 = query.clone()
        q2[0, 1, 3] += 1.0  # the last token of anchor 5's block
        out2 = draft(aux, q2, anchors, valid)
    assert not torch.allclose(out[0, 1, 0], out2[0, 1, 0])  # its first token sees it (no causal mask)
    assert torch.allclose(out[0, 0], out2[0, 0], atol=1e-6) and torch.allclose(out[0, 2], out2[0, 2], atol=1e-6)


def test_anchors_are_response_positions_with_a_response_token_after_them():
    seqs = [TokenSequence([5, 6, 7], [10, 11, 12, 13]), TokenSequence([5], [20, 21])]
    ids, mask = pad_batch(seqs, 0)
    anchors, valid = pick_anchors(mask, None)
    assert [anchors[0][valid[0]].tolist(), anchors[1][valid[1]].tolist()] == [[3, 4, 5], [1]]
    few, fv = pick_anchors(mask, 2, generator=torch.Generator().manual_seed(0))
    assert fv.sum(1).tolist() == [2, 1] and set(few[0].tolist()) <= {3, 4, 5}
    q = query_blocks(torch.arange(30.).unsqueeze(1).expand(30, 2), ids, anchors, 3, 29)
    assert q[0, 0, :, 0].tolist() == [10.0, 29.0, 29.0]  # x_n, then the mask token


def test_loss_trains_every_offset_that_predicts_a_response_token():
    draft, aux, _, _, _ = _toy(blk=3)
    seqs = [TokenSequence([5, 6, 7], [10, 11, 12, 13, 14, 15, 16]), TokenSequence([5, 6], [20, 21, 22])]
    ids, mask = pad_batch(seqs, 0)
    anchors, valid = pick_anchors(mask, None)
    V = 32
    lm_head = torch.randn(V, 16)
    item = {"aux": aux, "t_hidden": torch.randn(2, 10, 16), "mask": mask, "anchors": anchors,
            "valid": valid, "query": query_blocks(torch.randn(V, 16), ids, anchors, 3, V - 1)}
    kl = dflash_loss(draft, item, lm_head, lm_head)
    assert kl.loss.dim() == 0 and torch.isfinite(kl.loss) and kl.loss > 0
    assert kl.counted == int(valid.sum())  # offset 1 of every anchor is trained
    kl.loss.backward()
    assert all(p.grad is not None for p in draft.parameters())


def test_target_hidden_reads_layer_outputs_before_the_final_norm(teacher):
    ids = torch.randint(3, 70, (2, 9))
    seen = {}
    hooks = [
        layer.register_forward_hook(lambda m, a, o, j=j: seen.__setitem__(j, (o[0] if isinstance(o, tuple) else o)))
        for j, layer in enumerate(teacher.model.layers)
    ]
    try:
        aux, _ = target_hidden(teacher, ids, [0, 3])
    finally:
        for h in hooks:
            h.remove()
    H = teacher.config.hidden_size
    assert torch.equal(aux[..., :H], seen[0]) and torch.equal(aux[..., H:], seen[3])
    with pytest.raises(DistillInputError, match="target_layer_ids"):
        target_hidden(teacher, ids, [4])


def test_distiller_moves_the_draft_towards_the_policy_and_leaves_the_policy_untouched(teacher, tmp_path):
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    d = DFlashDistiller(DRAFT, lr=2e-3, epochs=4, seed=0, micro_batch_tokens=128)
    ro = _rollouts(teacher.config.vocab_size)
    s1 = d.step(teacher, ro)
    s2 = d.step(teacher, ro)
    assert s1["kind"] == "dflash" and s1["trained_positions"] > 0
    assert s1["kl_last"] < s1["kl_first"] and s2["kl_last"] < s1["kl_first"]
    assert all(torch.equal(v, before[k]) for k, v in teacher.state_dict().items())
    assert all(p.grad is None for p in teacher.parameters())
    sd = d.state_dict()
    assert set(sd) == set(load_draft(DRAFT)[0].state_dict())
    d.save(tmp_path / "d")
    again = DFlashDistiller(tmp_path / "d")
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in sd.items())


def test_distiller_refuses_bad_input(teacher, tmp_path, perturbed_policy):
    with pytest.raises(FileNotFoundError, match="draft_dir"):
        DFlashDistiller(tmp_path / "nope")
    with pytest.raises(ValueError, match="max_anchors"):
        DFlashDistiller(DRAFT, max_anchors=0)
    d = DFlashDistiller(DRAFT, lr=1e-3)
    with pytest.raises(DistillInputError, match="no position to train on"):
        d.step(teacher, [{"prompt_token_ids": [3], "token_ids": [5]}])  # no token after the anchor
    with pytest.raises(DistillInputError, match="hidden_size"):
        d.step(perturbed_policy(asset_path("tiny_mtp"), scale=0.0, seed=0), _rollouts(128, 2))


def _cfg(*over):
    return load_run_config("configs/tiny_cpu.yaml", [f"{BLOCK}.enabled=true", f"{BLOCK}.drafter=dflash", *over])


def test_config_rules_name_the_key_path(tmp_path):
    block = json.loads((DRAFT / "config.json").read_text())["block_size"]
    assert _cfg(f"{BLOCK}.num_speculative_tokens={block - 1}").spec.dflash.model == str(DRAFT)
    with pytest.raises(ConfigError, match=rf"{BLOCK}\.num_speculative_tokens: got {block}; allowed: <= {block - 1}"):
        _cfg(f"{BLOCK}.num_speculative_tokens={block}")
    with pytest.raises(ConfigError, match=rf"{BLOCK}\.dflash\.model: .*DFlash draft checkpoint"):
        _cfg(f"{BLOCK}.dflash.model={asset_path('tiny', 'eagle3')}")
    with pytest.raises(ConfigError, match=rf"{BLOCK}\.dflash\.model: got .*which has no config\.json"):
        _cfg(f"{BLOCK}.dflash.model={tmp_path}")  # a folder that is no checkpoint: refused before any engine
    bad = tmp_path / "d"
    shutil.copytree(DRAFT, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["dflash_config"].pop("mask_token_id")
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=rf"{BLOCK}\.dflash\.model: .*dflash_config\.mask_token_id"):
        _cfg(f"{BLOCK}.dflash.model={bad}")
    with pytest.raises(ConfigError, match=rf"{BLOCK}\.dflash\.block: unknown key"):
        _cfg(f"{BLOCK}.dflash.block=4")
    with pytest.raises(ConfigError, match=rf"{BLOCK}\.refresh\.mode: got 'refit'"):
        _cfg(f"{BLOCK}.refresh.mode=refit")
