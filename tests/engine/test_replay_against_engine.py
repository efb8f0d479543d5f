"""bench/replay.py against the real engine: a greedy DAS engine's drafts on its own text are the
replay's, draft for draft. In-flight sharing is off here: with it, which sibling tokens a draft
sees depends on the engine's step timing (docs/measurements/das.md gives the difference measured)."""
import pytest

from nemo_rl_specdec.bench.replay import replay
from nemo_rl_specdec.demo import task
from nemo_rl_specdec.update import PolicyUpdate

pytest.importorskip("arctic_inference.suffix_decoding._C")


def test_replay_proposes_and_accepts_what_the_engine_did(start_engine, tiny_cfg_fn):
    cfg = tiny_cfg_fn(greedy=True, drafter="suffix", num_speculative_tokens=8, auto_disable=False,
                      refresh={"mode": "rebuild"}, scheduling={"budget": "uniform"},
                      suffix={"backend": "das", "scope": "both", "window_steps": 2, "share_in_flight": "off"})
    e = start_engine(name="das_replay", cfg=cfg)
    tok = e.tokenizer()
    reqs = task.run_requests(cfg, tok, task.run_problems(cfg, 6, seed=7), 3)
    recorded, metrics = [], []
    for _v in range(2):
        res = e.generate(reqs, temperature=0.0)
        recorded.append(res.rollouts)
        metrics.append(res.metrics)
        e.update(PolicyUpdate(e.state["policy_version"] + 1, rollouts=res.rollouts))
    rows = replay(cfg.spec, recorded, cfg.generation.vllm_cfg.max_model_len, temperature=0.0)
    for m, r in zip(metrics, rows, strict=True):
        assert r["generated_tokens"] == m.generated_tokens
        assert (r["drafts"], r["draft_tokens"], r["accepted_draft_tokens"]) == (m.drafts, m.draft_tokens,
                                                                                m.accepted_tokens)
    assert rows[1]["accepted_draft_tokens"] > rows[0]["accepted_draft_tokens"]  # the store drafted batch 2
