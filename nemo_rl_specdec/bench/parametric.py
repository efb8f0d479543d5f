"""Bench suite `parametric`: parametric drafters, frozen vs trained online, over GRPO updates.

    nemo-rl-specdec bench configs/tiny_cpu.yaml --suite parametric --json OUT.json [key=value ...]

One run, all engines in this process, interleaved step by step so every configuration sees the
same prompts, the same policy weights and the same machine load:

1. a fixed pool of ``grpo.num_prompts_per_step`` problems, ``grpo.num_generations_per_prompt``
   samples each, revisited every step (engines seeded alike);
2. at step t every engine rolls out the batch with policy version t: the no-spec baseline, and
   per parametric drafter a ``frozen`` engine and (where an online trainer exists) an ``online``
   engine;
3. a real GRPO update (:mod:`nemo_rl_specdec.demo.grpo`) on the baseline's rollouts gives
   version t+1;
4. every ``refresh.every_n_steps`` the online drafter is distilled (:mod:`nemo_rl_specdec.train.distill`)
   on the rollouts it served at step t against the NEW policy, and pushed in the same lockstep
   update as the policy (drafter_version = t+1); frozen engines get the policy only.

Figures per configuration and step: tokens per target forward, acceptance rate, wall-clock
ratio (baseline seconds / this engine's seconds on the same step); for online engines the
distillation cost (seconds, and as % of the GRPO step and of the engine's rollout time).

MTP heads live inside an MTP policy, so ``mtp`` runs as a second group in the same command: its
own no-spec baseline and GRPO trainer on ``bench.parametric.mtp_model`` (default: the run file's
policy if it has MTP layers, else the bundled ``tiny_mtp`` when the run file uses the bundled tiny
policy), same problems, same steps; within a group every engine sees the same batches.

Run-file knobs (optional, under ``bench.parametric``): ``steps`` (default
max(10, ``grpo.max_num_steps``), at least 10), ``drafters`` (default: every parametric drafter
with a checkpoint for this policy: ``draft_model``, ``eagle3``, ``mtp``), ``k`` (default 4),
``mtp_k`` (default 1: MiMo's MTP layer predicts one token), ``mtp_model``,
``lr`` (GRPO, default ``grpo.learning_rate``), ``distill_lr`` (1e-3), ``distill_epochs`` (2),
``problem_seed``, ``core`` (default 0).
"""
from __future__ import annotations

import functools
import gc
import time
from pathlib import Path
from typing import Any

from nemo_rl_specdec.bench import MAX_PROMPTS, MAX_SAMPLES, MAX_STEPS, option, say, suite_options
from nemo_rl_specdec.config.run import ConfigError, RunConfig
from nemo_rl_specdec.drafters.base import MODEL
from nemo_rl_specdec.drafters.registry import drafter as drafter_of, registered, weights_in_policy
from nemo_rl_specdec.drafters.roles import Declared, ModelWeights, PricedDrafter, Refreshable
from nemo_rl_specdec.resources import asset_path
from nemo_rl_specdec.update import PolicyUpdate

MIN_STEPS = 10
BLOCK = "policy.generation.speculative_decoding"


_say = functools.partial(say, "parametric")

def _has_mtp_layers(model_dir: str) -> bool:
    import json

    f = Path(model_dir) / "config.json"
    return f.is_file() and int(json.loads(f.read_text()).get("num_nextn_predict_layers") or 0) > 0


def _mtp_model(cfg: RunConfig, b: dict):
    """The MTP policy of the `mtp` group: bench.parametric.mtp_model, else the run file's policy if it
    has MTP layers, else the bundled tiny_mtp next to the bundled tiny policy."""
    if b.get("mtp_model"):
        return str(b["mtp_model"])
    if _has_mtp_layers(cfg.model_path):
        return cfg.model_path
    bundled = asset_path("tiny_mtp")
    if Path(cfg.model_path).resolve() == asset_path("tiny", "policy").resolve() and bundled.is_dir():
        return str(bundled)
    return None


def _available(cfg: RunConfig, b: dict) -> list:
    """Model drafters with weights for this policy: their own checkpoint directory, or (drafters whose
    layers ride in the policy checkpoint) an MTP policy (`_mtp_model`). A drafter made of parts (the
    hybrid) is not one: its model part is benched here on its own."""
    out = []
    for name, d in registered(Declared).items():
        if d.kind != MODEL or drafter_of(name, PricedDrafter).cost_parts is not None:
            continue
        if weights_in_policy(name):
            m = _mtp_model(cfg, b)
            ok = bool(m and _has_mtp_layers(m))
        else:
            p = d.checkpoint(cfg.spec)
            ok = bool(p and Path(p).is_dir())
        if ok:
            out.append(name)
    return out


def _options(cfg: RunConfig) -> dict:
    b = suite_options(cfg, "parametric", known=("steps", "drafters", "k", "mtp_k", "mtp_model", "lr", "distill_lr",
                                                 "distill_epochs", "problem_seed", "core"))
    # acceptance must be followed over at least MIN_STEPS policy updates
    steps = option(b, "parametric", "steps", max(MIN_STEPS, cfg.setting("grpo.max_num_steps", MIN_STEPS, 1,
                                                                        MAX_STEPS)), MIN_STEPS, MAX_STEPS)
    avail = _available(cfg, b)
    drafters = b.get("drafters", avail)
    bad = [d for d in drafters if d not in avail] if isinstance(drafters, list) else [drafters]
    if bad or not drafters:
        raise ConfigError(f"bench.parametric.drafters: got {drafters!r}; allowed: a non-empty subset of {avail} "
                          "(parametric drafters with a checkpoint directory for this policy)")
    return {"steps": steps, "drafters": list(drafters), "k": option(b, "parametric", "k", 4, 1, 64),
            "mtp_k": option(b, "parametric", "mtp_k", 1, 1, 64), "mtp_model": _mtp_model(cfg, b),
            "lr": option(b, "parametric", "lr", cfg.setting("grpo.learning_rate", 1e-4, 1e-12, 1.0, float),
                         1e-12, 1.0, float),
            "distill_lr": option(b, "parametric", "distill_lr", 1e-3, 1e-12, 1.0, float),
            "distill_epochs": option(b, "parametric", "distill_epochs", 2, 1, 100),
            "prompts": cfg.setting("grpo.num_prompts_per_step", 8, 1, MAX_PROMPTS),
            "generations": cfg.setting("grpo.num_generations_per_prompt", 4, 2, MAX_SAMPLES),
            "problem_seed": option(b, "parametric", "problem_seed", 2024, 0, 2**32 - 1),
            "seed": cfg.setting("grpo.seed", 0, 0, 2**32 - 1), "core": option(b, "parametric", "core", 0, 0, 4095)}


def _mtp_policy_cfg(cfg: RunConfig, model: str) -> RunConfig:
    """The run file with its policy replaced by the MTP policy (the `mtp` group's baseline)."""
    import copy

    from nemo_rl_specdec.config.run import validate_run_dict

    raw = copy.deepcopy(cfg.raw)
    raw["policy"]["model_name"] = model
    return validate_run_dict(raw, cfg.source)


def configurations(cfg: RunConfig, opts: dict) -> list:
    """Groups of configurations sharing one policy: [(policy cfg, [conf, ...]), ...]."""
    main, mtp = [], []
    in_policy = {d for d in opts["drafters"] if weights_in_policy(d)}
    mtp_cfg = _mtp_policy_cfg(cfg, opts["mtp_model"]) if in_policy else None
    for d in opts["drafters"]:
        base = mtp_cfg if d in in_policy else cfg
        k = opts["mtp_k"] if d in in_policy else opts["k"]
        modes = ["frozen"] + (["online"] if "online" in drafter_of(d, Refreshable).refresh_modes else [])
        for mode in modes:
            c = base.with_spec(enabled=True, drafter=d, refresh={"mode": mode}, num_speculative_tokens=k)
            (mtp if d in in_policy else main).append({"name": f"{d}_{mode}", "drafter": d, "mode": mode, "cfg": c})
    groups = [(cfg, main)] if main else []
    if mtp:
        groups.append((mtp_cfg, mtp))
    return groups


def run(cfg: RunConfig, args: Any) -> list[dict]:
    opts = _options(cfg)
    g = cfg.generation
    groups = configurations(cfg, opts)
    _say(f"{[c['name'] for _, cs in groups for c in cs]} + a no-spec baseline per policy, {opts['steps']} GRPO "
         f"updates, {opts['prompts']} problems x {opts['generations']} samples, k={opts['k']} (mtp {opts['mtp_k']}), "
         f"T={g.temperature}, max_new_tokens={g.max_new_tokens}, policies={[p.model_path for p, _ in groups]}")
    results = []
    for pcfg, confs in groups:
        results += _run_group(pcfg, confs, opts)
    _print(results)
    return results


def _run_group(cfg: RunConfig, confs: list, opts: dict) -> list[dict]:
    """Baseline + the group's engines on one policy, interleaved step by step."""
    from nemo_rl_specdec.demo import task
    from nemo_rl_specdec.demo.grpo import GRPOTrainer
    from nemo_rl_specdec.driver.engine import Engine
    from nemo_rl_specdec.rollouts import Request
    from nemo_rl_specdec.train.distill import refresh_due

    g = cfg.generation
    baseline = Engine(cfg, spec_enabled=False, core=opts["core"], seed=opts["seed"], name="no_spec")
    engines, distillers = [], {}
    try:
        for c in confs:
            engines.append(Engine(c["cfg"], core=opts["core"], seed=opts["seed"], name=c["name"]))
            if c["mode"] == "online":
                spec = c["cfg"].spec
                distillers[c["name"]] = drafter_of(spec, ModelWeights).distiller(
                    spec, temperature=g.temperature, seed=opts["seed"], model_path=c["cfg"].model_path,
                                                                   lr=opts["distill_lr"], epochs=opts["distill_epochs"])
        tok = baseline.tokenizer()
        problems = task.run_problems(cfg, opts["prompts"], seed=opts["problem_seed"])
        warm = [Request(task.run_requests(cfg, tok, problems[:1], 1)[0].prompt_token_ids)]
        for e in [baseline] + engines:
            e.generate(warm, max_new_tokens=8)
        trainer = GRPOTrainer(cfg.model_path, lr=opts["lr"], seed=opts["seed"], temperature=max(g.temperature, 1e-3))
        G = opts["generations"]
        per_step: dict = {c["name"]: [] for c in confs}
        train_log = []
        for step in range(opts["steps"]):
            reqs = task.run_requests(cfg, tok, problems, G)
            base_res = baseline.generate(reqs)
            res = {c["name"]: e.generate(reqs) for c, e in zip(confs, engines, strict=True)}
            rollouts = base_res.rollouts
            rewards = task.run_rewards(cfg, tok, problems, rollouts, G)
            t0 = time.perf_counter()
            tstats = trainer.step(rollouts, rewards, [i // G for i in range(len(rollouts))])
            tstats["train_s"] = time.perf_counter() - t0
            train_log.append(tstats)
            weights, version = trainer.state_dict(), step + 1
            baseline.update(PolicyUpdate(version, weights))
            for c, e in zip(confs, engines, strict=True):
                m = res[c["name"]].metrics
                row = {"step": step, "policy_version": step, "tokens_per_target_forward": m.acceptance_length,
                       "acceptance_rate": m.acceptance_rate, "wall_clock_ratio":
                           base_res.metrics.seconds / m.seconds if m.seconds else None,
                       "spec_s": m.seconds, "baseline_s": base_res.metrics.seconds, "drafts": m.drafts,
                       "draft_tokens": m.draft_tokens, "accepted_tokens": m.accepted_tokens,
                       "generated_tokens": m.generated_tokens,
                       "drafter_version": res[c["name"]].rollouts[0].drafter_version}
                d = distillers.get(c["name"])
                if d is not None and refresh_due(version, c["cfg"].spec.refresh.every_n_steps):
                    ds = d.step(trainer.model, res[c["name"]].rollouts)
                    rep = e.update(PolicyUpdate(version, weights, drafter_weights=d.state_dict(),
                                                drafter_version=version))
                    row.update(distill_s=ds["seconds"], distill_kl_first=ds["kl_first"], distill_kl_last=ds["kl_last"],
                               distill_top1_agreement=ds["top1_agreement_after"],
                               distill_pct_of_grpo_step=100.0 * ds["seconds"] / tstats["train_s"],
                               distill_pct_of_rollout=100.0 * ds["seconds"] / m.seconds if m.seconds else None,
                               update_rpc_s=rep.refresh_s)
                else:
                    rep = e.update(PolicyUpdate(version, weights))
                    row["update_rpc_s"] = rep.refresh_s
                per_step[c["name"]].append(row)
            _say(f"step {step}: reward {tstats.get('mean_reward', float('nan')):.3f}, GRPO {tstats['train_s']:.2f}s, "
                 + ", ".join(f"{n} acc {rows[-1]['acceptance_rate']:.3f}"
                             + (f" (distill {rows[-1]['distill_s']:.2f}s)" if "distill_s" in rows[-1] else "")
                             for n, rows in per_step.items()))
    finally:
        for e in engines + [baseline]:
            e.close()
        gc.collect()
    results = [_summarize(c, per_step[c["name"]]) for c in confs]
    for r in results:
        r["policy"] = cfg.model_path
        r["train"] = [{k: v for k, v in t.items() if isinstance(v, (int, float))} for t in train_log]
    return results


def _summarize(c: dict, rows: list) -> dict:
    def mean(key, rs):
        v = [r[key] for r in rs if r.get(key) is not None]
        return sum(v) / len(v) if v else None

    acc = sum(r["accepted_tokens"] for r in rows)
    dt = sum(r["draft_tokens"] for r in rows)
    drafts = sum(r["drafts"] for r in rows)
    gen = sum(r["generated_tokens"] for r in rows)
    spec_s, base_s = sum(r["spec_s"] for r in rows), sum(r["baseline_s"] for r in rows)
    half = len(rows) // 2
    out = {"name": c["name"], "drafter": c["drafter"], "mode": c["mode"], "steps": len(rows),
           "acceptance_rate": acc / dt if dt else 0.0,
           "tokens_per_target_forward": gen / (gen - acc) if gen > acc else None,
           "acceptance_rate_first_half": mean("acceptance_rate", rows[:half]),
           "acceptance_rate_second_half": mean("acceptance_rate", rows[half:]),
           "acceptance_rate_first_step": rows[0]["acceptance_rate"],
           "acceptance_rate_last_step": rows[-1]["acceptance_rate"],
           "wall_clock_ratio": base_s / spec_s if spec_s else None, "drafts": drafts, "per_step": rows}
    if c["mode"] == "online":
        out.update(distill_s_mean=mean("distill_s", rows),
                   distill_pct_of_grpo_step_mean=mean("distill_pct_of_grpo_step", rows),
                   distill_pct_of_rollout_mean=mean("distill_pct_of_rollout", rows))
    return out


def _print(results: list) -> None:
    from nemo_rl_specdec.bench import print_table

    print_table(results, ["name", "acceptance_rate", "acceptance_rate_first_step", "acceptance_rate_last_step",
                          "acceptance_rate_second_half", "tokens_per_target_forward", "wall_clock_ratio",
                          "distill_s_mean", "distill_pct_of_grpo_step_mean"])
    steps = results[0]["steps"]
    print("acceptance rate per step: " + " | ".join(r["name"] for r in results))
    for i in range(steps):
        print(f"  step {i:2d}: " + "  ".join(f"{r['per_step'][i]['acceptance_rate']:.3f}" for r in results))
