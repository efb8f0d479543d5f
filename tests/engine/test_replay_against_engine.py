"""bench/replay.py against the real engine: a greedy DAS engine's drafts on its own text are the
replay's, draft for draft, and a greedy hybrid engine's recorded steps, fed to its proposer by the
replay runner, give the engine's drafts step for step. In-flight sharing is off here: with it,
which sibling tokens a draft sees depends on the engine's step timing (docs/measurements/das.md
gives the difference measured)."""
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


def _record_hybrid(k: int):
    """Worker-side: price the hybrid's steps on a profile (deterministic, as the replay prices them)
    and record every step the engine hands its proposer: the batch, the verified tokens, the model
    part's drafts, and the drafts proposed."""
    def setup(worker):
        import numpy as np

        from nemo_rl_specdec.cost.price import PricedHybridCost
        from nemo_rl_specdec.cost.profile import load_profile

        runner = worker.model_runner
        h = runner.specdec_beside
        h.cost = PricedHybridCost(load_profile("h100_qwen3_8b"), "das", "eagle3", k)
        inner, steps = h.propose, []

        def propose(call_model, sched, sampled, counts=None):
            batch = runner.input_batch
            n = len(sampled)
            counts = np.asarray(batch.num_tokens_no_spec[:n] if counts is None else counts[:n]).tolist()
            rids = list(batch.req_ids[:n])
            step = {"req_ids": rids, "counts": counts, "k": int(sched.num_spec_tokens_to_schedule),
                    "rows": [batch.token_ids_cpu[i, :counts[i]].tolist() for i in range(n)],
                    "sampled": [[int(t) for t in s] for s in sampled], "model": None,
                    "requests": {r: (list(runner.requests[r].prompt_token_ids),
                                     dict(runner.requests[r].sampling_params.extra_args or {})) for r in rids if r}}

            def model():
                drafts = call_model()
                step["model"] = [[int(t) for t in d] for d in (drafts.tolist() if hasattr(drafts, "tolist")
                                                               else drafts)]
                return drafts

            out = inner(model, sched, sampled, counts)
            step["drafts"] = [[int(t) for t in d] for d in out]
            steps.append(step)
            return out

        h.propose, h.recorded = propose, steps

    return setup


def test_replay_drives_the_hybrids_proposer_to_the_engines_drafts(start_engine, tiny_cfg_fn):
    """A greedy hybrid engine (DAS + eagle3) records every step it hands its proposer; the replay
    runner (`BesideReplay`) feeds the same steps to the same proposer class, the model part's
    drafts read from the recording, and proposes the same drafts at every step, across a store
    rebuild from the first batch's rollouts."""
    from types import SimpleNamespace

    from nemo_rl_specdec.bench.replay import BesideReplay, _Batch
    from nemo_rl_specdec.cost.price import PricedHybridCost
    from nemo_rl_specdec.cost.profile import load_profile

    k = 4
    cfg = tiny_cfg_fn(greedy=True, drafter="hybrid", num_speculative_tokens=k, hybrid={"model": "eagle3"},
                      refresh={"mode": "online"}, suffix={"share_in_flight": "off"})
    e = start_engine(name="hybrid_replay", cfg=cfg)
    e.llm.collective_rpc(_record_hybrid(k))
    reqs = task.run_requests(cfg, e.tokenizer(), task.run_problems(cfg, 4, seed=11), 2)
    first = e.generate(reqs, max_new_tokens=96)
    n_first = e.llm.collective_rpc(lambda w: len(w.model_runner.specdec_beside.recorded))[0]
    e.update(PolicyUpdate(1, rollouts=first.rollouts, drafter_checkpoint=True))
    second = e.generate(reqs, max_new_tokens=96)
    steps = e.llm.collective_rpc(lambda w: w.model_runner.specdec_beside.recorded)[0]
    assert 0 < n_first < len(steps) and {s["k"] for s in steps} == {k}

    current: dict = {}
    beside = BesideReplay(cfg.spec, cfg.generation.vllm_cfg.max_model_len,
                          lambda batch: current["model"] or [[] for _ in batch.req_ids],
                          cost=PricedHybridCost(load_profile("h100_qwen3_8b"), "das", "eagle3", k), temperature=0.0)
    requests: dict = {}
    got = []
    for j, s in enumerate(steps):
        if j == n_first:
            beside.after_batch(first.rollouts, 1)   # the update between the two batches
        for r, (prompt, extra) in s["requests"].items():
            requests.setdefault(r, SimpleNamespace(prompt_token_ids=prompt,
                                                   sampling_params=SimpleNamespace(extra_args=extra)))
        batch = _Batch(s["req_ids"], s["counts"], [len(requests[r].prompt_token_ids) for r in s["req_ids"]],
                       max(s["counts"]) + k + 1)
        for i, row in enumerate(s["rows"]):
            batch.token_ids_cpu[i, :len(row)] = row
        current["model"] = s["model"]
        got.append(beside.propose(batch, s["sampled"], requests))
    for j, (mine, s) in enumerate(zip(got, steps, strict=True)):
        assert mine == s["drafts"], f"step {j}: the replay proposed {mine}, the engine {s['drafts']}"
    c = beside.proposer.counters
    assert c["from_history"] > 0 and c["from_model"] > 0, c   # both halves were chosen
    assert second.metrics.drafts > 0
