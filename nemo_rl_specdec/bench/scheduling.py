"""Bench suite `scheduling`: placement x budget on a group of engines, one long-tailed batch.

    nemo-rl-specdec bench configs/tiny_cpu.yaml --suite scheduling --json OUT.json [key=value ...]

One run, two `EngineGroup`s of the same size on the same cores (engine i on core i): a
no-spec group and a speculative group (the run file's drafter). The workload is one GRPO
rollout batch of the bundled task — ``problems`` problems x ``samples`` samples each, the
samples of a problem next to each other in input order, as NeMo-RL hands a batch to its
data-parallel workers — at the run file's temperature.

1. Warm-up: both groups roll out a *previous* batch of the same problems; its lengths train
   the length predictor (shared by both groups) and its rollouts fill the DAS drafter's store
   (a lockstep update, as after an RL step). The predictor is frozen afterwards
   (``observe=False``), so every configuration sees the same predictions and placements.
2. Measurement, interleaved so that every configuration sees the same machine load: for each
   repeat and each placement (contiguous | round_robin | length_aware) the no-spec group
   rolls the batch out once, then the speculative group once per budget (uniform |
   length_aware | das).

The whole matrix runs once per concurrency regime in ``max_num_seqs`` (vLLM's cap on requests
decoded at once per engine; ``null`` = vLLM's default, 256 on CPU, i.e. every request of the
batch runs at once; a small cap makes requests queue, as on a GPU whose KV cache holds only a
few long responses). The engines are rebuilt per regime; each regime has its own warm-up.

Placement is compared with its ceiling on the priced placements (`priced_placement`, before the
engine groups): the placement ceiling of `bench/ceilings.py` (a lower bound on the priced makespan
and the best placement a search finds) per draw, every draw counted. The engine rows are compared
with a reference: every measured batch is replayed in the simulator under the reference placement
(length_aware on the true lengths; `placement_reference`), and each configuration's paired cut against
contiguous is reported as a share of the reference cut of its own problem draw,
``share_of_reference_cut`` (mean over draws; ``..._per_draw``).

Per configuration (medians over the repeats): ``makespan_s`` (dispatch until the last request
of the batch finished), ``wall_clock_ratio`` = no-spec makespan / this makespan under the same
placement, ``makespan_vs_contiguous`` = the same group's contiguous makespan (uniform budget)
/ this one, ``makespan_cut_per_repeat_pct`` = 1 - this / contiguous within each repeat (the
two ran back to back) and its median ``makespan_cut_paired_median_pct``,
``vs_uniform_budget`` = the same placement with the uniform budget / this one, tokens per
target forward, acceptance rate, per-engine finish times, tokens and longest rollout.

Run-file knobs (all optional, under ``bench.scheduling``): ``problems`` (default
``grpo.num_prompts_per_step``), ``samples`` (default ``grpo.num_generations_per_prompt``),
``engines`` (default ``cluster.num_engines`` if > 1, else 2), ``repeats`` (default 5),
``draws`` (default 1: independent problem sets per regime, each with its own warm-up; medians
then run over every draw's repeats),
``placements``, ``budgets`` (subset of uniform | length_aware | das | adaptive, default the first
three),
``max_num_seqs`` (list of regimes, default ``[null, 8]``), ``problem_seed``, ``temperature``
(default the run file's), ``max_new_tokens`` (default the run file's).
"""
from __future__ import annotations

import copy
import functools
import logging
import statistics
import time
from typing import Any

from nemo_rl_specdec.bench import (
    MAX_ENGINES,
    MAX_PROMPTS,
    MAX_REPEATS,
    MAX_SAMPLES,
    hardware_option,
    option,
    say,
    suite_options,
)
from nemo_rl_specdec.config.run import ConfigError, RunConfig, validate_run_dict
from nemo_rl_specdec.scheduling.budget import BUDGETS
from nemo_rl_specdec.scheduling.placement import PLACEMENTS
from nemo_rl_specdec.update import PolicyUpdate

_say = functools.partial(say, "scheduling")

def _options(cfg: RunConfig) -> dict:
    b = suite_options(cfg, "scheduling", known=("problems", "samples", "engines", "repeats", "draws", "placements",
                                                 "budgets", "max_num_seqs", "problem_seed", "temperature",
                                                 "max_new_tokens", "hardware", "priced_draws", "engines_run"))
    cluster = cfg.setting("cluster.num_engines", 1, 1, MAX_ENGINES)
    seqs = b.get("max_num_seqs", [None, 8])
    seqs = seqs if isinstance(seqs, list) else [seqs]
    seed = cfg.setting("grpo.seed", 0, 0, 2**32 - 1)
    opts = {
        "problems": option(b, "scheduling", "problems", cfg.setting("grpo.num_prompts_per_step", 16, 1,
                                                                    MAX_PROMPTS), 1, MAX_PROMPTS),
        "samples": option(b, "scheduling", "samples", cfg.setting("grpo.num_generations_per_prompt", 4, 1,
                                                                  MAX_SAMPLES), 1, MAX_SAMPLES),
        # placement needs at least two engines
        "engines": option(b, "scheduling", "engines", cluster if cluster > 1 else 2, 2, MAX_ENGINES),
        "repeats": option(b, "scheduling", "repeats", 5, 1, MAX_REPEATS),
        "draws": option(b, "scheduling", "draws", 1, 1, MAX_REPEATS),
        "placements": (list(b.get("placements", PLACEMENTS)) if isinstance(b.get("placements", []), list)
                       else [b["placements"]]),
        "budgets": (list(b.get("budgets", ["uniform", "length_aware", "das"])) if isinstance(b.get("budgets", []), list)
                    else [b["budgets"]]),
        "max_num_seqs": seqs,
        "problem_seed": option(b, "scheduling", "problem_seed", 30_000 + seed, 0, 2**32 - 1),
        "temperature": option(b, "scheduling", "temperature", cfg.generation.temperature, 0.0, 100.0, float),
        "max_new_tokens": option(b, "scheduling", "max_new_tokens", cfg.generation.max_new_tokens, 1,
                                 cfg.generation.vllm_cfg.max_model_len),
        "seed": seed,
        "profile": hardware_option(b, "scheduling"),
        "priced_draws": option(b, "scheduling", "priced_draws", PRICED_DRAWS, 1, MAX_REPEATS),
        "engines_run": b.get("engines_run", True),
    }
    if not isinstance(opts["engines_run"], bool):
        raise ConfigError(f"bench.scheduling.engines_run: got {opts['engines_run']!r}; allowed: true (the engine "
                          "groups after the priced placements) or false (the priced placements only)")
    bad = [p for p in opts["placements"] if p not in PLACEMENTS]
    if bad or "contiguous" not in opts["placements"]:
        raise ConfigError(f"bench.scheduling.placements: got {opts['placements']!r}; allowed: a subset of "
                          f"{list(PLACEMENTS)} that includes contiguous (the baseline)")
    bad = [x for x in opts["budgets"] if x not in BUDGETS]
    if bad or "uniform" not in opts["budgets"]:
        raise ConfigError(f"bench.scheduling.budgets: got {opts['budgets']!r}; allowed: a subset of {list(BUDGETS)} "
                          "that includes uniform (the baseline)")
    if not seqs or any(s is not None and (isinstance(s, bool) or not isinstance(s, int) or s < 1) for s in seqs):
        raise ConfigError(f"bench.scheduling.max_num_seqs: got {seqs!r}; allowed: a list of null or ints >= 1")
    if not cfg.spec.enabled:
        raise ConfigError("policy.generation.speculative_decoding.enabled: got False; allowed: true "
                          "(the scheduling bench compares speculative configurations against no-spec)")
    return opts


def _median(xs: list) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def _spearman(a: list, b: list) -> Any:
    try:
        from scipy.stats import spearmanr

        r = spearmanr(a, b).statistic
        return None if r != r else float(r)
    except Exception:  # noqa: BLE001 - a constant input or no scipy: no correlation to report
        return None


def with_max_num_seqs(cfg: RunConfig, max_num_seqs: int | None) -> RunConfig:
    """A copy of the run config with `policy.generation.vllm_cfg.max_num_seqs` set (None: removed)."""
    raw = copy.deepcopy(cfg.raw)
    gen = raw["policy"].setdefault("generation", {})
    vc = gen.setdefault("vllm_cfg", {}) or {}
    gen["vllm_cfg"] = vc
    if max_num_seqs is None:
        vc.pop("max_num_seqs", None)
    else:
        vc["max_num_seqs"] = int(max_num_seqs)
    return validate_run_dict(raw, cfg.source)


PRICED_DRAWS = 5  # problem draws of the priced placements
SEARCH_EVALUATIONS = 300  # engine timings the placement ceiling's local search may run per batch


def priced_placement(cfg: RunConfig, opts: dict) -> list[dict]:
    """Placement judged on the hardware profile: per problem draw, a no-spec engine rolls out a warm
    batch (it trains the length predictor, frozen afterwards, and is the drafter's history) and the
    measured batch; the measured batch is placed on the engines by each placement, and by
    `reference` (length_aware on the lengths the batch really had: a reference, not a bound); each
    engine's share is replayed with the run file's drafter (`bench/replay.py`, the warm batch first,
    as the update after the previous step gives it) and priced on the profile. The makespan is the
    slowest engine's priced rollout, with speculation and without (the same text without drafts).
    Beside it, the placement ceiling (`bench/ceilings.py`): the batch replayed once on one engine
    fixes each request's steps, and on that objective every placement's priced makespan, the best
    one a search finds and a lower bound no placement goes below. Per regime of `max_num_seqs` and
    draw: each placement's cut against contiguous, and its share of the ceiling."""
    from nemo_rl_specdec.bench.ceilings import PlacementPricer, placement_ceiling, request_steps
    from nemo_rl_specdec.bench.replay import replay
    from nemo_rl_specdec.cost.price import price
    from nemo_rl_specdec.demo import task
    from nemo_rl_specdec.driver.engine import Engine
    from nemo_rl_specdec.scheduling.placement import Request as Placed, place
    from nemo_rl_specdec.scheduling.predictor import LengthPredictor

    profile, E, T, max_new = opts["profile"], opts["engines"], opts["temperature"], opts["max_new_tokens"]
    from nemo_rl_specdec.config.run import cost_entry

    spec = cfg.spec
    kind, key = cost_entry(spec)
    if kind != "list":   # a model drafter's drafts need its model: it cannot be replayed on recorded text
        _say(f"priced placement: {spec.drafter} is a {kind} drafter; only a history drafter's rollouts replay, so "
             "this run prices none (the engine rows still record and price their traces)")
        return []
    profile.drafter(key)
    base = Engine(cfg, spec_enabled=False, name="priced_nospec", seed=opts["seed"])
    texts = []
    try:
        tok = base.tokenizer()
        for draw in range(opts["priced_draws"]):
            problems = task.run_problems(cfg, opts["problems"], seed=opts["problem_seed"] + 1000 * draw)
            reqs = task.run_requests(cfg, tok, problems, opts["samples"])
            warm = base.generate(reqs, max_new_tokens=max_new, temperature=T).rollouts
            texts.append((warm, base.generate(reqs, max_new_tokens=max_new, temperature=T).rollouts))
    finally:
        base.close()
    mml = cfg.generation.vllm_cfg.max_model_len
    rows = []
    for seqs in opts["max_num_seqs"]:
        for draw, (warm, batch) in enumerate(texts):
            predictor = LengthPredictor(cold_start="mean", max_len=max_new)
            predictor.observe_many((r.problem_id, len(r.token_ids)) for r in warm)
            predicted = [Placed(i, r.problem_id, predictor.predict(r.problem_id)) for i, r in enumerate(batch)]
            actual = [Placed(i, r.problem_id, float(len(r.token_ids))) for i, r in enumerate(batch)]
            plans = {p: place(predicted, E, p) for p in opts["placements"]}
            plans["reference"] = place(actual, E, "length_aware")
            spans = {}
            for name, plan in plans.items():
                spec_s, base_s = [], []
                for share in plan:
                    if not share:
                        continue
                    trace = replay(spec, [warm, [batch[i] for i in share]], mml, T,
                                   max_num_seqs=seqs, label=key)[1]["trace"]
                    spec_s.append(price(trace, profile).rollout_s)
                    base_s.append(price(trace.without_drafts(), profile).rollout_s)
                spans[name] = (max(spec_s), max(base_s))
            whole = replay(spec, [warm, batch], mml, T, max_num_seqs=seqs, label=key)[1]["trace"]
            pricer = PlacementPricer(request_steps(whole, [len(r.prompt_token_ids) for r in batch]),
                                     profile.cost_model(key), seqs)
            ceiling = placement_ceiling(pricer, E, plans, SEARCH_EVALUATIONS)
            ref = spans["contiguous"]
            cut = {n: 100.0 * (1 - v[0] / ref[0]) for n, v in spans.items()}
            rows.append({"max_num_seqs": seqs, "draw": draw, "makespan_s": {n: v[0] for n, v in spans.items()},
                         "nospec_makespan_s": {n: v[1] for n, v in spans.items()}, "cut_pct": cut,
                         "priced_speedup": {n: v[1] / v[0] for n, v in spans.items()}, "ceiling": ceiling})
            _say(f"priced placement seqs={seqs} draw {draw}: cut vs contiguous " + ", ".join(
                f"{n} {c:.1f}%" for n, c in cut.items() if n != "contiguous")
                + (f"; ceiling: bound {ceiling['lower_bound_s']:.3f}s ({ceiling['set_by']}), search "
                  f"{ceiling['search_s']:.3f}s, length_aware {ceiling['makespan_s']['length_aware']:.3f}s"
                   if "length_aware" in ceiling["makespan_s"] else ""))
    return rows


def _priced_summary(rows: list, opts: dict) -> list[dict]:
    """Per regime and placement: its share of the placement ceiling over every draw (none dropped),
    between the share of the bound and the share of the search (`bench/ceilings.py`), and its cut
    against contiguous, as suite results."""
    if not rows:
        return []
    out = []
    for seqs in opts["max_num_seqs"]:
        rs = [r for r in rows if r["max_num_seqs"] == seqs]
        for placement in [p for p in opts["placements"] if p != "contiguous"] + ["reference"]:
            lo = [r["ceiling"]["share_of_bound"][placement] for r in rs]
            hi = [r["ceiling"]["share_of_search"][placement] for r in rs]
            lo_m, hi_m = float(statistics.fmean(lo)), float(statistics.fmean(hi))
            out.append({"name": f"priced/{placement}@seqs{seqs if seqs is not None else '_all'}", "drafter": None,
                        "placement": placement, "max_num_seqs": seqs, "hardware": opts["profile"].name,
                        "share_of_ceiling_bound": lo_m, "share_of_ceiling_search": hi_m,
                        "share_of_ceiling_bound_per_draw": lo, "share_of_ceiling_search_per_draw": hi,
                        "search_between_bound_and_placement_per_draw": [
                            r["ceiling"]["search_between_bound_and"][placement] for r in rs],
                        "ceiling_set_by_per_draw": [r["ceiling"]["set_by"] for r in rs],
                        "draws": len(rs),
                        "cut_pct_per_draw": [r["cut_pct"][placement] for r in rs],
                        "priced_speedup_per_draw": [r["priced_speedup"][placement] for r in rs],
                        "tokens_per_target_forward": None, "acceptance_rate": None, "wall_clock_ratio": None,
                        "per_step": rs if placement == "reference" else []})
    return out


def _print_priced(summary: list, opts: dict) -> None:
    if not summary:
        return
    print(f"Priced placement on {opts['profile'].name} ({opts['profile'].hardware.name}), {opts['priced_draws']} "
          f"problem draws (all counted), {opts['engines']} engines: cut vs contiguous = 1 - the slowest engine's "
          "priced rollout (each engine's share replayed with the run file's drafter) / contiguous's. Share of the "
          "placement ceiling (bench/ceilings.py; each request's steps fixed by one replay of the batch): between "
          "lower bound / makespan (the optimum is no faster) and search / makespan (a placement that fast exists); "
          "between = where the search sits from the bound (0) to the placement (1)")
    for r in summary:
        bound = ("" if r["placement"] != "length_aware" else
                 "; the ceiling's bound set by " + "/".join(sorted(set(r["ceiling_set_by_per_draw"]))))
        print(f"  {r['name']}: cut per draw " + ", ".join(f"{c:.1f}%" for c in r["cut_pct_per_draw"])
              + f"; share of the ceiling {100 * r['share_of_ceiling_bound']:.1f}%-"
                f"{100 * r['share_of_ceiling_search']:.1f}% (per draw "
              + ", ".join(f"{100 * a:.0f}-{100 * b:.0f}%" for a, b in zip(
                  r["share_of_ceiling_bound_per_draw"], r["share_of_ceiling_search_per_draw"], strict=True))
              + "; search between " + ", ".join(f"{x:.2f}" for x in r["search_between_bound_and_placement_per_draw"])
              + ")" + bound)


def run(cfg: RunConfig, args: Any) -> list[dict]:
    import ray

    from nemo_rl_specdec.driver.group import budget_route

    opts = _options(cfg)
    priced_summary = _priced_summary(priced_placement(cfg, opts), opts)
    _print_priced(priced_summary, opts)
    if not opts["engines_run"]:
        return priced_summary
    E = opts["engines"]
    spec = cfg.spec
    _say(f"{opts['problems']} problems x {opts['samples']} samples on {E} engines, drafter={spec.drafter} "
         f"k={spec.num_speculative_tokens}, T={opts['temperature']}, max_new_tokens={opts['max_new_tokens']}, "
         f"repeats={opts['repeats']}, placements={opts['placements']}, budgets={opts['budgets']}, "
         f"max_num_seqs regimes={opts['max_num_seqs']}, model={cfg.model_path}")
    per_request = budget_route(spec) == "per_request"
    n_groups = 1 + len({_spec_group(b, per_request) for b in opts["budgets"]})
    if not ray.is_initialized():  # n_groups groups of E single-CPU actors on the same E cores
        ray.init(num_cpus=n_groups * E, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    results: list = []
    bounds: list = []  # (max_num_seqs, simulated reference placement) per regime
    for seqs in opts["max_num_seqs"]:
        runs, draws, warm_n = _measure(with_max_num_seqs(cfg, seqs), opts, per_request, seqs)
        bound = placement_reference(runs, draws, E, seqs)
        bounds.append((seqs, bound))
        results += [{**r, "simulated_placement_reference": bound,
                     **reference_share(runs, draws, _key(r), bound["reference_cut_pct_by_draw"])}
                    for r in _summarize(runs, opts, spec, E, warm_n, seqs)]
    _print(results, opts)
    _print_priced(priced_summary, opts)
    results += priced_summary
    for seqs, b in bounds:
        tag = seqs if seqs is not None else "default"
        print(f"Simulated reference placement @max_num_seqs={tag}: the "
              f"{b['batches']} measured batches replayed with no speculation; cut vs contiguous: length_aware median "
              f"{b['length_aware_cut_pct']['median']:.1f}% (mean {b['length_aware_cut_pct']['mean']:.1f}%), "
              f"reference median {b['reference_cut_pct']['median']:.1f}% "
              f"(mean {b['reference_cut_pct']['mean']:.1f}%); " + (
                  f"length_aware reaches {100 * b['length_aware_share_of_reference']:.0f}% of the reference cut"
                  if b["length_aware_share_of_reference"] is not None else
                  f"no draw has {MIN_REFERENCE_PCT:.0f}% of placement headroom to judge against")
              + f" (problem draws: {len(b['reference_cut_pct_by_draw'])})")
        for r in results:
            if (r["max_num_seqs"] == seqs and r["placement"] != "contiguous"
                    and r.get("share_of_reference_cut") is not None):
                print(f"  measured {r['name']}: {100 * r['share_of_reference_cut']:.0f}% of the reference cut "
                      f"(per draw: {', '.join(f'{100 * x:.0f}%' for x in r['share_of_reference_cut_per_draw'])})")
    return results


def _spec_group(budget: str, per_request: bool) -> str:
    """The speculative group a budget policy runs on. Per-request budgets (list drafters) share one
    group, except adaptive: it is chosen inside the engines, so it is fixed when they start. Model
    drafters get k by batch size at engine start: one group per policy."""
    return "static" if per_request and budget != "adaptive" else budget


def _key(row: dict) -> tuple:
    """A summary row's key in `runs`: (drafter, placement, budget)."""
    return row["drafter"], row["placement"], row["budget"] or "uniform"


def _measure(cfg: RunConfig, opts: dict, per_request: bool, seqs: int | None) -> tuple[dict, dict, int]:
    """Every configuration's rollouts ({(drafter, placement, budget): [result, ...]}), the problem draw
    of each, and the number of warm-up rollouts."""
    from transformers import AutoTokenizer

    from nemo_rl_specdec.demo import task
    from nemo_rl_specdec.driver.group import EngineGroup
    from nemo_rl_specdec.scheduling.predictor import LengthPredictor

    E, T, max_new = opts["engines"], opts["temperature"], opts["max_new_tokens"]
    spec = cfg.spec
    label = f"max_num_seqs={seqs if seqs is not None else 'default'}"
    predictor = LengthPredictor(cold_start="mean", max_len=max_new)
    t0 = time.perf_counter()
    groups: list = []
    runs: dict = {}
    draws: dict = {}

    def record(key: tuple, draw: int, res) -> None:
        runs.setdefault(key, []).append(res)
        draws.setdefault(key, []).append(draw)

    try:
        base = EngineGroup(cfg, E, spec_enabled=False, seed=opts["seed"], predictor=predictor, name="nospec")
        groups.append(base)
        by_group: dict = {}
        spec_groups: dict = {}
        for b in opts["budgets"]:
            g = _spec_group(b, per_request)
            if g not in by_group:
                c = cfg.with_spec(scheduling={**spec.scheduling.model_dump(),
                                              "budget": "uniform" if g == "static" else b})
                by_group[g] = EngineGroup(c, E, seed=opts["seed"], predictor=predictor,
                                          name="spec" if g == "static" else f"spec_{b}_")
                groups.append(by_group[g])
            spec_groups[b] = by_group[g]
        first = groups[1]
        _say(f"{label}: {len(groups)} groups up in {time.perf_counter() - t0:.1f}s (cores {first.cores}), budgets "
             f"via {first.budget_via}" + (f", k by batch {first.derived_k_schedule}" if first.derived_k_schedule
                                          else ""))
        tok = AutoTokenizer.from_pretrained(cfg.model_path)
        warm_n = 0
        for draw in range(opts["draws"]):  # independent problem sets, each with its own warm-up
            problems = task.run_problems(cfg, opts["problems"], seed=opts["problem_seed"] + 1000 * draw)
            reqs = task.run_requests(cfg, tok, problems, opts["samples"])
            if draw == 0:
                for g in groups:  # first-call costs (allocator, JIT) off the clock
                    g.generate(reqs[:E], placement="round_robin", max_new_tokens=8, temperature=T, observe=False)
            # the previous batch of the same problems: it trains the predictor and fills the drafter store
            warm: list = []
            for g in groups:
                warm += g.generate(reqs, placement="contiguous", max_new_tokens=max_new,  # its own budget
                                   temperature=T, observe=True).rollouts
            version = int(first.states()[0]["policy_version"]) + 1
            for g in groups:
                g.update(PolicyUpdate(version, rollouts=warm if g is not base else []))
            lens = sorted(len(r.token_ids) for r in warm)
            warm_n += len(lens)
            _say(f"{label} draw {draw}: warm batches ({len(lens)} rollouts): length p50 {lens[len(lens) // 2]}, "
                 f"p90 {lens[int(0.9 * (len(lens) - 1))]}, max {lens[-1]}; "
                 f"predictor knows {sum(predictor.known(p.problem_id) for p in problems)} problems")

            for rep in range(opts["repeats"]):
                for placement in opts["placements"]:
                    key = ("none", placement, "uniform")
                    record(key, draw, base.generate(reqs, placement=placement, budget="uniform",
                                                    max_new_tokens=max_new, temperature=T, observe=False))
                    for budget in opts["budgets"]:
                        record((spec.drafter, placement, budget), draw,
                               spec_groups[budget].generate(reqs, placement=placement, budget=budget,
                                                            max_new_tokens=max_new, temperature=T, observe=False))
                    _say(f"{label} draw {draw} repeat {rep} {placement}: no-spec {runs[key][-1].makespan_s:.2f}s, "
                         + ", ".join(f"{b} {runs[(spec.drafter, placement, b)][-1].makespan_s:.2f}s"
                                     for b in opts["budgets"]))
    finally:
        for g in reversed(groups):
            g.close()
    return runs, draws, warm_n


def _summarize(runs: dict, opts: dict, spec, engines: int, warm_n: int, seqs: int | None) -> list[dict]:
    from nemo_rl_specdec.cost.price import price

    med = {key: _median([r.makespan_s for r in rs]) for key, rs in runs.items()}
    tag = f"seqs{seqs}" if seqs is not None else "seqs_all"
    out = []
    for (drafter, placement, budget), rs in runs.items():
        gen = sum(r.metrics.generated_tokens for r in rs)
        acc = sum(r.metrics.accepted_tokens for r in rs)
        drafted = sum(r.metrics.draft_tokens for r in rs)
        mk = med[(drafter, placement, budget)]
        ref = med.get((drafter, "contiguous", "uniform"))
        # paired: repeat r of this configuration against repeat r of contiguous (run back to back)
        paired = [100.0 * (1 - a.makespan_s / b.makespan_s)
                  for a, b in zip(rs, runs.get((drafter, "contiguous", "uniform"), []), strict=False)]
        nospec = med.get(("none", placement, "uniform"))
        same_placement_uniform = med.get((drafter, placement, "uniform"))
        # the run whose makespan is the median: its per-engine picture
        mid = sorted(rs, key=lambda r: r.makespan_s)[(len(rs) - 1) // 2]
        eng_tokens = [[len(mid.rollouts[i].token_ids) for i in eng] for eng in mid.assignment]
        actual = [len(r.token_ids) for r in mid.rollouts]
        hist: dict = {}
        for b in (mid.budgets if drafter != "none" else []):
            hist[str(b)] = hist.get(str(b), 0) + 1
        out.append({
            "name": f"{'no_spec' if drafter == 'none' else drafter}/{placement}/"
                    f"{budget if drafter != 'none' else '-'}@{tag}",
            "drafter": drafter, "placement": placement, "budget": budget if drafter != "none" else None,
            "budget_via": mid.budget_via, "engines": engines,
            "max_num_seqs": seqs,
            "makespan_s": mk, "makespan_runs_s": [r.makespan_s for r in rs],
            "makespan_vs_contiguous": (ref / mk) if ref and mk else None,
            "makespan_cut_vs_contiguous_pct": (100.0 * (1 - mk / ref)) if ref and mk else None,
            "makespan_cut_per_repeat_pct": paired,
            "makespan_cut_paired_median_pct": _median(paired) if paired else None,
            "vs_uniform_budget": (same_placement_uniform / mk) if same_placement_uniform and mk else None,
            "nospec_makespan_s": nospec,
            "wall_clock_ratio": (nospec / mk) if nospec and mk else None,
            "tokens_per_target_forward": gen / (gen - acc) if gen > acc else 1.0,
            "acceptance_rate": acc / drafted if drafted else 0.0,
            "generated_tokens_mean": gen / len(rs),
            "engine_finish_s": mid.engine_finish_s, "engine_seconds": mid.engine_seconds,
            "engine_requests": [len(e) for e in mid.assignment],
            "engine_tokens": [sum(t) for t in eng_tokens],
            "engine_longest": [max(t) if t else 0 for t in eng_tokens],
            "predicted_engine_tokens": [sum(mid.predicted_len[i] for i in eng) for eng in mid.assignment],
            "prediction_spearman": _spearman(mid.predicted_len, actual),
            "budget_histogram": hist,
            # the requests that set the makespan: the longest rollouts of the median run
            "tail": [{"index": i, "engine": mid.engine_of[i], "tokens": actual[i],
                      "predicted": round(float(mid.predicted_len[i]), 1), "budget": mid.budgets[i]}
                     for i in sorted(range(len(actual)), key=lambda i: -actual[i])[:4]],
            "repeats": len(rs), "problems": opts["problems"], "samples": opts["samples"],
            "temperature": opts["temperature"], "max_new_tokens": opts["max_new_tokens"],
            "warm_rollouts": warm_n, "k": spec.num_speculative_tokens,
            # the engines' own steps, priced: the slowest engine's priced rollout, median over repeats
            "priced_makespan_s": _median([max(price(t, opts["profile"]).rollout_s for t in r.traces if t is not None)
                                          for r in rs]),
            "traces": [None if t is None else t.to_dict() for t in mid.traces],
            "per_step": [],
        })
    order = {p: i for i, p in enumerate(PLACEMENTS)}
    border = {b: i for i, b in enumerate(BUDGETS)}
    out.sort(key=lambda r: (r["drafter"] != "none", order[r["placement"]], border.get(r["budget"] or "uniform", 0)))
    return out


def placement_reference(runs: dict, draws: dict, engines: int, max_num_seqs: int | None) -> dict:
    """What the reference placement gives on the batches this regime actually produced.

    Every measured rollout batch (all configurations and repeats: fresh T > 0 samples of the
    same problems) is replayed in the engine simulator (`sim.engine_sim`, no speculation,
    `max_num_seqs` slots, the group's default cost model) under three placements: contiguous,
    length_aware on the frozen predictions the bench used, and reference — length_aware on
    the lengths each batch really had. The gap between the last two is what better predictions
    give the same heuristic; the reference is not a bound (a placement can beat it: the ceiling
    is `bench/ceilings.py`'s, in `priced_placement`). Per problem draw: the mean reference cut
    (what `reference_share` judges measured cuts against) and length_aware's share of it."""
    import numpy as np

    from nemo_rl_specdec.cost.model import CostModel
    from nemo_rl_specdec.driver.group import DEFAULT_COST_MODEL
    from nemo_rl_specdec.scheduling.placement import Request as Placed, place
    from nemo_rl_specdec.sim.engine_sim import EngineSim, SimRequest

    cost = CostModel(DEFAULT_COST_MODEL["c_base"], DEFAULT_COST_MODEL["c_tok"])
    slots = max_num_seqs or 256  # vLLM's CPU default

    def makespan(assignment: list, lengths: list, prompt_lens: list) -> float:
        done = []
        for j, eng in enumerate(assignment):
            if not eng:
                continue
            sim = EngineSim(j, cost, None, slots, remaining=lambda r, g: max(0.0, r.length - g))
            sim.add([SimRequest(i, 0, "", max(1, lengths[i]), prompt_lens[i], np.ones(1)) for i in eng], 0.0)
            done.append(sim.run_until_done(0))
        return max(done)

    cuts: dict = {"length_aware": [], "reference": []}
    by_draw: dict = {}
    for key, rs in runs.items():
        for r, draw in zip(rs, draws[key], strict=True):
            lengths = [len(ro.token_ids) for ro in r.rollouts]
            prompts = [len(ro.prompt_token_ids) for ro in r.rollouts]
            pids = [ro.problem_id for ro in r.rollouts]
            predicted = [Placed(i, pids[i], float(r.predicted_len[i])) for i in range(len(lengths))]
            actual = [Placed(i, pids[i], float(lengths[i])) for i in range(len(lengths))]
            ref = makespan(place(predicted, engines, "contiguous"), lengths, prompts)
            cuts["length_aware"].append(100.0 * (1 - makespan(place(predicted, engines, "length_aware"),
                                                              lengths, prompts) / ref))
            cuts["reference"].append(100.0 * (1 - makespan(place(actual, engines, "length_aware"),
                                                             lengths, prompts) / ref))
            by_draw.setdefault(draw, []).append((cuts["length_aware"][-1], cuts["reference"][-1]))
    clair = {d: float(statistics.fmean(c for _, c in v)) for d, v in sorted(by_draw.items())}
    shares = [statistics.fmean(a for a, _ in v) / clair[d] for d, v in by_draw.items() if clair[d] >= MIN_REFERENCE_PCT]
    return {
        "reference_cut_pct_by_draw": clair,
        "length_aware_share_of_reference": float(statistics.fmean(shares)) if shares else None,
        "batches": len(cuts["reference"]),
        "length_aware_cut_pct": {"median": _median(cuts["length_aware"]),
                                 "mean": float(statistics.fmean(cuts["length_aware"]))},
        "reference_cut_pct": {"median": _median(cuts["reference"]),
                                "mean": float(statistics.fmean(cuts["reference"]))},
    }


# a draw whose reference cut is smaller than this has too little headroom to judge a share of it against: a
# share of it would divide the measurement's noise by nearly nothing
MIN_REFERENCE_PCT = 2.0


def reference_share(runs: dict, draws: dict, key: tuple, reference_by_draw: dict) -> dict:
    """A configuration's measured makespan cut against contiguous (its own drafter and budget, paired
    repeat by repeat), as a share of the reference cut simulated on the same draw's batches; the
    mean over the problem draws whose ceiling is at least MIN_REFERENCE_PCT. None for contiguous
    itself or where no draw has that headroom."""
    drafter, placement, budget = key
    ref = (drafter, "contiguous", budget)
    if placement == "contiguous" or ref not in runs:
        return {"share_of_reference_cut": None, "share_of_reference_cut_per_draw": []}
    per_draw: dict = {}
    for a, b, d in zip(runs[key], runs[ref], draws[key], strict=False):
        per_draw.setdefault(d, []).append(100.0 * (1 - a.makespan_s / b.makespan_s))
    shares = [_median(cuts) / reference_by_draw[d] for d, cuts in sorted(per_draw.items())
              if reference_by_draw.get(d, 0) >= MIN_REFERENCE_PCT]
    return {"share_of_reference_cut": float(statistics.fmean(shares)) if shares else None,
            "share_of_reference_cut_per_draw": shares}


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, list):
        return "/".join(f"{x:.2f}" if isinstance(x, float) else str(x) for x in v)
    return str(v)


def _print(results: list, opts: dict) -> None:
    """A plain fixed-width table (fits a log line; rich would wrap it in a narrow terminal)."""
    cols = [("config", "name"), ("makespan_s", "makespan_s"), ("vs_contig", "makespan_vs_contiguous"),
            ("cut_%", "makespan_cut_vs_contiguous_pct"), ("paired_cut_%", "makespan_cut_paired_median_pct"),
            ("vs_uniform", "vs_uniform_budget"),
            ("vs_nospec", "wall_clock_ratio"), ("tok/fwd", "tokens_per_target_forward"),
            ("accept", "acceptance_rate"), ("engine_finish_s", "engine_finish_s"),
            ("engine_tokens", "engine_tokens"), ("engine_longest", "engine_longest")]
    table = [[h for h, _ in cols]] + [[_fmt(r.get(k)) for _, k in cols] for r in results]
    widths = [max(len(row[c]) for row in table) for c in range(len(cols))]
    print(f"Scheduling suite: {opts['problems']} problems x {opts['samples']} samples, {results[0]['engines']} "
          f"engines, T={opts['temperature']}, median of {opts['repeats']} runs. vs_contig = this group's contiguous "
          "(uniform) makespan / this; paired_cut = median over repeats of 1 - this / contiguous of the same repeat; "
          "vs_uniform = same placement, uniform budget / this; vs_nospec = no-spec "
          "makespan, same placement / this; @seqsN = at most N requests decoded at once per engine")
    for n, row in enumerate(table):
        print("  ".join(x.ljust(w) for x, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))
