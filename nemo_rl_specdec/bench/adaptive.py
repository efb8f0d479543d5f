"""Bench suite `adaptive`: fixed draft lengths against auto, per drafter and load regime, in one run.

    nemo-rl-specdec bench configs/tiny_cpu.yaml --suite adaptive --json OUT.json [key=value ...]

Workload: one GRPO batch of the bundled task (``problems`` x ``samples``, at the run file's
temperature), after a warm batch of the same problems whose rollouts fill DAS's store (a lockstep
update, as after an RL step) and train the length predictor (frozen afterwards, so every
configuration gets the same placement).

- drafters (``drafters``): ``das`` (suffix, DAS store), ``ngram``, ``draft_model`` (the bundled draft);
- regimes (``regimes``): ``seqs8`` (one engine that decodes at most 8 requests at once, the rest
  queue), ``all`` (one engine, every request at once), ``2eng_length_aware`` (two engines,
  length-aware placement);
- configurations: no speculation, fixed k in ``ks`` (default 2, 4, 8; every draft verified:
  `scheduling.budget: uniform`, `auto_disable: false`, vLLM's own n-gram), and ``auto``: DAS and
  n-gram (through our proposer, `ngram.backend: specdec`) under `scheduling.budget: adaptive`,
  draft_model under `scheduling.k: auto`, each with k up to max(ks).

Each regime keeps one no-spec group alive; each speculative configuration starts its own group on
the same cores, rolls the batch out once off the clock (first-call costs, and k: auto's 64-step
exploration warm-up, which a run pays once in its first minutes but which is half the steps of one
batch of 64 requests decoded at once here), and runs against the no-spec group in ABBA order
(no-spec, spec, spec, no-spec), ``repeats`` rounds. ``wall_clock_ratio`` is the median over rounds
of no-spec makespan / spec makespan.
An auto row also reports ``vs_best_fixed`` (its ratio over the best fixed k's of the same drafter
and regime, in hindsight), what it chose (``chosen``: the k-by-batch-size schedule, or the steps
the per-step rule cut), and the engines' step-cost fit (``cost_fit``). The closing lines state,
per regime, auto's ratio over no-spec and over the best fixed k.

Priced first (`priced`): fixed k in ``priced_ks`` (default 1, 2, 3, 4, 6, 8) against auto for the
history drafters, replayed on one recorded text per regime (8 requests at once, the whole batch,
and ``large_batch`` requests, default 256) and priced on ``hardware`` (default h100_qwen3_8b;
docs/pricing.md); auto is the per-step rule deciding on that profile's costs. These are the
judged figures; ``engines: false`` stops after them. Engine rows also carry
``engine_priced_throughput_ratio`` (their own steps priced) and ``traces``.

Run-file knobs (optional, under ``bench.adaptive``): ``drafters``, ``regimes``, ``ks``,
``repeats`` (default 3), ``problems`` / ``samples`` (default the run file's GRPO batch),
``max_new_tokens`` (default the run file's), ``problem_seed``.
"""
from __future__ import annotations

import functools
import logging
import statistics
import time

from nemo_rl_specdec.bench import MAX_PROMPTS, MAX_REPEATS, MAX_SAMPLES, hardware_option, say, suite_options
from nemo_rl_specdec.config.run import ConfigError, load_run_config
from nemo_rl_specdec.config.schema import int_setting
from nemo_rl_specdec.update import PolicyUpdate

_say = functools.partial(say, "adaptive")
BLOCK = "policy.generation.speculative_decoding"
DRAFTERS = {  # name -> (overrides of every configuration, overrides of a fixed k, overrides of auto)
    "das": (["drafter=suffix", "suffix.backend=das"], ["auto_disable=false"], ["scheduling.budget=adaptive"]),
    "ngram": (["drafter=ngram"], ["ngram.backend=vllm"], ["ngram.backend=specdec", "scheduling.budget=adaptive"]),
    "draft_model": (["drafter=draft_model", "refresh.mode=frozen"], [], ["scheduling.k=auto"]),
}
REGIMES = {"seqs8": (1, 8, "contiguous"), "all": (1, None, "contiguous"),
           "2eng_length_aware": (2, None, "length_aware")}
# the priced replays: fixed k against auto, per history drafter and concurrency regime
PRICED_KS = (1, 2, 3, 4, 6, 8)
LARGE_BATCH = 256   # requests decoded at once in the large-batch regime (compute-bound on a GPU)
# drafter -> (the profile's entry of a fixed k, of auto; overrides of every configuration, of a fixed k, of auto)
PRICED = {
    "das": ("das", "das", ["drafter=suffix", "suffix.backend=das", "refresh.mode=rebuild"],
            ["auto_disable=false", "scheduling.budget=uniform"], ["scheduling.budget=adaptive"]),
    "ngram": ("ngram", "ngram_specdec", ["drafter=ngram", "refresh.mode=frozen"], ["ngram.backend=vllm"],
              ["ngram.backend=specdec", "scheduling.budget=adaptive"]),
}


def _options(cfg) -> dict:
    b = suite_options(cfg, "adaptive", known=("drafters", "regimes", "ks", "repeats", "problems", "samples",
                                               "max_new_tokens", "problem_seed", "hardware", "engines",
                                               "priced_ks", "large_batch"))
    opts = {
        "drafters": list(b.get("drafters", list(DRAFTERS))),
        "regimes": list(b.get("regimes", list(REGIMES))),
        "ks": list(b.get("ks", [2, 4, 8])),
        "repeats": b.get("repeats", 3),
        "problems": b.get("problems", cfg.setting("grpo.num_prompts_per_step", 16, 1, MAX_PROMPTS)),
        "samples": b.get("samples", cfg.setting("grpo.num_generations_per_prompt", 4, 1, MAX_SAMPLES)),
        "max_new_tokens": b.get("max_new_tokens", cfg.generation.max_new_tokens),
        "problem_seed": b.get("problem_seed", 40_000 + cfg.setting("grpo.seed", 0, 0, 2**32 - 1)),
    }
    opts["profile"] = hardware_option(b, "adaptive")
    opts["engines"] = b.get("engines", True)
    if not isinstance(opts["engines"], bool):
        raise ConfigError(f"bench.adaptive.engines: got {opts['engines']!r}; allowed: true (the engine regimes after "
                          "the priced replays) or false (the priced replays only)")
    opts["priced_ks"] = list(b.get("priced_ks", list(PRICED_KS)))
    if not opts["priced_ks"] or any(isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 64
                                    for k in opts["priced_ks"]):
        raise ConfigError(f"bench.adaptive.priced_ks: got {opts['priced_ks']!r}; allowed: a non-empty list of ints "
                          "in 1..64")
    opts["large_batch"] = int_setting(b.get("large_batch", LARGE_BATCH), "bench.adaptive.large_batch", 1,
                                      MAX_PROMPTS * MAX_SAMPLES)
    for key, allowed in (("drafters", DRAFTERS), ("regimes", REGIMES)):
        if not opts[key] or any(x not in allowed for x in opts[key]):
            raise ConfigError(f"bench.adaptive.{key}: got {opts[key]!r}; allowed: a non-empty subset of "
                              f"{list(allowed)}")
    if not opts["ks"] or any(isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 64 for k in opts["ks"]):
        raise ConfigError(f"bench.adaptive.ks: got {opts['ks']!r}; allowed: a non-empty list of ints in 1..64")
    for key, lo, hi in (("repeats", 1, MAX_REPEATS), ("problems", 1, MAX_PROMPTS), ("samples", 1, MAX_SAMPLES),
                        ("max_new_tokens", 1, cfg.generation.vllm_cfg.max_model_len), ("problem_seed", 0, 2**32 - 1)):
        int_setting(opts[key], f"bench.adaptive.{key}", lo, hi)
    return opts


def configurations(opts: dict) -> list:
    """(drafter, label, block overrides) of every speculative configuration, in run order."""
    out = []
    for d in opts["drafters"]:
        common, fixed, auto = DRAFTERS[d]
        for k in sorted(opts["ks"]):
            out.append((d, f"k{k}", common + fixed + [f"num_speculative_tokens={k}"]))
        out.append((d, "auto", common + auto + [f"num_speculative_tokens={max(opts['ks'])}"]))
    return out


def _cost_fit(states: list) -> list:
    """Each engine's step-cost fit: k: auto's, or our proposer's (`<das|ngram>/step_cost/*` metrics)."""
    fits = []
    for s in states:
        if s.get("k_auto"):
            fits.append(s["k_auto"]["step_cost"])
            continue
        m = s.get("metrics") or {}
        fit = {k.split("/step_cost/", 1)[1]: v for k, v in m.items() if "/step_cost/" in k}
        if fit:
            fits.append(fit)
    return fits


def _chosen(states: list) -> list:
    out = []
    for s in states:
        if s.get("k_auto"):
            ka = s["k_auto"]
            out.append({"schedule": ka["schedule"], "switches": ka["switches"], "regret": ka["regret"],
                        "acceptance_by_position": ka["acceptance_by_position"]})
            continue
        m = s.get("metrics") or {}
        keep = ("adaptive_steps", "adaptive_off_steps", "adaptive_cut_tokens", "skipped_steps")
        got = {k.split("/", 1)[1]: v for k, v in m.items() if k.split("/", 1)[-1] in keep}
        if got:
            out.append(got)
    return out


def priced(cfg, opts: dict) -> list:
    """Fixed k against auto on one recorded text per regime, every step priced on the hardware profile.

    A no-spec engine rolls out a warm batch and the measured batch of the workload (and, for the
    large-batch regime, `large_batch` requests of the same problems, more samples each); each
    configuration replays them (`bench/replay.py`: the warm batch fills DAS's store) with at most
    the regime's requests decoding at once. Fixed k verifies every draft; auto is the block's
    `scheduling.budget: adaptive` rule deciding on the profile's step cost (`PricedStepCost`). The
    measured batch's trace is priced against the same text without drafts."""
    from nemo_rl_specdec.bench.replay import replay
    from nemo_rl_specdec.cost.price import PricedStepCost, speedup
    from nemo_rl_specdec.demo import task
    from nemo_rl_specdec.driver.engine import Engine

    profile, T, max_new = opts["profile"], cfg.generation.temperature, opts["max_new_tokens"]
    problems = task.run_problems(cfg, opts["problems"], seed=opts["problem_seed"])
    large_samples = max(1, -(-opts["large_batch"] // len(problems)))
    base = Engine(cfg, spec_enabled=False, name="priced_nospec")
    try:
        tok = base.tokenizer()
        reqs = task.run_requests(cfg, tok, problems, opts["samples"])
        big = task.run_requests(cfg, tok, problems, large_samples)[:opts["large_batch"]]
        texts = {}
        for name, rs in (("batch", reqs), ("large", big)):
            warm = base.generate(rs, max_new_tokens=max_new, temperature=T).rollouts
            texts[name] = [warm, base.generate(rs, max_new_tokens=max_new, temperature=T).rollouts]
    finally:
        base.close()
    regimes = {"seqs8": ("batch", 8), "all": ("batch", None), f"seqs{opts['large_batch']}": ("large", None)}
    _say(f"priced replays on {profile.name}: {len(reqs)} requests ({len(big)} in the large-batch regime), "
         f"k in {opts['priced_ks']} and auto, drafters {[d for d in opts['drafters'] if d in PRICED]}")
    rows = []
    for regime, (which, seqs) in regimes.items():
        for drafter in [d for d in opts["drafters"] if d in PRICED]:
            fixed_key, auto_key, common, fixed, auto = PRICED[drafter]
            confs = [(f"k{k}", fixed_key, fixed + [f"num_speculative_tokens={k}"]) for k in sorted(opts["priced_ks"])]
            confs.append(("auto", auto_key, auto + [f"num_speculative_tokens={max(opts['priced_ks'])}"]))
            for label, key, ov in confs:
                spec = load_run_config(cfg.source, [f"{BLOCK}.enabled=true"]
                                       + [f"{BLOCK}.{o}" for o in common + ov]).spec
                cost = PricedStepCost(profile, key, spec.num_speculative_tokens) if label == "auto" else None
                rep = replay(spec, texts[which], cfg.generation.vllm_cfg.max_model_len, T, max_num_seqs=seqs,
                             step_cost=cost, label=key)
                trace = rep[1]["trace"]
                sp = speedup(trace, profile)
                rows.append({"name": f"{drafter}/{label}@{regime}", "drafter": drafter, "config": label,
                             "regime": regime, "requests": len(texts[which][1]), "max_num_seqs": seqs,
                             "k": spec.num_speculative_tokens, "hardware": profile.name,
                             "priced_speedup": sp["speedup"],
                             "tokens_per_target_forward": sp["spec"]["tokens_per_forward"],
                             "acceptance_rate": (rep[1]["accepted_draft_tokens"] / rep[1]["draft_tokens"]
                                                 if rep[1]["draft_tokens"] else 0.0),
                             "draft_tokens": rep[1]["draft_tokens"], "trace": trace.to_dict()})
                _say(f"priced {regime} {drafter} {label}: {sp['speedup']:.3f}x")
    for r in rows:
        r.setdefault("vs_best_fixed", None)
        if r["config"] != "auto":
            continue
        fixed_rows = [x for x in rows if x["drafter"] == r["drafter"] and x["regime"] == r["regime"]
                      and x["config"] != "auto"]
        best = max(fixed_rows, key=lambda x: x["priced_speedup"])
        r["best"] = best["config"] if best["priced_speedup"] > 1.0 else "no-spec"
        r["vs_best_fixed"] = r["priced_speedup"] / max(1.0, best["priced_speedup"])
    return rows


def run(cfg, args) -> list:
    import ray
    from transformers import AutoTokenizer

    from nemo_rl_specdec.bench import print_table
    from nemo_rl_specdec.bench.drafters import priced_ratio
    from nemo_rl_specdec.bench.scheduling import with_max_num_seqs
    from nemo_rl_specdec.demo import task
    from nemo_rl_specdec.driver.group import EngineGroup
    from nemo_rl_specdec.scheduling.predictor import LengthPredictor

    opts = _options(cfg)
    priced_rows = priced(cfg, opts)
    _print_priced(priced_rows, opts["profile"])
    if not opts["engines"]:
        return [_as_result(r) for r in priced_rows]
    confs = configurations(opts)
    T, max_new = cfg.generation.temperature, opts["max_new_tokens"]
    engines_max = max(REGIMES[r][0] for r in opts["regimes"])
    if not ray.is_initialized():  # a no-spec group and one speculative group at a time, on the same cores
        ray.init(num_cpus=2 * engines_max, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    tok = AutoTokenizer.from_pretrained(cfg.model_path)
    reqs = task.run_requests(cfg, tok, task.run_problems(cfg, opts["problems"], seed=opts["problem_seed"]),
                             opts["samples"])
    _say(f"{len(reqs)} requests, T={T}, max_new_tokens={max_new}, drafters={opts['drafters']}, regimes="
         f"{opts['regimes']}, ks={opts['ks']}, repeats={opts['repeats']}, model={cfg.model_path}")
    results: list = []
    for regime in opts["regimes"]:
        E, seqs, placement = REGIMES[regime]
        predictor = LengthPredictor(cold_start="mean", max_len=max_new)

        def group(overrides, name, spec_enabled=None, *, E=E, seqs=seqs, predictor=predictor):  # bound per regime
            c = with_max_num_seqs(load_run_config(cfg.source, list(args.overrides) + overrides), seqs)
            return EngineGroup(c, E, spec_enabled=spec_enabled, seed=0, predictor=predictor, name=name)

        def gen(g, placement=placement):
            return g.generate(reqs, placement=placement, max_new_tokens=max_new, temperature=T, observe=False)

        base = group([], f"nospec_{regime}_", spec_enabled=False)
        try:
            base.generate(reqs[:E], placement="round_robin", max_new_tokens=8, temperature=T, observe=False)
            warm = base.generate(reqs, placement="contiguous", max_new_tokens=max_new, temperature=T,
                                 observe=True).rollouts  # the previous step: predictor and DAS store
            for drafter, label, ov in confs:
                t0 = time.perf_counter()
                g = group([f"{BLOCK}.enabled=true"] + [f"{BLOCK}.{o}" for o in ov], f"{drafter}_{label}_{regime}_")
                try:
                    gen(g)  # off the clock: first-call costs, k: auto's exploration warm-up
                    if drafter == "das":
                        g.update(PolicyUpdate(1, rollouts=warm))
                    ratios, spec_runs, base_runs = [], [], []
                    for _ in range(opts["repeats"]):  # ABBA
                        b1, s1, s2, b2 = gen(base), gen(g), gen(g), gen(base)
                        ratios.append((b1.makespan_s + b2.makespan_s) / (s1.makespan_s + s2.makespan_s))
                        spec_runs += [s1, s2]
                        base_runs += [b1, b2]
                    states = spec_runs[-1].state.get("engines") or []
                finally:
                    g.close()
                gen_t = sum(r.metrics.generated_tokens for r in spec_runs)
                acc = sum(r.metrics.accepted_tokens for r in spec_runs)
                drafted = sum(r.metrics.draft_tokens for r in spec_runs)
                results.append({
                    "name": f"{drafter}/{label}@{regime}", "drafter": drafter, "config": label, "regime": regime,
                    "engines": E, "max_num_seqs": seqs, "placement": placement,
                    "k": int(label[1:]) if label != "auto" else max(opts["ks"]),
                    "wall_clock_ratio": float(statistics.median(ratios)), "wall_clock_ratios": ratios,
                    "wall_clock_spread": f"{min(ratios):.2f}-{max(ratios):.2f}",
                    # the engines' own steps priced: tokens per priced second against the no-spec group's
                    "engine_priced_throughput_ratio": priced_ratio(
                        opts["profile"], [t for r in spec_runs for t in r.traces if t is not None],
                        [t for r in base_runs for t in r.traces if t is not None]),
                    "traces": [t.to_dict() for t in spec_runs[0].traces if t is not None],
                    "tokens_per_target_forward": gen_t / (gen_t - acc) if gen_t > acc else 1.0,
                    "acceptance_rate": acc / drafted if drafted else 0.0,
                    "chosen": _chosen(states) if label == "auto" else None,
                    "cost_fit": _cost_fit(states),
                    "per_step": [],
                })
                _say(f"{regime} {drafter} {label}: {results[-1]['wall_clock_ratio']:.3f}x "
                     f"({time.perf_counter() - t0:.0f}s)")
        finally:
            base.close()
    _judge(results)
    results += [_as_result(r) for r in priced_rows]
    print_table([r for r in results if r["wall_clock_ratio"] is not None],
                ["name", "engine_priced_throughput_ratio", "wall_clock_ratio", "wall_clock_spread", "vs_best_fixed",
                 "tokens_per_target_forward", "acceptance_rate"])
    print(f"engine_priced_throughput_ratio: the engines' own steps priced on {opts['profile'].name}; wall_clock_ratio: "
          f"median of {opts['repeats']} ABBA rounds on this machine, with its spread (printed, not judged)")
    for r in results:
        if r["config"] == "auto" and r["wall_clock_ratio"] is not None:
            print(f"{r['name']}: {r['wall_clock_ratio']:.3f}x no-spec, "
                  f"{r['vs_best_fixed']:.3f}x the best fixed k ({r['best_fixed']}); chosen: {r['chosen']}")
    return results


def _as_result(r: dict) -> dict:
    """A priced row as a suite result (the engines' keys, with no wall clock measured)."""
    return {**r, "wall_clock_ratio": None, "per_step": []}


def _print_priced(rows: list, profile) -> None:
    from nemo_rl_specdec.bench import print_table

    print(f"Priced on {profile.name} ({profile.hardware.name}): fixed k and auto replayed on one recorded text per "
          "regime, each against the same text without drafts; auto against the best of no-spec and every "
          "fixed k")
    print_table(rows, ["name", "requests", "max_num_seqs", "priced_speedup", "vs_best_fixed", "best",
                       "tokens_per_target_forward", "acceptance_rate"])
    for r in rows:
        if r["config"] == "auto":
            print(f"{r['name']}: {r['priced_speedup']:.3f}x no-spec, {r['vs_best_fixed']:.3f}x the best of no-spec "
                  f"and fixed k ({r['best']})")


def _judge(results: list) -> None:
    """Add `vs_best_fixed` / `best_fixed` to the auto rows and `vs_best_fixed` (None) to the others."""
    for r in results:
        r.setdefault("vs_best_fixed", None)
        if r["config"] != "auto":
            continue
        fixed = [x for x in results if x.get("wall_clock_ratio") is not None and x["drafter"] == r["drafter"]
                 and x["regime"] == r["regime"] and x["config"] != "auto"]
        best = max(fixed, key=lambda x: x["wall_clock_ratio"])
        r["best_fixed"] = best["config"]
        r["vs_best_fixed"] = r["wall_clock_ratio"] / best["wall_clock_ratio"]
