"""`nemo-rl-specdec demo`: a GRPO loop on CPU with speculative rollouts and honest A/B timing.

Per step: the batch's problems (a fixed pool, so problems recur as in RL epochs) are rolled out
on the speculative engine and, on the same weights, on a no-speculation engine (order
alternates each step); rewards come from the task's verifier; one GRPO update trains the
policy; one lockstep update moves every engine to the new policy version and refreshes the
drafter. Optionally a frozen draft-model engine rolls out one sample of each of the batch's
problems to show a stale parametric drafter decaying (tokens per target forward; not timed).
`grpo.mode: async` overlaps the next batch's rollouts with training; the update then lands in
flight and rollouts carry the versions of each stretch of tokens.

Priced (`price_loop`, given by the command line: `bench/onetext.py` `LoopPricer`): after the loop,
the run's drafter and vLLM's built-ins are replayed over the speculative engine's rollouts of every
step (one text, the one the policy trained on), every draft checked against it, and priced on
`demo.hardware` (default h100_qwen3_8b) with the proposers' host time measured in the replay:
each step's priced speedup over the same text without drafts, and the run's against no
speculation and against the best built-in. The wall-clock ratio of the two engines is this
machine's, printed beside it.

Artifacts in --out (default runs/<name>/): metrics.jsonl (one line per step), summary.json,
TensorBoard events (tb/), PNG plots, and engines.log: vLLM's and torch's own output, which the
terminal does not show. A rerun into an existing folder replaces these artifacts (tb/ is written
anew) and leaves any other file there alone. The report fits a 100-column terminal.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemo_rl_specdec.config.run import ConfigError, RunConfig, load_run_config
from nemo_rl_specdec.update import PolicyUpdate, UpdateReport

if TYPE_CHECKING:
    from nemo_rl_specdec.train.distill import Distiller

BLOCK = "policy.generation.speculative_decoding"


def _section(cfg: RunConfig, name: str) -> dict:
    sec = cfg.raw.get(name)
    if sec is None:
        return {}
    if not isinstance(sec, dict):
        raise ConfigError(f"{name}: got {sec!r}; allowed: a mapping of settings")
    return sec


DEFAULT_HARDWARE = "h100_qwen3_8b"


def named_profile(name, key: str):
    """The hardware profile `name` (`cost/profile.py`: a name in configs/hardware/ or a path), read from
    the run file's `key`; errors name the key."""
    from nemo_rl_specdec.cost.profile import load_profile, profile_names

    if not isinstance(name, str) or not name:
        raise ConfigError(f"{key}: got {name!r}; allowed: {profile_names()} or a profile's path")
    try:
        return load_profile(name)
    except ConfigError as e:
        raise ConfigError(f"{key}: {e}") from None


def hardware_profile(cfg: RunConfig):
    """`demo.hardware` (default h100_qwen3_8b): the profile the loop's rollouts are priced on."""
    return named_profile(_section(cfg, "demo").get("hardware", DEFAULT_HARDWARE), "demo.hardware")


# the CPU loop's sizes: beyond these a run takes hours on a few cores
MAX_STEPS, MAX_PROMPTS, MAX_GENERATIONS, MAX_ROLLOUTS_PER_STEP, MAX_POOL = 1000, 1024, 64, 4096, 1_000_000


class DemoSettings:
    """The `grpo` and `demo` sections of the run file that the CPU loop reads (NeMo-RL names)."""

    def __init__(self, cfg: RunConfig):
        g, d = _section(cfg, "grpo"), _section(cfg, "demo")
        if not cfg.spec.enabled:
            raise ConfigError(f"{BLOCK}.enabled: got false; the demo compares speculative and plain rollouts, so "
                              "allowed: true")
        self.mode = g.get("mode", "sync")
        if self.mode not in ("sync", "async"):
            raise ConfigError(f"grpo.mode: got {self.mode!r}; allowed: 'sync' or 'async'")
        self.steps = cfg.setting("grpo.max_num_steps", 6, 1, MAX_STEPS)
        self.prompts = cfg.setting("grpo.num_prompts_per_step", 16, 1, MAX_PROMPTS)
        self.generations = cfg.setting("grpo.num_generations_per_prompt", 4, 2, MAX_GENERATIONS)
        if self.prompts * self.generations > MAX_ROLLOUTS_PER_STEP:
            raise ConfigError(f"grpo.num_prompts_per_step x grpo.num_generations_per_prompt: got {self.prompts} x "
                              f"{self.generations}; allowed: at most {MAX_ROLLOUTS_PER_STEP} rollouts per step")
        self.lr = cfg.setting("grpo.learning_rate", 1e-4, 0, 1, float, lo_open=True)
        self.seed = cfg.setting("grpo.seed", 0, 0, 2**32 - 1)
        self.pool = cfg.setting("demo.problem_pool", 2 * self.prompts, self.prompts, MAX_POOL)
        self.profile = hardware_profile(cfg)   # demo.hardware: checked before any engine
        self.compare_frozen = d.get("compare_frozen_drafter", False)
        if not isinstance(self.compare_frozen, bool):
            raise ConfigError(f"demo.compare_frozen_drafter: got {self.compare_frozen!r}; allowed: true or false")
        # real chat models (configs/smollm2_cpu.yaml): chat-formatted prompts, partial-credit rewards (task.py)
        from nemo_rl_specdec.demo.task import run_prompt_format, run_reward, run_task_families

        self.prompt_format, self.reward = run_prompt_format(cfg), run_reward(cfg)
        self.families = run_task_families(cfg)
        self.steps_per_pass = -(-self.pool // self.prompts)  # steps until every pool problem was seen
        mode = cfg.spec.refresh.mode
        d = cfg.spec.drafter
        # 'online' is valid only for the drafters train/distill.py trains (the schema's
        # REFRESH_MODES); refit needs a trainer that sends drafter tensors in the policy stream,
        # which the HF trainer here does not
        if cfg.spec.enabled and mode == "refit":
            raise ConfigError(f"{BLOCK}.refresh.mode: got 'refit' for drafter '{d}'; the CPU demo's HF trainer "
                              "sends no drafter tensors (transformers drops MTP layers on load), so allowed here: "
                              "'frozen', 'online' (draft_model, eagle3, mtp) or 'rebuild' (suffix)")


class RLLoop:
    def __init__(self, cfg: RunConfig, out_dir: Path, progress: bool = True):
        from nemo_rl_specdec.demo.grpo import GRPOTrainer
        from nemo_rl_specdec.demo.task import make_problems
        from nemo_rl_specdec.driver.engine import Engine

        self.cfg, self.s, self.out, self.progress = cfg, DemoSettings(cfg), out_dir, progress
        self.problems = make_problems(self.s.pool, self.s.seed, self.s.families)
        self.spec = Engine(cfg, name="spec", seed=self.s.seed)
        if not self.spec.spec_active:
            raise ConfigError(f"{BLOCK}.enabled: the demo compares speculative and plain rollouts; set it to true")
        self.base = Engine(cfg, spec_enabled=False, name="baseline", seed=self.s.seed + 1)
        self.frozen = None
        if self.s.compare_frozen:
            fcfg = load_run_config(cfg.source, [f"{BLOCK}.drafter=draft_model", f"{BLOCK}.refresh.mode=frozen",
                                                f"{BLOCK}.num_speculative_tokens=4"])
            self.frozen = Engine(fcfg, name="frozen_draft_model", seed=self.s.seed + 2)
        self.trainer = GRPOTrainer(cfg.model_path, lr=self.s.lr, seed=self.s.seed,
                                   temperature=cfg.generation.temperature)
        self.tok = self.spec.tokenizer()
        self.rows: list = []
        self.texts: list = []   # the speculative engine's rollouts of every step: the text the loop is priced on
        # online drafter training (train/distill.py)
        self.distiller: Distiller | None = None
        self.distill_stats: dict | None = None
        if cfg.spec.enabled and cfg.spec.refresh.mode == "online":
            from nemo_rl_specdec.drafters.registry import drafter as drafter_of
            from nemo_rl_specdec.drafters.roles import ModelWeights

            self.distiller = drafter_of(cfg.spec, ModelWeights).distiller(
                cfg.spec, temperature=cfg.generation.temperature, seed=self.s.seed, model_path=cfg.model_path)

    # ------------------------------------------------------------------ pieces
    def batch(self, step: int):
        from nemo_rl_specdec.demo.task import prompt_token_ids
        from nemo_rl_specdec.rollouts import Request

        n = self.s.prompts
        start = (step * n) % len(self.problems)
        probs = [self.problems[(start + i) % len(self.problems)] for i in range(n)]
        reqs = [Request(prompt_token_ids(self.tok, p, self.s.prompt_format), problem_id=p.problem_id)
                for p in probs for _ in range(self.s.generations)]
        return probs, reqs

    def rewards(self, probs, rollouts) -> list:
        from nemo_rl_specdec.demo.task import reward

        by_id = {p.problem_id: p for p in probs}
        return [reward(by_id[r.problem_id], self.tok.decode(r.token_ids, skip_special_tokens=True), self.s.reward)
                for r in rollouts]

    def push(self, version: int, rollouts) -> UpdateReport:
        """One lockstep update: new policy weights everywhere, the drafter refreshed by its mode."""
        sd = self.trainer.state_dict()
        from nemo_rl_specdec.drafters.registry import drafter as drafter_of
        from nemo_rl_specdec.drafters.roles import Refreshable

        spec = self.spec.spec
        mode = spec.refresh.mode
        # a rollout store (DAS; the hybrid's history half) rebuilds from them at every refresh that is not frozen
        takes = drafter_of(spec, Refreshable).rollout_prompt_tail(spec) is not None
        payload = rollouts if mode != "frozen" and takes else None
        self.distill_stats = None
        if self.distiller is not None:
            from nemo_rl_specdec.train.distill import refresh_due

            if refresh_due(version, self.spec.spec.refresh.every_n_steps):
                # distil on this step's rollouts against the NEW policy; same update, same version
                self.distill_stats = self.distiller.step(self.trainer.model, rollouts)
                rep = self.spec.update(PolicyUpdate(version, sd, drafter_weights=self.distiller.state_dict(),
                                       drafter_version=version, rollouts=payload))
            else:  # off-cadence: the model drafter ages within max_policy_lag
                rep = self.spec.update(PolicyUpdate(version, sd, rollouts=payload))
        else:
            rep = self.spec.update(PolicyUpdate(version, sd, rollouts=payload))
        self.base.update(PolicyUpdate(version, sd))
        if self.frozen is not None:
            self.frozen.update(PolicyUpdate(version, sd))
        return rep

    # ------------------------------------------------------------------ loop
    def run(self) -> list:
        from tqdm import tqdm

        from nemo_rl_specdec.demo.console import err, line, width

        self.warm_up()
        # a bar on a terminal; a line per step in a log (a bar's redraws would make one long line there)
        live = self.progress and err().isatty()
        bar = tqdm(range(self.s.steps), desc=f"GRPO ({self.s.mode})", unit="step", disable=not live, file=err(),
                   ncols=width())
        pending: tuple | None = None  # async: (thread, box, probs, reqs) of the batch in flight
        for step in bar:
            probs, reqs = self.batch(step)
            if self.s.mode == "async" and pending is not None:
                th, box, probs, reqs = pending
                th.join()
                if "error" in box:
                    raise box["error"]
                spec_out, spec_s = box["out"], box["s"]
                base_out, base_s = self._timed(self.base, reqs)
            elif step % 2 == 1:  # alternate who runs first (slow drift on a shared CPU)
                base_out, base_s = self._timed(self.base, reqs)
                spec_out, spec_s = self._timed(self.spec, reqs)
            else:
                spec_out, spec_s = self._timed(self.spec, reqs)
                base_out, base_s = self._timed(self.base, reqs)
            # the frozen drafter shows acceptance only (its time is not compared): one sample per problem
            frozen_out = self.frozen.generate(reqs[:: self.s.generations]) if self.frozen is not None else None
            r_spec, r_base = self.rewards(probs, spec_out.rollouts), self.rewards(probs, base_out.rollouts)

            if self.s.mode == "async" and step + 1 < self.s.steps:
                nprobs, nreqs = self.batch(step + 1)
                box = {}
                th = threading.Thread(target=self._gen_into, args=(nreqs, box), daemon=True)
                th.start()  # next batch generates while we train on this one
                pending = (th, box, nprobs, nreqs)
            t0 = time.perf_counter()
            stats = self.trainer.step(spec_out.rollouts, r_spec, [r.problem_id for r in spec_out.rollouts])
            train_s = time.perf_counter() - t0
            rep = self.push(step + 1, spec_out.rollouts)
            row = self._row(step, spec_out, base_out, frozen_out, spec_s, base_s, train_s, r_spec, r_base, stats, rep)
            self.rows.append(row)
            self.texts.append(spec_out.rollouts)
            bar.set_postfix(tok_fwd=f"{row['acceptance_length']:.2f}", reward=f"{row['reward_mean']:.2f}")
            if self.progress and not live:
                print(line(f"GRPO step {step + 1}/{self.s.steps}: {row['acceptance_length']:.2f} tokens per target "
                           f"forward, reward {row['reward_mean']:.3f}"), file=err(), flush=True)
        if pending is not None and pending[0].is_alive():
            pending[0].join()
        return self.rows

    def warm_up(self) -> None:
        """One short untimed call per engine: first-call costs (JIT, allocator) stay out of the A/B."""
        _, reqs = self.batch(0)
        for e in (self.spec, self.base, self.frozen):
            if e is not None:
                e.generate(reqs[: max(1, len(reqs) // 4)], max_new_tokens=16)

    def _gen_into(self, reqs, box: dict) -> None:
        try:
            box["out"], box["s"] = self._timed(self.spec, reqs)
        except BaseException as e:  # noqa: BLE001 - re-raised by the main loop
            box["error"] = e

    @staticmethod
    def _timed(engine, reqs):
        t0 = time.perf_counter()
        out = engine.generate(reqs)
        return out, time.perf_counter() - t0

    def _row(self, step, spec_out, base_out, frozen_out, spec_s, base_s, train_s, r_spec, r_base, stats, rep) -> dict:
        m = spec_out.metrics
        first = spec_out.rollouts[0]
        gen_versions = sorted({seg[1] for r in spec_out.rollouts for seg in r.segments})
        row = {
            "step": step, "mode": self.s.mode, "drafter": self.spec.spec.drafter,
            "policy_version": first.policy_version, "drafter_version": first.drafter_version,
            "rollout_policy_versions": gen_versions, "policy_age": first.policy_version - first.drafter_built_from,
            "reward_mean": sum(r_spec) / len(r_spec), "reward_mean_baseline": sum(r_base) / len(r_base),
            "acceptance_length": m.acceptance_length, "acceptance_rate": m.acceptance_rate,
            "accepted_per_position": m.accepted_per_position, "drafts": m.drafts, "tokens": m.generated_tokens,
            "tokens_baseline": base_out.metrics.generated_tokens,
            "rollout_s": spec_s, "rollout_s_baseline": base_s, "wall_clock_ratio": base_s / spec_s,
            "us_per_token": m.us_per_token, "us_per_token_baseline": base_out.metrics.us_per_token,
            "train_s": train_s, "refresh_s": rep.refresh_s, "drafter_refreshed": rep.drafter_refreshed,
            "new_policy_version": rep.policy_version, "new_drafter_version": rep.drafter_version,
            "loss": stats.get("loss"), "rewards": r_spec, "rewards_baseline": r_base,
        }
        engine = (rep.state or {}).get("metrics") or {}
        row.update({f"engine/{k}": v for k, v in engine.items() if k.startswith("hybrid/step/")})
        if self.distill_stats is not None:
            row.update(distill_s=self.distill_stats["seconds"], distill_kl_first=self.distill_stats["kl_first"],
                       distill_kl_last=self.distill_stats["kl_last"],
                       distill_top1_agreement=self.distill_stats["top1_agreement_after"])
        if frozen_out is not None:
            fr = frozen_out.rollouts[0]
            row.update(frozen_acceptance_length=frozen_out.metrics.acceptance_length,
                       frozen_acceptance_rate=frozen_out.metrics.acceptance_rate,
                       frozen_tokens=frozen_out.metrics.generated_tokens, frozen_rollouts=len(frozen_out.rollouts),
                       frozen_policy_age=fr.policy_version - fr.drafter_built_from)
        return row

    def close(self) -> None:
        for e in (self.frozen, self.base, self.spec):
            if e is not None:
                e.close()


def per_pass(rows: list, steps_per_pass: int, key: str = "acceptance_length", tokens: str = "tokens") -> list:
    """Tokens per target forward over each pass through the problem pool (`steps_per_pass`
    consecutive steps; the last pass may be partial): total tokens / total forwards. One step
    sees only part of the pool, and the parts differ in difficulty, so per-step values
    alternate; a pass sees every problem once, as an RL epoch does."""
    out = []
    for i in range(0, len(rows), max(1, steps_per_pass)):
        chunk = [r for r in rows[i:i + steps_per_pass] if r.get(key)]
        toks = sum(r[tokens] for r in chunk)
        fwd = sum(r[tokens] / r[key] for r in chunk)
        out.append(toks / fwd if fwd else 0.0)
    return out


def summarize(rows: list, steps_per_pass: int = 1, priced: dict | None = None) -> dict:
    """The run's figures (summary.json); `priced`: the loop's priced figures (`price_loop`), kept as given."""
    from nemo_rl_specdec.stats import reward_comparison

    acc = [r["acceptance_length"] for r in rows]
    passes = per_pass(rows, steps_per_pass)
    spec_s, base_s = sum(r["rollout_s"] for r in rows), sum(r["rollout_s_baseline"] for r in rows)
    flat_spec = [x for r in rows for x in r["rewards"]]
    flat_base = [x for r in rows for x in r["rewards_baseline"]]
    out = {"steps": len(rows), "mode": rows[0]["mode"], "drafter": rows[0]["drafter"],
           "rollout_s": spec_s, "rollout_s_baseline": base_s, "wall_clock_ratio": base_s / spec_s,
           "acceptance_length_mean": sum(acc) / len(acc), "acceptance_length_peak": max(acc),
           "acceptance_length_last": acc[-1], "last_over_peak": acc[-1] / max(acc),
           "steps_per_pass": steps_per_pass, "acceptance_length_per_pass": passes,
           "last_pass_over_peak_pass": passes[-1] / max(passes) if max(passes) else 0.0,
           "drafter_refreshed_every_step": all(r["drafter_refreshed"] for r in rows),
           "max_policy_age": max(r.get("policy_age", 0) for r in rows),
           "reward_comparison": reward_comparison(flat_spec, flat_base) if len(flat_spec) > 1 else None}
    if priced is not None:
        out["priced"] = priced
    if "frozen_acceptance_length" in rows[0]:
        f = [r["frozen_acceptance_length"] for r in rows]
        out.update(frozen_acceptance_first=f[0], frozen_acceptance_last=f[-1],
                   frozen_acceptance_length_per_pass=per_pass(rows, steps_per_pass, "frozen_acceptance_length",
                                                              "frozen_tokens"))
    return out


def write_artifacts(rows: list, summary: dict, out: Path) -> None:
    import shutil

    from nemo_rl_specdec.demo.plots import plot_run

    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "tb", ignore_errors=True)  # a rerun into the same folder replaces, never appends, events
    with (out / "metrics.jsonl").open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(out / "tb")) as w:
        for r in rows:
            for k, v in tensorboard_scalars(r).items():
                w.add_scalar(k, v, r["step"])
    plot_run(rows, out)


def tensorboard_scalars(row: dict) -> dict:
    """A step row's TensorBoard scalars: every numeric field as `specdec/<field>` (acceptance
    length and rate, drafts, policy and drafter versions, policy age, refresh_s, distill_s, ...)
    and the acceptance at each draft position as `specdec/acceptance_rate_by_position/<i>`,
    i = 1 for the first draft token, as NeMo-RL's `vllm/spec_acceptance_rate-pos-<i>`."""
    out = {f"specdec/{k}": float(v) for k, v in row.items()
           if isinstance(v, (int, float)) and not isinstance(v, bool)}
    for i, v in enumerate(row.get("accepted_per_position") or [], 1):
        out[f"specdec/acceptance_rate_by_position/{i}"] = float(v)
    return out


def add_priced(rows: list, priced: dict | None) -> None:
    """Each step row gains its priced speedup at each host speed (``priced_speedup``: this machine's host
    time, ``priced_speedup_2x``: a host twice as fast) from the loop's priced figures, where there are some."""
    for row, bands in zip(rows, (priced or {}).get("per_step") or [], strict=False):
        for b in bands:
            row["priced_speedup" if b["host_speed"] == 1.0 else f"priced_speedup_{b['host_speed']:g}x"] = b["speedup"]


def _at(bands: list, host_speed: float):
    return next((b for b in bands if b["host_speed"] == host_speed), None)


def summary_lines(summary: dict, out: Path, log: Path | None = None) -> list[tuple[str, str]]:
    """(label, text) lines of the report's summary, in the order a newcomer reads them."""
    lines = []
    rc = summary.get("reward_comparison") or {}
    if rc:
        lines.append(("lossless", f"mean reward {rc['mean_spec']:.3f} with speculation, {rc['mean_baseline']:.3f} "
                                  f"without (Welch t-test p = {rc['p_value']:.2f}; speculation must not change "
                                  "rewards)"))
    pr = summary.get("priced") or {}
    if pr.get("unavailable"):
        lines.append(("priced", f"no priced figure: {pr['unavailable']}"))
    elif pr:
        one, two = _at(pr["by_host_speed"], 1.0), _at(pr["by_host_speed"], 2.0)
        text = (f"rollout {one['speedup']:.2f}x faster than no speculation on {pr['hardware']} ({pr['gpu']}), "
                f"{pr['drafter']} replayed on the loop's text, host time measured here")
        if two:
            text += f" ({two['speedup']:.2f}x on a host twice as fast)"
        lines.append(("priced", text))
        for v in pr.get("vs_best_builtin") or []:
            k = (pr.get("builtins") or {}).get(v["best_builtin"], {}).get("k")
            lines.append(("", f"{v['ratio']:.3f}x the best vLLM built-in ({v['best_builtin']}"
                              + (f", k={k}" if k else "") + f") on the same text, host {v['host_speed']:g}x"))
    lines.append(("this CPU", f"rollout wall clock {summary['wall_clock_ratio']:.2f}x (no-spec s / spec s on this "
                              "machine's CPU: not a GPU figure)"))
    acc = (f"{summary['acceptance_length_mean']:.2f} tokens per target forward (mean of steps); per pass over "
           "the problem pool: " + ", ".join(f"{x:.2f}" for x in summary["acceptance_length_per_pass"]))
    if "frozen_acceptance_length_per_pass" in summary:
        acc += "; a frozen draft model: " + ", ".join(f"{x:.2f}" for x in summary["frozen_acceptance_length_per_pass"])
    lines.append(("acceptance", acc))
    age = summary.get("max_policy_age", 0)
    lines.append(("freshness", ("drafter refreshed at every step" if summary["drafter_refreshed_every_step"]
                                else "drafter not refreshed at every step")
                  + ("; it drafted for the policy version it was built from at every step" if age == 0 else
                     f"; it drafted at most {age} policy version{'s' if age != 1 else ''} behind the policy")))
    lines.append(("artifacts", f"{out}/ (metrics.jsonl, summary.json, *.png)"))
    lines.append(("", f"tensorboard --logdir {out / 'tb'}"))
    if log is not None:
        lines.append(("engine log", f"{log} (vLLM's and torch's own output)"))
    return lines


def print_report(rows: list, summary: dict, out: Path, log: Path | None = None) -> None:
    """The per-step table and the summary, within the terminal's width (`demo/console.py`)."""
    from rich.table import Table

    from nemo_rl_specdec.demo.console import show, table_box

    hw = (summary.get("priced") or {}).get("hardware")
    t = Table(title=f"GRPO with speculative rollouts ({summary['mode']}, drafter {summary['drafter']})",
              box=table_box(), title_justify="left")
    heads = {"step": "step", "policy_version": "policy v", "drafter_version": "drafter v", "reward_mean": "reward",
             "reward_mean_baseline": "no-spec reward", "acceptance_length": "tok/fwd",
             "priced_speedup": "priced x", "wall_clock_ratio": "CPU wall x",
             "frozen_acceptance_length": "frozen tok/fwd"}
    cols = [c for c in heads if any(c in r for r in rows)]
    for c in cols:
        t.add_column(heads[c], justify="right")
    for r in rows:
        t.add_row(*["-" if r.get(c) is None else f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c])
                    for c in cols])
    notes = ["tok/fwd: tokens per target forward."]
    if "priced_speedup" in cols:
        notes.append(f"priced x: the step's rollout priced on {hw} against the same text without drafts (host time "
                     "measured here).")
    notes.append("CPU wall x: no-spec wall s / spec wall s on this machine.")
    if "frozen_acceptance_length" in cols:
        notes.append("frozen tok/fwd: a frozen draft model on one sample per problem.")
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for label, text in summary_lines(summary, out, log):
        grid.add_row(label, text)
    show(t, " ".join(notes), "", "Summary", grid)


def run(args, price_loop: Any = None) -> int:
    """The demo: the loop, then (with `price_loop`: `check(cfg)` before any engine, `price_loop(cfg, texts)`
    after the loop) its priced figures, the artifacts and the report."""
    import tempfile

    from nemo_rl_specdec.demo.console import engine_output

    with tempfile.TemporaryDirectory() as tmp:   # vLLM talks as it is imported: into the log, once there is one
        early = Path(tmp) / "early.log"
        with engine_output(early):
            cfg = load_run_config(args.run_yaml, args.overrides)
            settings = DemoSettings(cfg)  # validate before any engine starts
            if price_loop is not None:
                price_loop.check(cfg)
        said = early.read_text()
    out = Path(args.out or Path("runs") / str(cfg.raw.get("name", "run")))
    log = out / "engines.log"
    out.mkdir(parents=True, exist_ok=True)
    log.write_text(said)
    with engine_output(log):
        loop = RLLoop(cfg, out)
        try:
            rows = loop.run()
        finally:
            loop.close()
        priced = price_loop(cfg, loop.texts) if price_loop is not None else None
        add_priced(rows, priced)
        summary = summarize(rows, steps_per_pass=settings.steps_per_pass, priced=priced)
        write_artifacts(rows, summary, out)
    print_report(rows, summary, out, log)
    return 0
