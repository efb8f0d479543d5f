"""The model drafters' greedy drafts at every position of a recorded text in one pass (what `bench --suite drafters`
compares on one text) equal the bundled drafters run position by position, as an engine runs them."""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from nemo_rl_specdec.drafters import dflash, draft_model  # noqa: E402
from nemo_rl_specdec.resources import asset_path  # noqa: E402


def _ids(seed: int, T: int = 40):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 120, (T,), generator=g)


@pytest.fixture(scope="module")
def draft():
    return transformers.AutoModelForCausalLM.from_pretrained(str(asset_path("tiny", "draft")),
                                                             dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def policy():
    return transformers.AutoModelForCausalLM.from_pretrained(str(asset_path("tiny", "policy")),
                                                             dtype=torch.float32).eval()


@pytest.mark.parametrize("seed", [0, 1])
def test_draft_model_drafts_equal_the_model_run_one_token_at_a_time(draft, seed):
    ids, k, first = _ids(seed), 4, 11
    got = draft_model.greedy_drafts(draft, ids, k, first)
    assert got.shape == (len(ids) - first, k)
    with torch.no_grad():
        for m in range(first, len(ids)):
            seq = ids[:m].tolist()
            for j in range(k):
                tok = int(draft(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
                assert int(got[m - first, j]) == tok, (m, j)
                seq.append(tok)
    assert len({tuple(r) for r in got.tolist()}) > 1


def test_draft_model_bad_positions_are_refused(draft):
    with pytest.raises(ValueError, match="1 <= first < T"):
        draft_model.greedy_drafts(draft, _ids(0, 5), 2, first=5)


@pytest.mark.parametrize("seed", [0, 1])
def test_dflash_blocks_equal_the_draft_run_for_one_anchor_at_a_time(policy, seed):
    d, cfg = dflash.load_draft(asset_path("tiny", "dflash"))
    d.eval()
    layers, mask_id = cfg["dflash_config"]["target_layer_ids"], int(cfg["dflash_config"]["mask_token_id"])
    embed, head = policy.get_input_embeddings().weight, policy.get_output_embeddings().weight
    ids, k, first = _ids(seed), 4, 9
    aux, _ = dflash.target_hidden(policy, ids[None], layers)
    got = dflash.greedy_drafts(d, aux[0], embed, head, ids, k, first, mask_id)
    assert got.shape == (len(ids) - first, k)
    with torch.no_grad():
        for m in range(first, len(ids)):
            # the engine's step: the context up to x_{m-2} (the policy's states of the verified tokens), the block
            # x_{m-1} then k masks; the draft reads nothing past the anchor
            n = m - 1
            anchor = torch.tensor([[n]])
            q = dflash.query_blocks(embed, ids[None], anchor, k + 1, mask_id)
            out = d(aux[:, :n + 1], q, anchor, torch.ones_like(anchor, dtype=torch.bool))[0, 0, 1:]
            assert got[m - first].tolist() == (out @ head.t()).argmax(-1).tolist(), m
    assert len({tuple(r) for r in got.tolist()}) > 1


def test_the_drafters_give_their_teacher_forced_drafts_through_one_role(policy):
    from nemo_rl_specdec.bench.onetext import TeacherForced
    from nemo_rl_specdec.config.run import load_run_config
    from nemo_rl_specdec.drafters.registry import registered

    assert {"draft_model", "eagle3", "dflash"} <= set(registered(TeacherForced))
    ids = _ids(2, 30).tolist()
    for name in ("draft_model", "eagle3", "dflash"):
        spec = load_run_config("configs/tiny_cpu.yaml", [f"policy.generation.speculative_decoding.drafter={name}",
                                                         "policy.generation.speculative_decoding."
                                                         "num_speculative_tokens=3"]).spec
        drafts = registered(TeacherForced)[name].teacher_forced(spec, policy)(ids, 7, 3)
        assert drafts.shape == (len(ids) - 7, 3), name
