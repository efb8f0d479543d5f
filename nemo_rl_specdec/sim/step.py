"""GRPO steps around the rollout: sync and async pipelines over several steps.

For step t a batch of rollouts is generated, then the policy's logprobs are recomputed and
it is trained (times from `rl.logprob` and `rl.train`: fixed seconds, plus seconds per 1000
tokens, plus FLOPs per token over the training pool's `training_gpus` x
`training_flops_per_s`), then the engines load the new weights (`rl.refit_s`), giving policy
version t + 1. The training pool is the generation GPUs when colocated (sync's default).

- sync (NeMo-RL's colocated GRPO): batch t is released when version t is in the engines,
  U_t = E_(t-1) + refit. Step time = generation + logprob + train + refit.
- async (separate generation and training GPUs, `max_policy_lag` = L >= 1): batch t may be
  generated with version t - L, so it is released at U_(t-L); the engines keep generating
  while the trainer works, and the next batch's requests fill the slots freed by the current
  batch's tail. Training of batch t starts when batch t is complete and training of t - 1
  is done. A weight update pauses the engines for `refit_s` at the next step boundary after
  training ends (requests in flight continue with the new weights afterwards); with
  `refit_blocks_training` the trainer waits for it too.
- serving (`workload.steady_state`): every request of every batch is released at time 0 and
  each engine keeps `max_num_seqs` in flight until the queue is empty, like a serving
  benchmark at fixed concurrency; rollout time is the makespan.

For each batch the driver predicts lengths (`LengthPredictor` fed with the problems'
earlier rollouts, or the true lengths with `prediction: oracle`), places the requests with
`scheduling.placement.place`, and runs each engine (`engine_sim.EngineSim`) until its part
of the batch is done; the batch is done when the slowest engine is.

Reported per run: rollout time (release to last request finished, mean over steps), step time
(sync: mean of U_(t+1) - U_t; async: mean interval between training ends after the L
warm-up steps), exposed generation (the time the trainer waits for rollouts: the whole
rollout in sync; in async the gap between the end of training t - 1 and the start of t),
generation idle fraction (engine-time with no request in flight, inside the rollout windows
for sync, over the whole run for async), tokens, target steps, mean accepted length, KV
preemptions.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from nemo_rl_specdec.cost.model import CostModel
from nemo_rl_specdec.scheduling.budget import expected_accepted, k_by_batch_size_schedule
from nemo_rl_specdec.scheduling.placement import Request, place
from nemo_rl_specdec.scheduling.predictor import LengthPredictor
from nemo_rl_specdec.sim import acceptance as acc
from nemo_rl_specdec.sim.engine_sim import EngineSim, HybridHalves, SimRequest, SpecPolicy
from nemo_rl_specdec.sim.workload import Batch, make_batches


@dataclass
class RunResult:
    speculative: bool
    placement: str
    num_engines: int
    release: list[float]
    gen_done: list[float]
    train_done: list[float]
    rollout_s: float
    step_s: float
    gen_idle_fraction: float
    response_tokens: int
    target_steps: int
    draft_tokens: float
    verified_tokens: float
    mean_accepted_length: float
    exposed_generation_s: float = 0.0
    preemptions: int = 0
    engine_busy_s: list[float] = field(default_factory=list)
    judged_by_batch: dict = field(default_factory=dict)   # auto_disable: target steps judged per batch-size bin
    off_by_batch: dict = field(default_factory=dict)      # ... and turned off
    hybrid_model_steps: int = 0                           # hybrid: target steps that ran the model half's forwards
    hybrid_request_steps: dict = field(default_factory=dict)  # hybrid: request-steps by source (history, model, none)

    @property
    def off_share_by_batch(self) -> dict:
        """auto_disable: share of the judged steps it turned off, per batch-size bin."""
        return {b: self.off_by_batch.get(b, 0) / n for b, n in self.judged_by_batch.items() if n}

    @property
    def rollout_s_per_step(self) -> list[float]:
        return [g - r for g, r in zip(self.gen_done, self.release, strict=True)]


def _phase_time(phase, batch: Batch, flops_per_s: float) -> float:
    t = phase.fixed_s + phase.per_ktoken_s * batch.total_tokens / 1000.0
    if phase.flops_per_token:
        t += phase.flops_per_token * batch.total_tokens / flops_per_s
    return t


def _accept_tables(sc, batch: Batch, k: int, acceptance: float | Sequence[float]) -> np.ndarray:
    """Per-request A(d), d = 0..k. With acceptance.spread > 0 each request has its own alpha,
    drawn around the mean that keeps the mean accepted length (sim/acceptance.py), from a
    generator seeded by the scenario seed and step, so every run agrees."""
    n = len(batch)
    a = sc.acceptance
    if isinstance(acceptance, (int, float)) and a.spread > 0:
        rng = np.random.default_rng([sc.seed, 7919, batch.step])
        at_k = a.measured_at_k or sc.speculation.num_speculative_tokens
        mean = acc.spread_mean(float(acceptance), a.decay, a.spread, at_k)
        return acc.tables(acc.per_request_alphas(mean, a.spread, n, rng), a.decay, k)
    return np.broadcast_to(expected_accepted(acceptance, k), (n, k + 1))


def _overlap(busy: list, lo: float, hi: float) -> float:
    return sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in busy)


def simulate_rl(sc, *, speculative: bool, placement: str | None = None, k: int | None = None,
                acceptance: None | float | Sequence[float] = None, num_engines: int | None = None,
                num_prompts: int | None = None, batches: list[Batch] | None = None) -> RunResult:
    """Simulate `sc.rl.num_steps` RL steps. Keyword overrides serve the sweeps; `batches`
    lets several runs share one workload draw."""
    spec_cfg, sched_cfg = sc.speculation, sc.speculation.scheduling
    placement = placement or sched_cfg.placement
    k = spec_cfg.num_speculative_tokens if k is None else k
    acceptance = sc.acceptance_model if acceptance is None else acceptance
    E = sc.cluster.num_engines if num_engines is None else num_engines
    rl = sc.rl
    L = rl.lag
    N = rl.num_steps
    cost = CostModel.from_scenario(sc)
    if batches is None:
        batches = make_batches(sc.workload, N, sc.seed, num_prompts)

    policy = None
    if speculative and spec_cfg.enabled:
        sched = sched_cfg.k_schedule
        if sched == "auto" and (cost.roofline is not None or cost.c_seq):   # a step time beyond c_base + c_tok n
            ctx = sc.workload.prompt_len + sc.workload.lengths.median / 2      # a typical context
            sched = k_by_batch_size_schedule(sc.hardware.max_num_seqs, k, acceptance,
                                             step_time=lambda b, d: cost.mean_step_time(b, d, ctx))
        elif sched == "auto":
            sched = k_by_batch_size_schedule(
                sc.hardware.max_num_seqs, k, acceptance, cost.c_base, cost.c_tok,
                c_draft=cost.draft_tok, c_draft_fwd=cost.draft_fwd_base,
            )
        policy = SpecPolicy(k=k, budget=sched_cfg.budget, long_fraction=sched_cfg.long_fraction,
                            short_fraction=sched_cfg.short_fraction, medium_k=sched_cfg.medium_k,
                            schedule=sched, interval=sched_cfg.budget_interval_steps, acceptance=acceptance,
                            auto_disable=spec_cfg.auto_disable)

    max_len = sc.workload.lengths.max_len
    predictor = LengthPredictor(max_len=max_len)
    mode = sc.workload.prediction

    def remaining(r: SimRequest, generated: float) -> float:
        if mode == "oracle":
            return max(0.0, r.length - generated)
        if mode == "none":
            return 1.0
        return predictor.predict_remaining(r.problem_id, generated)

    hybrid = None
    if policy is None:   # speculation off: no drafter runs (nor prefills its own KV)
        cost = cost.without_drafter()
    elif sc.hybrid is not None:   # the engine's cost is the target's; the halves price the rest
        from dataclasses import replace

        hy = sc.hybrid
        hybrid = HybridHalves(tuple(hy.per_position), hy.coverage, min(k, hy.model_k or k), cost, hy.replicas)
        # the engine's own cost: the target and the history half's proposer (the host term)
        cost = replace(cost.without_drafter(), draft_per_request=hy.per_request_s,
                       spec_step_overhead=hy.step_overhead_s)
    engines = [EngineSim(e, cost, policy, sc.hardware.max_num_seqs, remaining, sc.kv_capacity_tokens,
                         sc.drafter.coverage, sc.acceptance.by_response_position, hybrid) for e in range(E)]
    serving = sc.workload.steady_state
    train_gpus = rl.training_gpus or E * sc.hardware.gpus_per_engine
    train_flops = rl.training_flops_per_s * train_gpus
    refit_block = rl.refit_s if (L > 0 and rl.refit_blocks_training) else 0.0
    release: dict[int, float] = {}
    U: dict[int, float] = {0: 0.0}          # policy version j is in the engines from U[j]
    G: list[float] = []
    Etrain: list[float] = []
    added: set[int] = set()
    rid = 0

    def submit(t: int) -> None:
        nonlocal rid
        b = batches[t]
        predictor.observe_many(b.history)
        if mode == "oracle":
            preds = b.lengths.astype(float)
        elif mode == "none":
            preds = np.zeros(len(b))
        else:
            preds = np.array([predictor.predict(p) for p in b.problem_ids])
        reqs = [Request(i, b.problem_ids[i], float(preds[i])) for i in range(len(b))]
        assignment = place(reqs, E, placement)
        A = _accept_tables(sc, b, k, acceptance)
        sims = [SimRequest(rid + i, t, b.problem_ids[i], int(b.lengths[i]), int(b.prompt_lens[i]), A[i])
                for i in range(len(b))]
        rid += len(b)
        for e, idxs in enumerate(assignment):
            engines[e].add([sims[i] for i in idxs], release[t])

    if serving:
        for t in range(N):
            release[t] = 0.0
            submit(t)
        G = [max([f for f in (eng.run_until_done(t) for eng in engines) if f is not None], default=0.0)
             for t in range(N)]
        makespan = max(G)      # one window: the serving run counts as one step; no trainer waits
        return _result(policy, placement, E, [0.0], [makespan], [makespan], makespan, makespan, 0.0,
                       [(0.0, makespan)], engines, batches[:N])

    exposed: list[float] = []
    for t in range(N):
        for t2 in range(N):
            if t2 in added:
                continue
            j = max(0, t2 - L)
            if j not in U:
                break
            release[t2] = U[j]
            submit(t2)
            added.add(t2)
        finishes = [eng.run_until_done(t) for eng in engines]
        G.append(max([f for f in finishes if f is not None], default=release[t]))
        ready = (Etrain[t - 1] + refit_block) if t else 0.0     # the trainer could start batch t
        start = max(G[t], ready)
        exposed.append(G[t] - release[t] if L == 0 else max(0.0, G[t] - ready))
        Etrain.append(start + _phase_time(rl.logprob, batches[t], train_flops)
                      + _phase_time(rl.train, batches[t], train_flops))
        U[t + 1] = Etrain[t] + rl.refit_s
        if L > 0:
            for eng in engines:
                eng.add_pause(Etrain[t], rl.refit_s)
        predictor.observe_many(zip(batches[t].problem_ids, (int(x) for x in batches[t].lengths), strict=True))

    if L == 0:
        step_s = (U[N] - U[0]) / N
        windows = [(release[t], G[t]) for t in range(N)]
        exposed_s = float(np.mean(exposed))
    else:
        step_s = (Etrain[N - 1] - Etrain[L]) / (N - 1 - L)
        windows = [(0.0, G[N - 1])]
        exposed_s = float(np.mean(exposed[L + 1:]))
    rollout_s = float(np.mean([G[t] - release[t] for t in range(N)]))
    return _result(policy, placement, E, [release[t] for t in range(N)], G, Etrain, rollout_s, step_s, exposed_s,
                   windows, engines, batches[:N])


def _result(policy, placement, E, release, G, Etrain, rollout_s, step_s, exposed_s, windows, engines,
            batches) -> RunResult:
    window_len = sum(hi - lo for lo, hi in windows)
    busy = sum(_overlap(eng.stats.busy, lo, hi) for eng in engines for lo, hi in windows)
    idle = 1.0 - busy / (E * window_len) if window_len > 0 else 0.0
    st = [eng.stats for eng in engines]
    spec_steps = sum(s.spec_request_steps for s in st)
    return RunResult(
        speculative=policy is not None,
        placement=placement,
        num_engines=E,
        release=release,
        gen_done=G,
        train_done=Etrain,
        rollout_s=rollout_s,
        step_s=step_s,
        gen_idle_fraction=max(0.0, idle),
        response_tokens=int(sum(int(b.lengths.sum()) for b in batches)),
        target_steps=sum(s.steps for s in st),
        draft_tokens=sum(s.draft_tokens for s in st),
        verified_tokens=sum(s.verified_tokens for s in st),
        mean_accepted_length=(sum(s.spec_committed for s in st) / spec_steps) if spec_steps else 1.0,
        exposed_generation_s=exposed_s,
        preemptions=sum(s.preemptions for s in st),
        engine_busy_s=[s.busy_s for s in st],
        judged_by_batch=dict(sum((Counter(s.judged_by_batch) for s in st), Counter())),
        off_by_batch=dict(sum((Counter(s.off_by_batch) for s in st), Counter())),
        hybrid_model_steps=sum(s.hybrid_model_steps for s in st),
        hybrid_request_steps=dict(sum((Counter(s.hybrid_request_steps) for s in st), Counter())),
    )


__all__ = ["RunResult", "simulate_rl"]
