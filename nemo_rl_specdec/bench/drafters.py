"""Bench suite `drafters`: every CPU drafter on the bundled workload, judged on one text.

    nemo-rl-specdec bench configs/tiny_cpu.yaml --suite drafters --json runs/tiny_cpu/drafters.json

Two measurements per row, from one process, the same prompts and weights for every row:

- **One text, priced (the verdict).** A no-spec engine rolls out the batch twice: the first
  rollout is the "previous step" the history drafters learn from (as in RL, where problems recur
  every epoch), the second is the text every row drafts over (`bench/onetext.py`: each history
  drafter replayed over it, every draft verified against the recorded tokens, priced on
  `bench.drafters.hardware` with the proposer's host time measured in the replay, against the same
  text without drafts). The model drafters draft over the same text teacher-forced: the policy
  that wrote it runs over each rollout and the drafter's greedy k-token draft at every position is
  verified against the recorded tokens (`bench/onetext.py` `TeacherForced`; at T > 0 their
  engines sample their drafts instead), priced with the profile's draft forwards for them (a
  hybrid: its proposer's host time measured in the replay too). DAS (`OURS`) is judged against
  the best of vLLM's built-ins (`bench/builtins.py`) by priced rollout time at each host speed
  (``vs_best_builtin``). A drafter with no teacher-forced mirror gets no one-text figure.
- **Engines, on this machine.** Each row's engine runs against the no-spec engine in ABBA order
  (baseline, spec, spec, baseline) `bench.drafters.repeats` times: the drafter runs for real
  (lossless sampling is `tests/engine/test_lossless.py`'s), and the wall-clock ratio is the median
  of the rounds' ratios with its spread. At T > 0 each engine samples its own text, so these
  figures are this machine's and are not compared between rows; each engine's steps priced
  (``engine_priced_throughput_ratio``, its own text against the no-spec engine's) stay in the JSON.
  The suffix drafters' engines first see the previous step's rollouts too: DAS via its lockstep
  rebuild update, vLLM's suffix via its own cache.

vLLM's and torch's own output goes to a log beside the JSON (``drafters.log``); the table fits a
100-column terminal, and the acceptance per draft position is in the JSON.

Run-file knobs (optional): `bench.drafters.repeats` (default 3), `bench.drafters.hardware`
(default h100_qwen3_8b). A model drafter is priced at the profile's shape for it.
"""
from __future__ import annotations

import functools
import operator
import statistics
import time

from nemo_rl_specdec.bench import say
from nemo_rl_specdec.bench.builtins import changes as builtin_changes, verdict_lines
from nemo_rl_specdec.drafters.base import MODEL
from nemo_rl_specdec.drafters.registry import drafter as drafter_of, registered
from nemo_rl_specdec.drafters.roles import Declared, PricedDrafter, Refreshable, VllmMapping
from nemo_rl_specdec.update import PolicyUpdate

BLOCK = "policy.generation.speculative_decoding"
_say = functools.partial(say, "drafters")
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
    elif drafter_of(spec, VllmMapping).caches_own_requests:
        eng.generate(reqs)  # vLLM's suffix cache learns from its own finished requests
    else:
        eng.generate(reqs[: len(reqs) // 4])


def _options(cfg) -> dict:
    from nemo_rl_specdec.bench import MAX_REPEATS, hardware_option, option, suite_options
    from nemo_rl_specdec.config.run import ConfigError

    b = suite_options(cfg, "drafters", known=("repeats", "hardware"))
    if not cfg.spec.enabled:   # the registry's rows would run without speculation beside vLLM's built-ins with it
        raise ConfigError(f"{BLOCK}.enabled: got false; the drafters suite compares every drafter with speculation "
                          "on, on one text, so allowed: true")
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
    from pathlib import Path

    from nemo_rl_specdec.demo.console import engine_output

    _options(cfg)   # a bad option fails before anything is written
    log = Path(args.json).with_suffix(".log") if getattr(args, "json", None) else \
        Path("runs") / str(cfg.raw.get("name", "run")) / "drafters.log"
    log.unlink(missing_ok=True)
    with engine_output(log):
        results, profile, repeats = measure(cfg, args)
    report(results, profile, repeats, log)
    return results


def measure(cfg, args) -> tuple[list, object, int]:
    """Every row's engine A/B and one-text replay (module doc); (results, profile, repeats)."""
    from nemo_rl_specdec.bench.onetext import load_policy, one_text_why, replay_row, replayable
    from nemo_rl_specdec.config.run import cost_entry, load_run_config
    from nemo_rl_specdec.driver.engine import Engine

    grpo = cfg.raw.get("grpo", {})
    n_prob = int(grpo.get("num_prompts_per_step", 16))
    n_samp = int(grpo.get("num_generations_per_prompt", 4))
    opts = _options(cfg)
    repeats, profile = opts["repeats"], opts["profile"]

    rows = {name: load_run_config(cfg.source, list(args.overrides) + ov) for name, ov in cpu_drafters(cfg.spec).items()}
    # vLLM's built-ins as they come (bench/builtins.py), beside the registry's rows at the run file's k
    rows.update({label: cfg.with_spec(enabled=True, **builtin_changes(b, cfg)) for label, b in DEFAULT_ROWS.items()})
    for dcfg in rows.values():   # a profile that cannot price a row fails before any engine
        profile.drafter(cost_entry(dcfg.spec)[1])
    base = Engine(cfg, spec_enabled=False, name="no-spec")
    reqs = workload(cfg, base.tokenizer(), n_prob, n_samp, seed=int(grpo.get("seed", 0)))
    history = base.generate(reqs).rollouts  # the "previous step" for history-based drafters; also the warm-up
    text = base.generate(reqs).rollouts     # the one text every row drafts over
    _say(f"text: {sum(len(r.token_ids) for r in text)} tokens in {len(text)} rollouts; engines: {len(rows)} rows")
    results = []
    policy = None   # the policy that wrote the text, for the model drafters' teacher-forced drafts
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
        row = {
            "name": name, "drafter": dcfg.spec.drafter, "k": dcfg.spec.num_speculative_tokens,
            # the engine's figures: its own text, this machine's clock
            "tokens_per_target_forward": m.acceptance_length, "acceptance_rate": m.acceptance_rate,
            "accepted_per_position": [round(x, 3) for x in m.accepted_per_position],
            "tokens_per_s": m.generated_tokens / ts, "baseline_tokens_per_s": mb.generated_tokens / tb,
            # same prompts and weights; at T>0 the sampled lengths differ, so also the throughput ratio
            "wall_clock_ratio": statistics.median(ratios), "wall_clock_ratios": ratios,
            "wall_clock_spread": f"{min(ratios):.2f}-{max(ratios):.2f}",
            "hardware": profile.name, "engine_priced_throughput_ratio": priced_ratio(profile, spec_t, base_t),
            "trace": spec_t[0].to_dict(), "baseline_trace": base_t[0].to_dict(),
            "throughput_ratio": (m.generated_tokens / ts) / (mb.generated_tokens / tb),
            "accepted_per_draft_step": m.accepted_per_draft_step,
            "lengths": lengths,
            "drafts": m.drafts, "per_step": [],
        }
        why = one_text_why(dcfg.spec)
        if why is None:   # the verdict's figures: this row's drafter over the one text
            if policy is None and replayable(dcfg.spec) is not None:   # a model drafter
                policy = load_policy(cfg)
            one = replay_row(name, dcfg.spec, [history, text], dcfg, profile, measure_from=1, policy=policy)
            row.update({"one_text_drafts": one["draft_source"], "teacher_forced_s": one["teacher_forced_s"],
                        "one_text_tokens_per_target_forward": one["tokens_per_target_forward"],
                        "one_text_acceptance_rate": one["acceptance_rate"],
                        "one_text_accepted_per_position": [round(x, 3) for x in one["accepted_per_position"]],
                        "priced_speedup": one["priced"]["by_host_speed"][0]["speedup"],
                        "priced_by_host_speed": one["priced"]["by_host_speed"],
                        "priced_baseline_s": one["priced"]["baseline_s"],
                        "priced_measured_host_s": one["priced"]["measured_host_s"],
                        "one_text_trace": one["traces"][0].to_dict()})
        else:
            row["one_text_unavailable"] = why
        results.append(row)
        _say(f"{name}: engine {m.acceptance_length:.2f} tok/fwd, wall {row['wall_clock_ratio']:.2f}x"
             + (f"; one text {row['one_text_tokens_per_target_forward']:.2f} tok/fwd, priced "
                f"{row['priced_speedup']:.2f}x" if why is None else ""))
    base.close()
    judge(results)
    return results, profile, repeats


def report(results: list, profile, repeats: int, log) -> None:
    """The table (one text, priced; then this machine's engines) and the verdict, fitting the terminal."""
    from rich.table import Table

    from nemo_rl_specdec.demo.console import show, table_box

    lines: list = []

    def f(x, fmt: str = "{:.2f}") -> str:
        return "-" if x is None else fmt.format(x)

    hosts = [b["host_speed"] for b in next((r["priced_by_host_speed"] for r in results if "priced_by_host_speed" in r),
                                           [])]
    t = Table(box=table_box(), title=f"Drafters on one text, priced on {profile.name}", title_justify="left")
    heads = ["drafter", "k", "tok/fwd", *[f"priced\n{h:g}x" for h in hosts], "CPU\ntok/fwd", "CPU\nwall", "spread"]
    cells = []
    for r in results:
        priced = [f(b["speedup"], "{:.3f}") for b in r["priced_by_host_speed"]] if "priced_by_host_speed" in r \
            else ["-"] * len(hosts)
        cells.append([r["name"], str(r["k"]), f(r.get("one_text_tokens_per_target_forward")), *priced,
                      f(r["tokens_per_target_forward"]), f(r["wall_clock_ratio"]), r["wall_clock_spread"]])
    for i, c in enumerate(heads):   # no cell is cut or wrapped: a column is as wide as its widest cell or header line
        wide = max([len(x) for x in c.split("\n")] + [len(row[i]) for row in cells])
        t.add_column(c, justify="left" if i == 0 else "right", no_wrap=True, min_width=wide)
    for row in cells:
        t.add_row(*row)
    lines.append(t)
    lines.append(f"tok/fwd, priced: each drafter over one recorded text (the no-spec engine's), every draft checked "
                 f"against it; rollout speedup priced on {profile.name} ({profile.hardware.name}) with the proposer's "
                 "host time measured here (1x) and on a host twice as fast (2x), over the same text without drafts.")
    lines.append(f"CPU tok/fwd, CPU wall: each drafter's own engine on this machine (its own text at T > 0; wall: "
                 f"no-spec s / spec s, median of {repeats} ABBA rounds, with their spread), not compared between rows.")
    forced = [r["name"] for r in results if r.get("one_text_drafts") == "greedy, teacher-forced"]
    if forced:
        lines.append(f"{', '.join(forced)}: greedy drafts from the policy's and drafter's forwards over the same "
                     "text (teacher-forced; their engines sample drafts at T > 0), priced with the profile's draft "
                     "forwards.")
    missing = [r["name"] for r in results if "one_text_unavailable" in r]
    if missing:
        lines.append(f"no one-text figure (no teacher-forced mirror of their drafts): {', '.join(missing)}")
    ks = {BUILTIN_ROWS[r["name"]]: r["k"] for r in results if r["name"] in BUILTIN_ROWS}
    v = next((r["vs_best_builtin"] for r in results if r["name"] == OURS and "vs_best_builtin" in r), None)
    for line in verdict_lines(v or [], "one text", ks):
        lines.append(line)
    lines.append(f"per-position acceptance: in the JSON; vLLM's and torch's output: {log}")
    show(*lines)


def judge(results: list) -> list[dict]:
    """DAS (`OURS`) against the best of vLLM's built-ins (`BUILTIN_ROWS`) by priced rollout time on the one
    text, at each host speed; DAS's result row gains it as ``vs_best_builtin`` where the rows are there."""
    from nemo_rl_specdec.bench.builtins import verdict

    by = {r["name"]: r for r in results if "priced_by_host_speed" in r}
    if OURS not in by or not set(by) & set(BUILTIN_ROWS):
        return []
    figures: dict = {}
    for name, r in by.items():
        if name == OURS or name in BUILTIN_ROWS:
            for b in r["priced_by_host_speed"]:
                figures.setdefault(b["host_speed"], {})[BUILTIN_ROWS.get(name, name)] = b["rollout_s"]
    v = verdict(figures, OURS)
    by[OURS]["vs_best_builtin"] = v
    return v
