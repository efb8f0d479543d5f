"""eagle3.greedy_drafts: every position's k-token draft in one pass equals the head run step by step."""
import pytest

torch = pytest.importorskip("torch")

from nemo_rl_specdec.drafters.eagle3 import Eagle3Head, greedy_drafts  # noqa: E402


def _step_by_step(head, aux, emb, embed, k, n):
    """The draft for text index n as an engine makes it: the head's causal forward over positions
    0..t (t = n - 2, teacher-forced), then one position more per draft token."""
    t = n - 2
    embeds, hidden = emb[1:t + 2], head.fc(aux[:t + 1])
    out = []
    for j in range(k):
        pos = torch.arange(t + 1 + j).unsqueeze(0)
        logits, pre = head(embeds.unsqueeze(0), hidden.unsqueeze(0), pos)
        tok = int(logits[0, -1].argmax())
        out.append(tok)
        embeds = torch.cat([embeds, embed(torch.tensor([tok]))])
        hidden = torch.cat([hidden, pre[0, -1:]])
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_one_pass_drafts_equal_the_head_run_step_by_step(seed):
    torch.manual_seed(seed)
    H, vocab, T, k = 16, 11, 14, 4
    head = Eagle3Head(H, 3, vocab, 4, 2, 4, 32).float()
    for p in head.parameters():  # random weights of a trained head's scale: drafts that differ by position
        torch.nn.init.normal_(p, std=0.5)
    table = torch.nn.Embedding(vocab, H)
    ids = torch.randint(0, vocab, (T,))
    aux, emb = torch.randn(T, 3 * H), table(ids).detach()
    with torch.no_grad():
        drafts = greedy_drafts(head, aux, emb, table, k, first=3)
        assert drafts.shape == (T - 3, k)
        for n in range(3, T):
            assert drafts[n - 3].tolist() == _step_by_step(head, aux, emb, table, k, n), n
    assert len({tuple(r) for r in drafts.tolist()}) > 1


def test_bad_positions_are_refused():
    head = Eagle3Head(8, 1, 5, 2, 1, 4, 8).float()
    with pytest.raises(ValueError, match="2 <= first < T"):
        greedy_drafts(head, torch.zeros(4, 8), torch.zeros(4, 8), torch.nn.Embedding(5, 8), 2, first=1)
