"""Drafters compared on one text, priced: the verdicts of `bench --suite drafters` and of the demo's loop.

At T > 0 every engine samples its own text, so engines compare drafters on different texts. Here
every row drafts over the same recorded text (`bench/replay.py`: our proposers and vLLM's own, fed
as vLLM's model runner feeds them, every draft verified against the recorded tokens), and every
row's trace is priced by the one cost function on a hardware profile (`priced`): the target and
draft forwards from the profile, which the text determines, and the proposer's host time as
measured in this run (its thread time per step in the replay), at each of `HOST_SPEEDS` (this
machine, and a host twice as fast). The baseline is the same text without drafts
(`Trace.without_drafts`). Our proposers keep their per-step rules (`auto_disable`,
`scheduling.budget: adaptive`), deciding on the profile's step cost (`PricedStepCost`), as they
would on that GPU.

Rows: the run file's drafter (`OURS`) and vLLM's built-ins (`bench/builtins.py`: suffix and n-gram
at the run file's k and at vLLM's own defaults); a verdict is ours against the best of them at each
host speed. A drafter whose drafts need its model (draft_model, eagle3, dflash, mtp, hybrid) is no
row here: `replayable` says why.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

OURS = "ours"   # the run file's drafter among the rows


def replayable(spec) -> str | None:
    """None when `spec`'s drafter can be replayed on a recorded text (a history drafter), else why not."""
    from nemo_rl_specdec.config import cost_entry

    kind, _ = cost_entry(spec)
    if kind == "list":
        return None
    return (f"drafter {spec.drafter!r} drafts with a model ({kind}): its drafts on a recorded text need that model "
            "run teacher-forced, which this comparison does not do")


def priced(traces: Sequence, profile) -> dict:
    """`traces` (replay traces of one drafter) priced on `profile` against the same texts without drafts
    (`cost/price.py` `price`, the host term the proposer's thread time measured in the replay, divided by
    each host speed)."""
    from nemo_rl_specdec.cost.price import HOST_SPEEDS, price

    base = sum(price(t.without_drafts(), profile).rollout_s for t in traces)
    at = {h: [price(t, profile, host_speed=h, host="measured") for t in traces] for h in HOST_SPEEDS}
    one = at[1.0]
    return {"hardware": profile.name, "baseline_s": base, "forwards_s": sum(p.target_s + p.draft_s for p in one),
            "measured_host_s": sum(p.proposer_s for p in one),
            "by_host_speed": [{"host_speed": h, "rollout_s": sum(p.rollout_s for p in ps),
                               "speedup": base / sum(p.rollout_s for p in ps)} for h, ps in at.items()]}


def speedup_at(p: dict, host_speed: float = 1.0) -> float | None:
    """The priced speedup of `priced`'s result at `host_speed`."""
    return next(b["speedup"] for b in p["by_host_speed"] if b["host_speed"] == host_speed)


def rows(cfg) -> dict:
    """Row name -> speculative block: the run file's drafter (`OURS`) and vLLM's built-ins."""
    from nemo_rl_specdec.bench.builtins import BUILTINS, changes

    return {OURS: cfg.spec, **{b: cfg.with_spec(enabled=True, **changes(b, cfg)).spec for b in BUILTINS}}


def replay_row(name: str, spec, batches: Sequence[Sequence[Any]], cfg, profile, measure_from: int = 0) -> dict:
    """One row's replay over `batches` (its state carried from batch to batch, as an engine's across RL
    steps), measured and priced on `batches[measure_from:]`, the batches before it only feeding its
    history."""
    from nemo_rl_specdec.bench.replay import replay
    from nemo_rl_specdec.config import cost_entry, to_vllm_speculative_config
    from nemo_rl_specdec.cost.price import PricedStepCost

    why = replayable(spec)
    if why is not None:
        raise ValueError(f"one-text row {name!r}: {why}")
    g = cfg.generation
    key = cost_entry(spec)[1]
    ours = (to_vllm_speculative_config(spec, g.temperature) or {}).get("method") == "custom_class"

    cost = PricedStepCost(profile, key, spec.num_speculative_tokens) if ours else None
    out = replay(spec, batches, g.vllm_cfg.max_model_len, g.temperature, step_cost=cost, label=key)[measure_from:]
    traces = [r["trace"] for r in out]
    gen = sum(r["generated_tokens"] for r in out)
    fwd = sum(r["target_forwards"] for r in out)
    dt = sum(r["draft_tokens"] for r in out)
    accepted = [a for t in traces for s in t.steps for d, a in zip(s.drafts, s.accepted, strict=True) if d]
    k = spec.num_speculative_tokens
    return {"name": name, "drafter": spec.drafter, "k": k, "profile_entry": key,
            "tokens_per_target_forward": gen / fwd if fwd else None,
            "acceptance_rate": sum(r["accepted_draft_tokens"] for r in out) / dt if dt else 0.0,
            "accepted_per_position": [sum(1 for a in accepted if a > j) / len(accepted) for j in range(k)]
            if accepted else [],
            "priced": priced(traces, profile),
            "per_batch": [{"tokens_per_target_forward": r["tokens_per_target_forward"],
                           "priced": priced([r["trace"]], profile)} for r in out],
            "traces": traces}


def verdict(results: dict, ours: str = OURS) -> list[dict]:
    """`ours` against the best of vLLM's built-ins among `results` (row name -> `replay_row`), by priced
    rollout time at each host speed (`bench/builtins.py` `verdict`; > 1: ours is faster)."""
    from nemo_rl_specdec.bench.builtins import verdict as builtin_verdict

    figures: dict = {}
    for name, r in results.items():
        for b in r["priced"]["by_host_speed"]:
            figures.setdefault(b["host_speed"], {})[name] = b["rollout_s"]
    return builtin_verdict(figures, ours)


def compare(cfg, batches: Sequence[Sequence[Any]], profile, measure_from: int = 0, say=None) -> dict:
    """Every row of `rows(cfg)` replayed over `batches` (`replay_row`) and ours against the best built-in;
    {"rows": {name: row}, "verdict": [...]}, or {"unavailable": why} when the run file's drafter cannot be
    replayed."""
    why = replayable(cfg.spec)
    if why is not None:
        return {"unavailable": why}
    out = {}
    for name, spec in rows(cfg).items():
        out[name] = replay_row(name, spec, batches, cfg, profile, measure_from)
        if say is not None:
            say(f"one text: {name}: {out[name]['tokens_per_target_forward']:.2f} tok/fwd, priced "
                f"{speedup_at(out[name]['priced']):.2f}x")
    return {"rows": out, "verdict": verdict(out)}


class LoopPricer:
    """The demo's loop priced (`demo/run.py` takes it from the command line): the run file's drafter and
    vLLM's built-ins replayed over the speculative engine's rollouts of every step (the text the policy
    trained on), each carrying its state across the steps as in the loop (DAS rebuilt after each step
    from that step's rollouts, as the engine's lockstep update rebuilds it), priced on the demo's
    hardware profile (`demo.hardware`). Per step, ours against no speculation; over the run, ours
    against no speculation and against the best built-in."""

    def check(self, cfg) -> None:
        """Before any engine: the profile prices every row (else a ConfigError naming `demo.hardware`)."""
        from nemo_rl_specdec.config import ConfigError, cost_entry
        from nemo_rl_specdec.demo.run import hardware_profile

        profile = hardware_profile(cfg)
        if replayable(cfg.spec) is not None:
            return
        for name, spec in rows(cfg).items():
            try:
                profile.drafter(cost_entry(spec)[1])
            except ConfigError as e:
                raise ConfigError(f"demo.hardware: {profile.name} cannot price the row {name!r}, which the demo "
                                  f"compares on the loop's text: {e}") from None

    def __call__(self, cfg, texts: Sequence[Sequence[Any]]) -> dict:
        from nemo_rl_specdec.demo.run import hardware_profile

        profile = hardware_profile(cfg)
        res = compare(cfg, texts, profile)
        if "unavailable" in res:
            return {"hardware": profile.name, "unavailable": res["unavailable"]}
        ours = res["rows"][OURS]
        return {"hardware": profile.name, "gpu": profile.hardware.name, "drafter": cfg.spec.drafter,
                "tokens_per_target_forward": ours["tokens_per_target_forward"],
                "baseline_s": ours["priced"]["baseline_s"], "measured_host_s": ours["priced"]["measured_host_s"],
                "by_host_speed": ours["priced"]["by_host_speed"],
                "per_step": [b["priced"]["by_host_speed"] for b in ours["per_batch"]],
                "builtins": {n: {"k": r["k"], "tokens_per_target_forward": r["tokens_per_target_forward"],
                                 "by_host_speed": r["priced"]["by_host_speed"]}
                             for n, r in res["rows"].items() if n != OURS},
                "vs_best_builtin": res["verdict"]}


__all__ = ["OURS", "LoopPricer", "compare", "priced", "replay_row", "replayable", "rows", "speedup_at",
           "verdict"]
