"""Bench suite `lockstep`: what a policy update does to a frozen vs a refreshed drafter, in one run.

Part 1, one update. Two draft-model engines start with a drafter identical to the policy. Both
receive the same new policy weights (the policy after real GRPO steps on the bundled task); the
refit engine also receives the new drafter weights in the same update. Reported per engine:
acceptance before and after the update, the refresh wall time, and that time as a fraction of
one rollout batch. Every engine is timed against a no-spec engine on the same prompts and weights.

Part 2, NeMo-RL-shaped rows (`bench.lockstep.nemo_rl_steps` steps, default 5), per drafter: a
frozen engine and a refreshed one (online for `draft_model` / `eagle3`, rebuild for `suffix`)
follow a policy trained by real GRPO steps. The refresh takes the adapter's NeMo-RL route, minus
NeMo-RL itself (absent here): the step's batch in NeMo-RL's training layout (`input_ids`,
`input_lengths`, `token_mask`); the policy step and the distillation in our DTensor-worker mixin
(`adapter/policy_workers.py`) over a CPU stand-in whose `train` is the GRPO step; the replica taken
by reference through Ray's object store and checked (`combine_takes`); then one versioned engine
update with policy and drafter. Per step: acceptance of the frozen and refreshed engines, and the
refresh cost (distillation + hand-over + engine update) as a share of the step (rollout + policy
step + refresh). `bench.lockstep.distill` (a mapping) sets
`refresh.distill.*` of the online engines, `bench.lockstep.drafters` the drafters.
"""
from __future__ import annotations

import time

from nemo_rl_specdec.update import PolicyUpdate

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
        base.update(PolicyUpdate(v, trainer.state_dict()))
    return trainer.state_dict()


def _options(cfg) -> dict:
    """The suite's settings, checked before any engine starts."""
    from nemo_rl_specdec.bench import MAX_PROMPTS, MAX_SAMPLES, MAX_STEPS, option, suite_options
    from nemo_rl_specdec.bench.parametric import _available
    from nemo_rl_specdec.config.run import ConfigError
    from nemo_rl_specdec.drafters.registry import registered, weights_in_policy
    from nemo_rl_specdec.drafters.roles import Refreshable

    b = suite_options(cfg, "lockstep", known=("nemo_rl_steps", "drafters", "distill"))
    # layers that ride in the policy checkpoint (MTP) are refused online in NeMo-RL (nothing there trains
    # them), so they have no row here; list drafters that rebuild from rollouts do
    avail = ([d for d in _available(cfg, {}) if not weights_in_policy(d)]
             + [n for n, d in registered(Refreshable).items() if "rebuild" in d.refresh_modes])
    drafters = b.get("drafters", avail)
    if not isinstance(drafters, list) or not drafters or any(d not in avail for d in drafters):
        raise ConfigError(f"bench.lockstep.drafters: got {drafters!r}; allowed: a non-empty subset of {avail}")
    distill = b.get("distill") or {}
    if not isinstance(distill, dict):
        raise ConfigError(f"bench.lockstep.distill: got {distill!r}; allowed: a mapping of refresh.distill settings")
    return {"grpo_steps": cfg.setting("bench.lockstep_grpo_steps", 3, 1, MAX_STEPS),
            "nemo_rl_steps": option(b, "lockstep", "nemo_rl_steps", 5, 1, MAX_STEPS), "drafters": list(drafters),
            "distill": distill, "prompts": cfg.setting("grpo.num_prompts_per_step", 16, 1, MAX_PROMPTS),
            "samples": cfg.setting("grpo.num_generations_per_prompt", 4, 1, MAX_SAMPLES),
            "seed": cfg.setting("grpo.seed", 0, 0, 2**32 - 1),
            "lr": cfg.setting("grpo.learning_rate", 1e-4, 1e-12, 0.1, float)}


def run(cfg, args) -> list:
    from nemo_rl_specdec.bench import print_table
    from nemo_rl_specdec.config.run import load_run_config
    from nemo_rl_specdec.demo.task import run_problems, run_requests
    from nemo_rl_specdec.driver.engine import Engine

    opts = _options(cfg)
    steps = opts["grpo_steps"]
    base = Engine(cfg, spec_enabled=False, name="no-spec")
    tok = base.tokenizer()
    n_prob, n_samp = opts["prompts"], opts["samples"]
    probs = run_problems(cfg, n_prob, opts["seed"])
    reqs = run_requests(cfg, tok, probs, n_samp)
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
            rep = e.update(PolicyUpdate(version, {**new_sd, **drafter}))
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
                "refresh_s": refresh_s, "worker_refresh_s": rep.refresh_s, "rollout_s": ts,
                "refresh_fraction_of_rollout": refresh_s / ts, "drafter_version": rep.drafter_version,
                "policy_version": rep.policy_version, "wall_clock_ratio": tb / ts,
                "baseline_tokens": tb_out.metrics.generated_tokens, "per_step": [],
            })
    finally:
        for e in engines.values():
            e.close()
        base.close()
    print_table(results, ["name", "policy_version", "drafter_version", "acceptance_rate_before", "acceptance_rate",
                          "tokens_per_target_forward_before", "tokens_per_target_forward", "refresh_s",
                          "refresh_fraction_of_rollout", "wall_clock_ratio"])
    shaped = nemo_rl_shaped(cfg, args, opts)
    print_table([{"name": r["name"], **s} for r in shaped for s in r["per_step"]],
                ["name", "step", "acceptance_rate_frozen", "acceptance_rate", "refresh_s", "step_s",
                 "refresh_share_of_step"])
    print_table(shaped, ["name", "acceptance_rate_frozen", "acceptance_rate", "refresh_share_of_step"])
    return results + shaped


class _GRPOPolicyWorker:
    """CPU stand-in for NeMo-RL's DTensor policy worker: `self.model` and `train` = one GRPO step."""

    def __init__(self, trainer):
        self.trainer, self.model = trainer, trainer.model

    def train(self, data, loss_fn, eval_mode=False, *args, **kwargs):
        t0 = time.perf_counter()
        self.stats = self.trainer.step(data["rollouts"], data["rewards"], data["groups"])
        self.train_s = time.perf_counter() - t0
        return {"global_loss": self.stats.get("loss")}


def _train_data(rollouts, rewards, groups) -> dict:
    """The step's batch in NeMo-RL's training layout (plus what the stand-in's GRPO step reads)."""
    import torch

    rows = [list(r.prompt_token_ids) + list(r.token_ids) for r in rollouts]
    ids = torch.zeros((len(rows), max(map(len, rows))), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (r, row) in enumerate(zip(rollouts, rows, strict=True)):
        ids[i, :len(row)] = torch.tensor(row)
        mask[i, len(r.prompt_token_ids):len(row)] = 1
    return {"input_ids": ids, "input_lengths": torch.tensor([len(x) for x in rows]), "token_mask": mask,
            "rollouts": rollouts, "rewards": rewards, "groups": groups}


def nemo_rl_shaped(cfg, args, opts: dict) -> list:
    """Part 2 of the module docstring: one result per drafter, with per-step rows."""
    import ray

    from nemo_rl_specdec.adapter.policy_workers import SpecDecDistillMixin, combine_takes
    from nemo_rl_specdec.config.run import load_run_config
    from nemo_rl_specdec.demo import task
    from nemo_rl_specdec.demo.grpo import GRPOTrainer
    from nemo_rl_specdec.drafters.registry import drafter as drafter_of
    from nemo_rl_specdec.drafters.roles import Refreshable
    from nemo_rl_specdec.driver.engine import Engine

    steps, drafters = opts["nemo_rl_steps"], opts["drafters"]
    n_prob, G = opts["prompts"], opts["samples"]
    temperature = cfg.generation.temperature
    if not ray.is_initialized():
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    worker_cls = type("BenchPolicyWorker", (SpecDecDistillMixin, _GRPOPolicyWorker), {})
    out = []
    for drafter in drafters:
        mode = drafter_of(drafter, Refreshable).refresh_modes[0]  # online for model drafters, rebuild for DAS
        over = list(args.overrides) + [f"{BLOCK}.drafter={drafter}", f"{BLOCK}.num_speculative_tokens=4"]
        distill = [f"{BLOCK}.refresh.distill.{k}={v}" for k, v in opts["distill"].items()
                   if mode == "online"]
        live_cfg = load_run_config(cfg.source, over + [f"{BLOCK}.refresh.mode={mode}"] + distill)
        engines = {"frozen": Engine(load_run_config(cfg.source, over + [f"{BLOCK}.refresh.mode=frozen"]),
                                    name=f"{drafter}-frozen"),
                   "live": Engine(live_cfg, name=f"{drafter}-{mode}")}
        try:
            tok = engines["live"].tokenizer()
            problems = task.run_problems(cfg, n_prob, seed=opts["seed"])
            trainer = GRPOTrainer(cfg.model_path, lr=opts["lr"] * 10, seed=0,
                                  temperature=max(temperature, 1e-3))
            worker = worker_cls(trainer) if mode == "online" else _GRPOPolicyWorker(trainer)
            if mode == "online":
                worker.specdec_distill_setup(live_cfg.spec.model_dump(mode="json"), temperature)
                combine_takes([worker.specdec_take_drafter()])  # drafter 0: the checkpoint, already in the engine
            reqs = task.run_requests(cfg, tok, problems, G)
            for e in engines.values():
                e.generate(reqs[:4], max_new_tokens=16)  # warm-up
            rows = []
            for step in range(1, steps + 1):
                frozen = engines["frozen"].generate(reqs).metrics
                t0 = time.perf_counter()
                live = engines["live"].generate(reqs)
                rollout_s = time.perf_counter() - t0
                rewards = task.run_rewards(cfg, tok, problems, live.rollouts, G)
                worker.train(_train_data(live.rollouts, rewards, [i // G for i in range(len(rewards))]), None)
                sd = trainer.state_dict()
                t0 = time.perf_counter()
                if mode == "online":
                    pub = combine_takes([worker.specdec_take_drafter()])
                    if pub is None:
                        raise RuntimeError(f"bench.lockstep: no drafter was distilled after step {step}; the rows "
                                           "need refresh.every_n_steps=1")
                    distill_s = pub["stats"]["drafter_train_s"]  # what NeMo-RL logs as specdec/drafter_train_s
                    rep = engines["live"].update(PolicyUpdate(step, sd, drafter_weights=ray.get(pub["refs"][0]),
                                                 drafter_version=step))
                else:
                    distill_s = 0.0
                    rep = engines["live"].update(PolicyUpdate(step, sd, rollouts=live.rollouts))
                handover_s = time.perf_counter() - t0
                engines["frozen"].update(PolicyUpdate(step, sd))
                refresh_s = distill_s + handover_s
                step_s = rollout_s + worker.train_s + refresh_s
                rows.append({"step": step, "acceptance_rate_frozen": frozen.acceptance_rate,
                             "tokens_per_target_forward_frozen": frozen.acceptance_length,
                             "acceptance_rate": live.metrics.acceptance_rate,
                             "tokens_per_target_forward": live.metrics.acceptance_length,
                             "rollout_s": rollout_s, "policy_step_s": worker.train_s, "distill_s": distill_s,
                             "handover_s": handover_s, "refresh_s": refresh_s, "step_s": step_s,
                             "refresh_share_of_step": refresh_s / step_s,
                             "drafter_version": rep.drafter_version, "policy_version": rep.policy_version})
        finally:
            for e in engines.values():
                e.close()
        share = sum(r["refresh_s"] for r in rows) / sum(r["step_s"] for r in rows)
        out.append({"name": f"{drafter} ({mode}, NeMo-RL-shaped)", "drafter": drafter, "mode": mode,
                    "acceptance_rate_frozen": sum(r["acceptance_rate_frozen"] for r in rows) / len(rows),
                    "acceptance_rate": sum(r["acceptance_rate"] for r in rows) / len(rows),
                    "tokens_per_target_forward": sum(r["tokens_per_target_forward"] for r in rows) / len(rows),
                    "wall_clock_ratio": None, "refresh_share_of_step": share, "per_step": rows})
    return out
