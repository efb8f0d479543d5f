"""bench/replay.py: list drafters replayed on a recorded text. Planted rollouts whose drafts are known
exactly; DAS and vLLM's own suffix and n-gram proposers, built from the bench's rows."""
import pytest

pytest.importorskip("arctic_inference.suffix_decoding._C")

from nemo_rl_specdec.bench import das  # noqa: E402
from nemo_rl_specdec.bench.replay import replay  # noqa: E402
from nemo_rl_specdec.config.run import load_run_config  # noqa: E402
from nemo_rl_specdec.resources import config_path  # noqa: E402

K = 4
PROMPT = [5, 6, 7, 8, 9, 10]
RESPONSE = list(range(40, 57))  # 17 distinct tokens: the prefill samples the first, 16 are left


def _rows():
    cfg = load_run_config(config_path("tiny_cpu.yaml"), ["bench.das.windows=[4]", "bench.das.scopes=[both]",
                                                          "policy.generation.speculative_decoding.num_speculative_tokens=4"])
    return {c["name"]: c["cfg"].spec for c in das.configurations(cfg, das._options(cfg))}


def _batches(n=2, samples=1, pid="A"):
    return [[{"problem_id": pid, "prompt_token_ids": PROMPT, "token_ids": RESPONSE} for _ in range(samples)]
            for _ in range(n)]


@pytest.mark.parametrize("name", ["das_w4_both", "vllm_suffix"])
def test_a_text_seen_before_is_drafted_in_full_and_a_new_one_not_at_all(name):
    spec = _rows()[name]
    assert spec.num_speculative_tokens == K
    first, second = replay(spec, _batches(), max_model_len=256)
    # no history, no repeat inside the text: every forward makes one token (the prefill included)
    assert first["target_forwards"] == len(RESPONSE) and first["draft_tokens"] == 0
    assert first["tokens_per_target_forward"] == 1.0
    # the same problem again: every forward accepts k drafts (+1), the last one what is left
    assert second["target_forwards"] == 1 + -(-(len(RESPONSE) - 1) // (K + 1))  # 1 + ceil(16 / 5) = 5
    assert second["tokens_per_target_forward"] == pytest.approx(len(RESPONSE) / second["target_forwards"])
    for r in (first, second):
        assert r["generated_tokens"] == len(RESPONSE)
        assert r["generated_tokens"] - r["accepted_tokens"] == r["target_forwards"]


def test_das_drafts_only_from_the_problems_it_has_seen_under_scope_problem():
    rows = _rows()
    spec = rows["das_w4_both"].model_copy(update={"suffix": rows["das_w4_both"].suffix.model_copy(
        update={"scope": "problem"})})
    batches = _batches(1, pid="A") + _batches(1, pid="B")  # B's rollout never seen: A's tree is not B's
    assert [r["draft_tokens"] for r in replay(spec, batches, max_model_len=256)] == [0, 0]
    assert replay(spec, _batches(2, pid="A"), max_model_len=256)[1]["draft_tokens"] > 0


def test_vllm_ngram_drafts_from_the_request_itself():
    spec = _rows()["ngram"]
    text = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4]
    (row,) = replay(spec, [[{"problem_id": None, "prompt_token_ids": [9, 9], "token_ids": text}]], max_model_len=256)
    assert row["draft_tokens"] > 0 and row["accepted_tokens"] > 0
    assert row["generated_tokens"] - row["accepted_tokens"] == row["target_forwards"]


def test_every_draft_is_verified_in_a_replay_whatever_the_run_files_rule():
    """The replay has no step time: DAS under `budget: adaptive` replays as with every draft verified."""
    rows = _rows()
    a = replay(rows["das_adaptive"], _batches(), max_model_len=256)
    b = replay(rows["das_auto_disable_off"], _batches(), max_model_len=256)
    assert _figures(a) == _figures(b) and a[1]["draft_tokens"] > 0


def _figures(rows):
    """A replay's rows without the proposer's measured time (the one figure that is not replayed)."""
    return [({k: v for k, v in r.items() if k != "trace"},
             [(s.rids, s.ctx, s.drafts, s.accepted, s.prefill_tokens) for s in r["trace"].steps]) for r in rows]


def test_the_trace_is_the_replay_step_by_step():
    rows = _rows()
    for row in replay(rows["das_auto_disable_off"], _batches(), max_model_len=256):
        t = row["trace"]
        assert t.kind == "list" and t.source == "replay" and t.k == rows["das_auto_disable_off"].num_speculative_tokens
        assert t.generated_tokens == row["generated_tokens"]
        assert sum(len(s.rids) for s in t.steps) + t.meta["requests"] == row["target_forwards"]
        assert sum(s.prefill_requests for s in t.steps) == t.meta["requests"]
        assert sum(sum(s.drafts) for s in t.steps) == row["draft_tokens"]
        assert all(s.proposer_s is not None and s.proposer_s >= 0 for s in t.steps if s.rids)


def test_at_most_max_num_seqs_requests_decode_at_once():
    rows = _rows()
    (free,) = replay(rows["das_auto_disable_off"], _batches(1, samples=5), max_model_len=256)
    (capped,) = replay(rows["das_auto_disable_off"], _batches(1, samples=5), max_model_len=256, max_num_seqs=2)
    assert max(len(s.rids) for s in capped["trace"].steps) == 2 < max(len(s.rids) for s in free["trace"].steps)
    assert capped["generated_tokens"] == free["generated_tokens"]
    assert sum(s.prefill_tokens for s in capped["trace"].steps) == sum(s.prefill_tokens for s in free["trace"].steps)


def test_a_model_drafter_is_refused_with_its_name():
    cfg = load_run_config(config_path("tiny_cpu.yaml"), ["policy.generation.speculative_decoding.drafter=draft_model"])
    with pytest.raises(ValueError, match="'draft_model'.*not a list drafter"):
        replay(cfg.spec, _batches(1), max_model_len=256)


class _Cost:
    """A step cost the per-step rule reads (`cost/online.py` `StepCostSource`), fixed: t0 and the cost of one
    more draft token."""

    def __init__(self, c_tok):
        self.c_tok, self.samples, self.ready, self.r2 = c_tok, 0, True, None

    def split(self, requests, ctx_sum, draft_tokens=None):
        return 1.0, self.c_tok

    def add(self, *args, **kwargs):
        self.samples += 1

    def metrics(self):
        return {"samples": self.samples}


def test_a_priced_step_cost_lets_the_rule_decide_in_the_replay():
    """With a step cost, DAS's `budget: adaptive` runs in the replay: drafts that cost more than they
    can commit are withheld, free ones all kept."""
    spec = _rows()["das_adaptive"]
    batches = _batches(3, samples=4)
    free = replay(spec, batches, max_model_len=256, step_cost=_Cost(0.0))
    dear = replay(spec, batches, max_model_len=256, step_cost=_Cost(100.0))
    every = replay(_rows()["das_auto_disable_off"], batches, max_model_len=256)
    assert sum(r["draft_tokens"] for r in free) == sum(r["draft_tokens"] for r in every) > 0
    assert sum(r["draft_tokens"] for r in dear) < sum(r["draft_tokens"] for r in every)
    with pytest.raises(ValueError, match="vLLM's own"):
        replay(_rows()["vllm_suffix"], batches, max_model_len=256, step_cost=_Cost(0.0))
