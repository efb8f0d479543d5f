"""Bench suite `drafters`: every CPU drafter vs no speculation on the bundled workload.

One process, the same prompts and weights for every engine. Each drafter engine is measured
against the no-spec engine twice in ABBA order (baseline, spec, spec, baseline) so slow drift
of a shared machine does not favour either side. The suffix drafters first see one previous
step of rollouts for the same problems (as in RL, where problems recur every epoch): DAS via
its lockstep rebuild update, vLLM's suffix via its own cache.

Run-file knobs (optional): `bench.drafters.repeats` (default 3), the ABBA rounds per drafter;
`bench.drafters.hardware` (default h100_qwen3_8b), the hardware profile the engines' traces are
priced on. Beside the registry's rows (vLLM's suffix and n-gram at the run file's k), vLLM's
built-ins at their own defaults (`bench/builtins.py`); DAS is judged against the best of the four
by priced throughput ratio, at each host speed (``vs_best_builtin``). A row's `wall_clock_ratio` is
the median of its rounds' ratios (`wall_clock_ratios` lists them, the table prints their spread):
on a 2-core machine one round's ratio moves by up to 17% between two quiet runs, so the wall clock
is printed, not judged. The judge is `priced_throughput_ratio`: every engine's trace
(`engine/tracing.py`) priced on the profile (`cost/price.py`), the speculative engine's generated
tokens per priced second over the no-spec engine's (at T > 0 the two sample different texts; `bench
--suite das` replays one text). A model drafter is priced at the profile's shape for it (an Eagle3
head of Qwen3-8B, ...), so the figure is what this acceptance would give at that shape. vLLM's
suffix caches its own finished requests, so its later rounds draft with more history than its
first. Each row keeps its first round's traces (`trace`, `baseline_trace`).
"""
from __future__ import annotations

import functools
import operator
import statistics
import time

from nemo_rl_specdec.bench.builtins import changes as builtin_changes, verdict_lines
from nemo_rl_specdec.cost.price import HOST_SPEEDS, PricedDrafter
from nemo_rl_specdec.drafters.base import MODEL, Declared, VllmMapping
from nemo_rl_specdec.drafters.registry import drafter as drafter_of, registered
from nemo_rl_specdec.lockstep import Refreshable
from nemo_rl_specdec.update import PolicyUpdate

BLOCK = "policy.generation.speculative_decoding"
OURS = "suffix (DAS)"   # the row judged against vLLM's built-ins
# vLLM's built-ins at their own defaults (`bench/builtins.py`), added to the registry's rows
DEFAULT_ROWS = {"suffix (vLLM defaults)": "vllm_suffix_default", "ngram (vLLM defaults)": "ngram_default"}
# every row that is one of vLLM's built-ins: the registry's at the run file's k, and the default ones
BUILTIN_ROWS = {"suffix (vLLM)": "vllm_suffix", "ngram": "ngram", **DEFAULT_ROWS}


def cpu_drafters(spec=None) -> dict:
    """Bench rows (label -> overrides) of every registered drafter; with `spec`, only the model drafters
    whose checkpoint the run file names (e.g. none is bundled for SmolLM2)."""
    out = {}
    for name, d in registered(Declared).items():
        if spec is not None and d.kind == MODEL and not d.checkpoint(spec):
            continue
        for label, over in drafter_of(name, PricedDrafter).variants:
            out[label] = [f"{BLOCK}.drafter={name}"] + [f"{BLOCK}.{o}" for o in over]
    return out


def workload(cfg, tok, num_problems: int, samples: int, seed: int):
    from nemo_rl_specdec.demo.task import run_problems, run_requests

    return run_requests(cfg, tok, run_problems(cfg, num_problems, seed), samples)


def prepare(eng, dcfg, reqs, history) -> None:
    """Give a drafter engine what it has before an RL step: the suffix drafters one previous
    step of rollouts of the same problems (DAS, and the hybrid's DAS half, via their lockstep
    update, which says a model part is still its checkpoint; vLLM's suffix via its own cache);
    the others a short warm-up (ngram JIT etc.)."""
    spec = dcfg.spec
    if drafter_of(spec, Refreshable).rollout_prompt_tail(spec) is not None:
        eng.update(PolicyUpdate(1, rollouts=[{"problem_id": r.problem_id, "prompt_token_ids": r.prompt_token_ids,
                                       "token_ids": r.token_ids, "policy_version": 0} for r in history],
                                drafter_checkpoint=drafter_of(spec, Declared).kind == MODEL))
    elif drafter_of(spec, VllmMapping).caches_own_requests(spec):
        eng.generate(reqs)  # vLLM's suffix cache learns from its own finished requests
    else:
        eng.generate(reqs[: len(reqs) // 4])


def _options(cfg) -> dict:
    from nemo_rl_specdec.bench import MAX_REPEATS, hardware_option, option, suite_options

    b = suite_options(cfg, "drafters", known=("repeats", "hardware"))
    return {"repeats": option(b, "drafters", "repeats", 3, 1, MAX_REPEATS), "profile": hardware_option(b, "drafters")}


def priced_ratio(profile, spec_traces: list, base_traces: list, host_speed: float = 1.0) -> float:
    """Generated tokens per priced second of the speculative traces over the no-spec ones', with the
    host term priced at `host_speed`."""
    from nemo_rl_specdec.cost.price import price

    def rate(traces: list) -> float:
        return (sum(t.generated_tokens for t in traces)
                / sum(price(t, profile, host_speed=host_speed).rollout_s for t in traces))

    return rate(spec_traces) / rate(base_traces)


def _timed(engine, reqs):
    t0 = time.perf_counter()
    out = engine.generate(reqs)
    return time.perf_counter() - t0, out


def run(cfg, args) -> list:
    from nemo_rl_specdec.bench import print_table
    from nemo_rl_specdec.config import load_run_config
    from nemo_rl_specdec.engine.engine import Engine

    grpo = cfg.raw.get("grpo", {})
    n_prob = int(grpo.get("num_prompts_per_step", 16))
    n_samp = int(grpo.get("num_generations_per_prompt", 4))
    opts = _options(cfg)
    repeats, profile = opts["repeats"], opts["profile"]
    from nemo_rl_specdec.config import cost_entry

    rows = {name: load_run_config(cfg.source, list(args.overrides) + ov) for name, ov in cpu_drafters(cfg.spec).items()}
    # vLLM's built-ins as they come (bench/builtins.py), beside the registry's rows at the run file's k
    rows.update({label: cfg.with_spec(enabled=True, **builtin_changes(b, cfg)) for label, b in DEFAULT_ROWS.items()})
    for dcfg in rows.values():   # a profile that cannot price a row fails before any engine
        profile.drafter(cost_entry(dcfg.spec)[1])
    base = Engine(cfg, spec_enabled=False, name="no-spec")
    reqs = workload(cfg, base.tokenizer(), n_prob, n_samp, seed=int(grpo.get("seed", 0)))
    history = base.generate(reqs).rollouts  # the "previous step" for history-based drafters; also the warm-up
    results = []
    for name, dcfg in rows.items():
        eng = Engine(dcfg, name=name)
        spec_m, base_m, ratios, lengths, spec_t, base_t = [], [], [], [], [], []
        tb = ts = 0.0
        try:
            prepare(eng, dcfg, reqs, history)
            for _ in range(repeats):  # ABBA
                tb1, b1_ = _timed(base, reqs)
                ts1, o1 = _timed(eng, reqs)
                ts2, o2 = _timed(eng, reqs)
                tb2, b2 = _timed(base, reqs)
                lengths = lengths or [len(r.token_ids) for r in b1_.rollouts]  # for the simulator cross-check
                ratios.append((tb1 + tb2) / (ts1 + ts2))
                tb, ts = tb + tb1 + tb2, ts + ts1 + ts2
                spec_m += [o1.metrics, o2.metrics]
                base_m += [b1_.metrics, b2.metrics]
                spec_t += [o1.trace, o2.trace]
                base_t += [b1_.trace, b2.trace]
        finally:
            eng.close()
        m, mb = functools.reduce(operator.add, spec_m), functools.reduce(operator.add, base_m)
        results.append({
            "name": name, "drafter": dcfg.spec.drafter, "k": dcfg.spec.num_speculative_tokens,
            "tokens_per_target_forward": m.acceptance_length, "acceptance_rate": m.acceptance_rate,
            "accepted_per_position": [round(x, 3) for x in m.accepted_per_position],
            "tokens_per_s": m.generated_tokens / ts, "baseline_tokens_per_s": mb.generated_tokens / tb,
            # same prompts and weights; at T>0 the sampled lengths differ, so also the throughput ratio
            "wall_clock_ratio": statistics.median(ratios), "wall_clock_ratios": ratios,
            "wall_clock_spread": f"{min(ratios):.2f}-{max(ratios):.2f}",
            "hardware": profile.name, "priced_throughput_ratio": priced_ratio(profile, spec_t, base_t),
            "priced_by_host_speed": [{"host_speed": h, "priced_throughput_ratio": priced_ratio(profile, spec_t,
                                                                                               base_t, h)}
                                     for h in HOST_SPEEDS],
            "trace": spec_t[0].to_dict(), "baseline_trace": base_t[0].to_dict(),
            "throughput_ratio": (m.generated_tokens / ts) / (mb.generated_tokens / tb),
            "accepted_per_draft_step": m.accepted_per_draft_step,
            "lengths": lengths,
            "drafts": m.drafts, "per_step": [],
        })
    base.close()
    table = [dict(r, accepted_per_position=" ".join(f"{x:.2f}" for x in r["accepted_per_position"])) for r in results]
    print_table(table, ["name", "k", "tokens_per_s", "baseline_tokens_per_s", "tokens_per_target_forward",
                        "acceptance_rate", "accepted_per_position", "priced_throughput_ratio", "wall_clock_ratio",
                        "wall_clock_spread", "throughput_ratio"])
    print(f"priced_throughput_ratio: generated tokens per second with each engine's steps priced on {profile.name} "
          f"({profile.hardware.name}), speculative over no-spec (the judge); wall_clock_ratio: the median of "
          f"{repeats} ABBA rounds on this machine, with its spread (printed, not judged)")
    for line in verdict_lines(judge(results), "priced throughput ratio", {BUILTIN_ROWS[r["name"]]: r["k"]
                                                                          for r in results
                                                                          if r["name"] in BUILTIN_ROWS}):
        print(line)
    return results


def judge(results: list) -> list[dict]:
    """DAS (`OURS`) against the best of vLLM's built-ins (`BUILTIN_ROWS`) by priced throughput ratio,
    at each host speed; each result row gains it as ``vs_best_builtin`` where the rows are there."""
    from nemo_rl_specdec.bench.builtins import verdict

    by = {r["name"]: r for r in results}
    if OURS not in by or not set(by) & set(BUILTIN_ROWS):
        return []
    figures: dict = {}
    for name, r in by.items():
        if name == OURS or name in BUILTIN_ROWS:
            for b in r["priced_by_host_speed"]:
                figures.setdefault(b["host_speed"], {})[BUILTIN_ROWS.get(name, name)] = b["priced_throughput_ratio"]
    v = verdict(figures, OURS, higher=True)
    by[OURS]["vs_best_builtin"] = v
    return v
