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
the per-step rule cut), and the engines' step-cost fit (``cost_fit``). The closing lines check
the targets: auto >= 0.97 x no-spec and >= 0.97 x the best fixed k, per regime.

Run-file knobs (optional, under ``bench.adaptive``): ``drafters``, ``regimes``, ``ks``,
``repeats`` (default 1), ``problems`` / ``samples`` (default the run file's GRPO batch),
``max_new_tokens`` (default the run file's), ``problem_seed``.
"""
from __future__ import annotations

import functools
import logging
import statistics
import time

from nemo_rl_specdec.bench import MAX_PROMPTS, MAX_REPEATS, MAX_SAMPLES, say, suite_options
from nemo_rl_specdec.config import ConfigError, load_run_config
from nemo_rl_specdec.schema import int_setting
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
TARGET = 0.97


def _options(cfg) -> dict:
    b = suite_options(cfg, "adaptive", known=("drafters", "regimes", "ks", "repeats", "problems", "samples",
                                               "max_new_tokens", "problem_seed"))
    opts = {
        "drafters": list(b.get("drafters", list(DRAFTERS))),
        "regimes": list(b.get("regimes", list(REGIMES))),
        "ks": list(b.get("ks", [2, 4, 8])),
        "repeats": b.get("repeats", 1),
        "problems": b.get("problems", cfg.setting("grpo.num_prompts_per_step", 16, 1, MAX_PROMPTS)),
        "samples": b.get("samples", cfg.setting("grpo.num_generations_per_prompt", 4, 1, MAX_SAMPLES)),
        "max_new_tokens": b.get("max_new_tokens", cfg.generation.max_new_tokens),
        "problem_seed": b.get("problem_seed", 40_000 + cfg.setting("grpo.seed", 0, 0, 2**32 - 1)),
    }
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


def run(cfg, args) -> list:
    import ray
    from transformers import AutoTokenizer

    from nemo_rl_specdec.bench import print_table
    from nemo_rl_specdec.bench.scheduling import with_max_num_seqs
    from nemo_rl_specdec.demo import task
    from nemo_rl_specdec.engine.group import EngineGroup
    from nemo_rl_specdec.scheduling.predictor import LengthPredictor

    opts = _options(cfg)
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
                    ratios, spec_runs = [], []
                    for _ in range(opts["repeats"]):  # ABBA
                        b1, s1, s2, b2 = gen(base), gen(g), gen(g), gen(base)
                        ratios.append((b1.makespan_s + b2.makespan_s) / (s1.makespan_s + s2.makespan_s))
                        spec_runs += [s1, s2]
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
    print_table(results, ["name", "wall_clock_ratio", "vs_best_fixed", "tokens_per_target_forward",
                          "acceptance_rate"])
    for r in results:
        if r["config"] == "auto":
            print(f"{r['name']}: {r['wall_clock_ratio']:.3f}x no-spec (target >= {TARGET}), "
                  f"{r['vs_best_fixed']:.3f}x the best fixed k ({r['best_fixed']}, target >= {TARGET}); chosen: "
                  f"{r['chosen']}")
    return results


def _judge(results: list) -> None:
    """Add `vs_best_fixed` / `best_fixed` to the auto rows and `vs_best_fixed` (None) to the others."""
    for r in results:
        r.setdefault("vs_best_fixed", None)
        if r["config"] != "auto":
            continue
        fixed = [x for x in results if x["drafter"] == r["drafter"] and x["regime"] == r["regime"]
                 and x["config"] != "auto"]
        best = max(fixed, key=lambda x: x["wall_clock_ratio"])
        r["best_fixed"] = best["config"]
        r["vs_best_fixed"] = r["wall_clock_ratio"] / best["wall_clock_ratio"]
        r["meets_targets"] = r["wall_clock_ratio"] >= TARGET and r["vs_best_fixed"] >= TARGET
