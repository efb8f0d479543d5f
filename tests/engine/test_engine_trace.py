"""driver/tracing.py: an engine's own steps, read from vLLM's scheduler, are the replay's steps draft for
draft (greedy, DAS without in-flight sharing, as test_replay_against_engine.py), and a no-spec
engine's trace is its rollout one token per request per step."""
import pytest

from nemo_rl_specdec.bench.replay import replay
from nemo_rl_specdec.demo import task
from nemo_rl_specdec.update import PolicyUpdate

pytest.importorskip("arctic_inference.suffix_decoding._C")


def test_an_engine_trace_is_what_the_engine_did(start_engine, tiny_cfg_fn):
    cfg = tiny_cfg_fn(greedy=True, drafter="suffix", num_speculative_tokens=8, auto_disable=False,
                      refresh={"mode": "rebuild"}, scheduling={"budget": "uniform"},
                      suffix={"backend": "das", "scope": "both", "window_steps": 2, "share_in_flight": "off"})
    e = start_engine(name="das_trace", cfg=cfg)
    reqs = task.run_requests(cfg, e.tokenizer(), task.run_problems(cfg, 4, seed=11), 3)
    recorded, traces = [], []
    for _ in range(2):
        res = e.generate(reqs, temperature=0.0)
        recorded.append(res.rollouts)
        traces.append(res.trace)
        e.update(PolicyUpdate(e.state["policy_version"] + 1, rollouts=res.rollouts))
    rows = replay(cfg.spec, recorded, cfg.generation.vllm_cfg.max_model_len, temperature=0.0)
    for t, r, rollouts in zip(traces, rows, recorded, strict=True):
        assert t.source == "engine" and t.kind == "list" and t.drafter == "das" and t.k == 8
        assert t.generated_tokens == sum(len(ro.token_ids) for ro in rollouts)
        assert sum(s.prefill_tokens for s in t.steps) == sum(len(ro.prompt_token_ids) for ro in rollouts)
        decode = [s for s in t.steps if s.rids]
        assert all(s.proposer_s is not None for s in decode)
        # draft for draft: the engine's (context, drafts, accepted) of each request's steps are the replay's
        def rows_of(trace):
            return sorted((c, d, a) for s in trace.steps for c, d, a in zip(s.ctx, s.drafts, s.accepted, strict=True))
        assert rows_of(t) == rows_of(r["trace"])
    assert sum(sum(s.accepted) for s in traces[1].steps) > 0


def test_a_no_spec_trace_commits_one_token_per_request_step(engines, tiny_cfg_fn):
    e = engines.baseline()
    cfg = tiny_cfg_fn(greedy=True)
    reqs = task.run_requests(cfg, e.tokenizer(), task.run_problems(cfg, 3, seed=5), 2)
    res = e.generate(reqs, temperature=0.0)
    t = res.trace
    assert t.kind == "none" and t.k == 0 and t.generated_tokens == res.metrics.generated_tokens
    assert all(d == 0 and a == 0 for s in t.steps for d, a in zip(s.drafts, s.accepted, strict=True))
    assert all(s.proposer_s is None for s in t.steps)
