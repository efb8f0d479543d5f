"""Bench suite `lockstep`: what a policy update does to a frozen vs a refit drafter, in one run.

Two draft-model engines start with a drafter identical to the policy. Both receive the same new
policy weights (the policy after real GRPO steps on the bundled task); the refit engine also
receives the new drafter weights in the same update. Reported per engine: acceptance before and
after the update, the refresh wall time, and that time as a fraction of one rollout batch.
Every engine is timed against a no-spec engine on the same prompts and weights.
"""
from __future__ import annotations

import time

BLOCK = "policy.generation.speculative_decoding"


def _policy_after_grpo(cfg, base, reqs, probs, steps: int):
    """Real policy movement: `steps` GRPO updates on the bundled task, from the base engine's rollouts."""
    from nemo_rl_specdec.demo.grpo import GRPOTrainer
    from nemo_rl_specdec.demo.task import verify

    grpo = cfg.raw.get("grpo", {})
    trainer = GRPOTrainer(cfg.model_path, lr=float(grpo.get("learning_rate", 1e-4)) * 10, seed=0)
    tok = base.tokenizer()
    by_id = {p.problem_id: p for p in probs}
    for v in range(1, steps + 1):
        outs = base.generate(reqs).rollouts
        rewards = [verify(by_id[r.problem_id], tok.decode(r.token_ids, skip_special_tokens=True)) for r in outs]
        trainer.step(outs, rewards, [r.problem_id for r in outs])
        base.update(v, trainer.state_dict())
    return trainer.state_dict()


def run(cfg, args) -> list:
    from nemo_rl_specdec.bench import print_table
    from nemo_rl_specdec.bench.drafters import workload
    from nemo_rl_specdec.config import load_run_config
    from nemo_rl_specdec.demo.task import make_problems
    from nemo_rl_specdec.engine.engine import Engine

    grpo = cfg.raw.get("grpo", {})
    steps = int((cfg.raw.get("bench") or {}).get("lockstep_grpo_steps", 3))
    base = Engine(cfg, spec_enabled=False, name="no-spec")
    tok = base.tokenizer()
    n_prob, n_samp = int(grpo.get("num_prompts_per_step", 16)), int(grpo.get("num_generations_per_prompt", 4))
    reqs = workload(cfg, tok, n_prob, n_samp, seed=int(grpo.get("seed", 0)))
    probs = make_problems(n_prob, int(grpo.get("seed", 0)))
    engines = {mode: Engine(load_run_config(cfg.source, list(args.overrides) + [
        f"{BLOCK}.drafter=draft_model", f"{BLOCK}.draft_model.model={cfg.model_path}",
        f"{BLOCK}.num_speculative_tokens=4", f"{BLOCK}.refresh.mode={mode}"]), name=mode)
        for mode in ("frozen", "refit")}
    results = []
    try:
        for e in engines.values():
            e.generate(reqs[:4], max_new_tokens=16)  # warm-up
        before = {m: e.generate(reqs).metrics for m, e in engines.items()}
        new_sd = _policy_after_grpo(cfg, base, reqs, probs, steps)
        version = base.state["policy_version"]
        for mode, e in engines.items():
            drafter = {f"draft.{k}": v for k, v in new_sd.items()} if mode == "refit" else {}
            t0 = time.perf_counter()
            rep = e.update(version, {**new_sd, **drafter})
            refresh_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            tb_out = base.generate(reqs)
            tb = time.perf_counter() - t1
            t2 = time.perf_counter()
            after = e.generate(reqs).metrics
            ts = time.perf_counter() - t2
            results.append({
                "name": f"draft_model ({mode})", "drafter": "draft_model", "mode": mode,
                "acceptance_rate_before": before[mode].acceptance_rate, "acceptance_rate": after.acceptance_rate,
                "tokens_per_target_forward_before": before[mode].acceptance_length,
                "tokens_per_target_forward": after.acceptance_length,
                "refresh_s": refresh_s, "worker_refresh_s": rep["refresh_s"], "rollout_s": ts,
                "refresh_fraction_of_rollout": refresh_s / ts, "drafter_version": rep["drafter_version"],
                "policy_version": rep["policy_version"], "wall_clock_ratio": tb / ts,
                "baseline_tokens": tb_out.metrics.generated_tokens, "per_step": [],
            })
    finally:
        for e in engines.values():
            e.close()
        base.close()
    print_table(results, ["name", "policy_version", "drafter_version", "acceptance_rate_before", "acceptance_rate",
                          "tokens_per_target_forward_before", "tokens_per_target_forward", "refresh_s",
                          "refresh_fraction_of_rollout", "wall_clock_ratio"])
    return results
