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
host speed. The loop's drafter must be a history drafter (`replayable`): a model drafter's drafts
on the loop's text would need every step's policy and drafter weights.

Model drafters on one text (`bench --suite drafters`, `replay_row`), teacher-forced: the policy that
wrote the text runs once over each recorded rollout, and the drafter's **greedy** k-token draft at
every position is made from it as vLLM's proposer makes it (`drafters/roles.py` `TeacherForced`, in each drafter's file:
`draft_model.greedy_drafts`, `eagle3.greedy_drafts`, `dflash.greedy_drafts`); the replay verifies those
drafts against the recorded tokens like any other. At T > 0 the engines draw their model drafts by
sampling (`draft_sample_method: probabilistic`), so the engines' acceptance differs from these greedy
drafts'. Priced as every row is: the target forwards from the trace, the draft forwards from the
profile's entry for the drafter (k sequential forwards, or one block forward, per step); a hybrid's
host term is its proposer's thread time measured in the replay (the model part's drafts are read
from the teacher-forced table where vLLM would run it: `bench/replay.py` `BesideReplay`), its draft
forwards the ones each step ran. A drafter with no teacher-forced mirror (mtp) is no row:
`one_text_why` says why.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from nemo_rl_specdec.drafters.roles import TeacherForced

OURS = "ours"   # the run file's drafter among the rows


def replayable(spec) -> str | None:
    """None when `spec`'s drafter drafts from the text alone (a history drafter), so that it can be replayed on
    any recorded text (the loop's, whose policy moves every step), else why not."""
    from nemo_rl_specdec.config.run import cost_entry

    kind, _ = cost_entry(spec)
    if kind == "list":
        return None
    return (f"drafter {spec.drafter!r} drafts with a model ({kind}): its drafts on the loop's text would need each "
            "step's policy and drafter run teacher-forced; bench --suite drafters compares it on one text")


def one_text_why(spec) -> str | None:
    """None when `spec`'s drafter has a one-text row (`replay_row`: a history drafter, or a model drafter
    teacher-forced, `TeacherForced`: a hybrid's model part), else why not."""
    from nemo_rl_specdec.drafters.registry import playing, resolve

    if replayable(spec) is None or playing(spec, TeacherForced) is not None:
        return None
    part = resolve(spec).as_role(TeacherForced).name  # the drafter, or a hybrid's model part
    return f"drafter {part!r} has no teacher-forced mirror here (its drafts on a recorded text need its model run)"


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


def teacher_forced_drafts(spec, batches: Sequence[Sequence[Any]], policy) -> Callable[[Any], list]:
    """The model drafts of `spec`'s drafter (or of a hybrid's model part) on `batches`, teacher-forced on
    `policy` (`TeacherForced`), as `bench/replay.py` asks a drafter for a replayed batch: drafts(batch) ->
    per row, the k-token greedy draft at that request's position (k = num_speculative_tokens)."""
    import numpy as np

    from nemo_rl_specdec.bench.replay import _field
    from nemo_rl_specdec.drafters.registry import drafter

    k = spec.num_speculative_tokens
    make = drafter(spec, TeacherForced).teacher_forced(spec, policy)
    tables, plen = {}, {}
    for v, rollouts in enumerate(batches):
        for i, r in enumerate(rollouts):
            prompt, tokens = list(_field(r, "prompt_token_ids")), list(_field(r, "token_ids"))
            plen[(v, i)] = len(prompt)
            # a response of one token has no decode step: nothing is drafted for it
            tables[(v, i)] = make(prompt + tokens, len(prompt) + 1, k) if len(tokens) >= 2 else \
                np.zeros((0, k), dtype=np.int64)

    def drafts(batch) -> list:
        out = []
        for i, rid in enumerate(batch.req_ids):
            _, v, j = rid.rsplit("-", 2)   # `replay` names request j of batch v "replay-v-j"
            key = (int(v), int(j))
            out.append([int(x) for x in tables[key][int(batch.num_tokens_no_spec[i]) - plen[key] - 1]])
        return out

    return drafts


def load_policy(cfg):
    """The run file's policy as an HF causal LM in float32 (the engines' precision on CPU), for teacher forcing."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(cfg.model_path), dtype=torch.float32).eval()


def replay_row(name: str, spec, batches: Sequence[Sequence[Any]], cfg, profile, measure_from: int = 0,
               policy=None) -> dict:
    """One row's replay over `batches` (its state carried from batch to batch, as an engine's across RL
    steps), measured and priced on `batches[measure_from:]`, the batches before it only feeding its
    history. A model drafter's drafts are teacher-forced on `policy` (default: the run file's, `load_policy`),
    which must be the policy that wrote `batches` (module doc)."""
    from nemo_rl_specdec.bench.replay import BesideReplay, ReplayDrafter, replay
    from nemo_rl_specdec.config.run import cost_entry, cost_parts, to_vllm_speculative_config
    from nemo_rl_specdec.cost.price import PricedHybridCost, PricedStepCost
    from nemo_rl_specdec.cost.trace import HYBRID

    why = one_text_why(spec)
    if why is not None:
        raise ValueError(f"one-text row {name!r}: {why}")
    g = cfg.generation
    kind, key = cost_entry(spec)
    k = spec.num_speculative_tokens
    mml = g.vllm_cfg.max_model_len
    teacher_s = None
    if kind == "list":
        ours = (to_vllm_speculative_config(spec, g.temperature) or {}).get("method") == "custom_class"
        cost = PricedStepCost(profile, key, k) if ours else None
        out = replay(spec, batches, mml, g.temperature, step_cost=cost, label=key)
    else:
        t0 = time.perf_counter()
        drafts = teacher_forced_drafts(spec, batches, load_policy(cfg) if policy is None else policy)
        teacher_s = time.perf_counter() - t0
        if kind == HYBRID:   # the engine's proposer beside the model part, its drafts read from the table
            parts = cost_parts(spec)
            cost = PricedHybridCost(profile, parts["history"], parts["model"], k)
            beside = BesideReplay(spec, mml, drafts, cost=cost, temperature=g.temperature)
            drafter, label = beside.drafter(HYBRID, parts), spec.drafter
        else:   # vLLM's model method: every step drafts k tokens for every request
            drafter, label = ReplayDrafter(lambda batch, sampled, requests: drafts(batch),
                                           lambda rollouts, version: None, kind), key
        out = replay(spec, batches, mml, g.temperature, drafter=drafter, label=label)
    out = out[measure_from:]
    traces = [r["trace"] for r in out]
    gen = sum(r["generated_tokens"] for r in out)
    fwd = sum(r["target_forwards"] for r in out)
    dt = sum(r["draft_tokens"] for r in out)
    accepted = [a for t in traces for s in t.steps for d, a in zip(s.drafts, s.accepted, strict=True) if d]
    return {"name": name, "drafter": spec.drafter, "k": k, "profile_entry": key, "kind": kind,
            "draft_source": "greedy, teacher-forced" if kind != "list" else "the proposer's",
            "teacher_forced_s": teacher_s,
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
        from nemo_rl_specdec.config.run import ConfigError, cost_entry
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


__all__ = ["OURS", "LoopPricer", "compare", "load_policy", "one_text_why", "priced",
           "replay_row", "replayable", "rows", "speedup_at", "teacher_forced_drafts", "verdict"]
