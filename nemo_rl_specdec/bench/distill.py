"""Bench suite `distill`: step time and peak memory of each online distiller (`refresh.mode: online`).

    nemo-rl-specdec bench configs/tiny_cpu.yaml --suite distill --json OUT.json [bench.distill.KEY=VALUE ...]

No engine. Per drafter (draft_model, eagle3, dflash, mtp), the distiller is built as NeMo-RL's
policy workers build it (``drafter_of(spec, ModelWeights).distiller(spec, temperature=..., seed=..., device=...,
model_path=...)``, the ``refresh.distill`` settings from this suite's options) and trained with
``distiller.step(teacher, rollouts)``: ``warmup`` steps, then ``steps`` timed ones, each on the
same rollouts.

Models (``bench/random_models.py``): the full vocabulary (``vocab_size``, Qwen3's 151,936 by
default: the vocabulary-wide tensors of the loss set the transient) with a small teacher
(``hidden_size`` x ``layers``, random weights, in ``teacher_dtype``) and drafters of matching
shapes from random weights, in the layouts the distillers load; the MTP row's teacher is a
MiMo-style Qwen2 of the same dimensions. Rollouts: ``rollouts`` of random token ids,
``tokens`` in total, the first ``prompt_share`` of each the prompt.

Each drafter is measured in its own process (``python -m nemo_rl_specdec.bench.distill --worker``),
so one drafter's freed memory cannot hide the next one's peak, and a crash, an out-of-memory or a
dtype error becomes that drafter's failed row (with the error) instead of ending the suite.

Reported per drafter (``bench/memory.py``): the peak memory of the steps split into

- ``teacher``: the teacher's weights (parameters and buffers);
- ``state``: the distiller's own between steps: trained parameters x bytes x (1 + 1 + 2)
  (parameters, gradients, AdamW's two moments);
- ``transient``: peak - teacher - state, what a step allocates on top and frees again;

on CUDA from ``torch.cuda.max_memory_allocated`` (reset before the first step), on CPU from the
peak resident set (reset before the first step) less the runtime's share (the resident set then,
minus teacher and parameters); and the step's wall clock: median of the timed steps with their
min and max, and the medians of the distiller's own teacher-side and training seconds.

Run-file knobs, under ``bench.distill`` (all optional): ``drafters`` (all four), ``vocab_size``
(151936), ``tokens`` (8192), ``rollouts`` (4), ``prompt_share`` (0.25: 512 prompt + 1536 response
tokens per rollout at the defaults), ``micro_batch_tokens`` and ``max_tokens`` (the
``refresh.distill`` defaults, 4096 and 8192), ``epochs`` (``refresh.distill`` default),
``teacher_dtype`` (bfloat16 | float32; bfloat16, as NeMo-RL's policies compute), ``hidden_size``
(256), ``layers`` (4), ``head_dim`` (64), ``steps`` (3), ``warmup`` (1), ``seed`` (0), ``device``
(auto: cuda when available, else cpu), ``timeout_s`` (3600 per drafter).
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nemo_rl_specdec.bench import names_option, option, say, suite_options
from nemo_rl_specdec.bench.memory import GB, PeakMemory, split_memory, state_bytes, tensor_bytes
from nemo_rl_specdec.bench.random_models import DRAFTERS, in_policy
from nemo_rl_specdec.config.run import ConfigError, DistillConfig
from nemo_rl_specdec.config.schema import cut

# what every result dict carries (the dispatcher checks it; this suite measures no speedup)
REQUIRED = ("name", "drafter", "status", "error", "device", "teacher_dtype", "step_s", "step_s_min", "step_s_max",
            "peak_bytes", "teacher_bytes", "state_bytes", "transient_bytes", "distiller_params")
TEACHER_DTYPES = ("bfloat16", "float32")
_DISTILL = DistillConfig()
DEFAULTS = {"drafters": list(DRAFTERS), "vocab_size": 151936, "tokens": 8192, "rollouts": 4, "prompt_share": 0.25,
            "micro_batch_tokens": _DISTILL.micro_batch_tokens, "max_tokens": _DISTILL.max_tokens,
            "epochs": _DISTILL.epochs, "teacher_dtype": "bfloat16", "hidden_size": 256, "layers": 4, "head_dim": 64,
            "steps": 3, "warmup": 1, "seed": 0, "device": "auto", "timeout_s": 3600, "shape": "small",
            "memory": "auto"}
SHAPES = ("small", "qwen3-8b")
MEMORY = ("auto", "measured", "estimated")
# integer settings: (lowest, highest); beyond the highest a run does not fit a machine or a day
INTS = {"vocab_size": (8, 1 << 20), "tokens": (2, 1 << 17), "rollouts": (1, 4096), "micro_batch_tokens": (1, 1 << 17),
        "max_tokens": (1, 1 << 17), "epochs": (1, 100), "hidden_size": (8, 16384), "layers": (2, 128),
        "head_dim": (8, 512), "steps": (1, 100), "warmup": (0, 100), "seed": (0, 2**32 - 1),
        "timeout_s": (1, 86400)}

_say = functools.partial(say, "distill")


def options(cfg) -> dict:
    """The suite's settings from ``bench.distill`` (defaults above); ConfigError names a bad key."""
    b = suite_options(cfg, "distill", f"a mapping of {sorted(DEFAULTS)}", known=DEFAULTS)
    o = {**DEFAULTS, **b}
    for k, (lo, hi) in INTS.items():
        if k == "max_tokens" and o[k] is None:  # null: every rollout token, as refresh.distill.max_tokens
            continue
        option(o, "distill", k, None, lo, hi)
    o["drafters"] = names_option(o, "distill", "drafters", DRAFTERS)
    if o["teacher_dtype"] not in TEACHER_DTYPES:
        raise ConfigError(f"bench.distill.teacher_dtype: got {o['teacher_dtype']!r}; allowed: {list(TEACHER_DTYPES)}")
    share = o["prompt_share"]
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share < 1:
        raise ConfigError(f"bench.distill.prompt_share: got {share!r}; allowed: a number between 0 and 1")
    if o["tokens"] < 2 * o["rollouts"]:
        raise ConfigError(f"bench.distill.tokens: got {o['tokens']} for {o['rollouts']} rollouts; allowed: >= "
                          "2 per rollout (a prompt token and a response token)")
    if o["device"] not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"bench.distill.device: got {o['device']!r}; allowed: auto | cpu | cuda")
    if o["shape"] not in SHAPES:
        raise ConfigError(f"bench.distill.shape: got {o['shape']!r}; allowed: {' | '.join(SHAPES)}")
    if o["memory"] not in MEMORY:
        raise ConfigError(f"bench.distill.memory: got {o['memory']!r}; allowed: {' | '.join(MEMORY)}")
    o["temperature"] = float(cfg.get("policy.generation.temperature", 1.0) or 1.0)
    return o


def resolve_memory(memory: str, shape: str, device: str) -> str:
    """`auto`: estimated (fake tensors, nothing allocated) for Qwen3-8B shapes on a CPU, which neither
    fit nor finish there; measured otherwise."""
    if memory != "auto":
        return memory
    return "estimated" if shape == "qwen3-8b" and device == "cpu" else "measured"


def resolve_device(device: str) -> str:
    """`auto`: cuda when torch sees a GPU, else cpu."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


# --------------------------------------------------------------------------- rollouts
def rollout_lengths(tokens: int, rollouts: int, prompt_share: float) -> list[tuple[int, int]]:
    """(prompt, response) tokens of each rollout: `tokens` split as evenly as can be, the first
    `prompt_share` of each (at least one token) the prompt, the rest (at least one) the response."""
    out = []
    for i in range(rollouts):
        n = tokens // rollouts + (1 if i < tokens % rollouts else 0)
        p = min(n - 1, max(1, round(n * prompt_share)))
        out.append((p, n - p))
    return out


def random_rollouts(lengths: Sequence[tuple[int, int]], vocab_size: int, seed: int = 0) -> list[dict]:
    """Rollout dicts (`prompt_token_ids`, `token_ids`) of random ids in [3, vocab_size) of the given
    lengths (ids 0-2 are the configs' pad, bos and eos)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return [{"prompt_token_ids": torch.randint(3, vocab_size, (p,), generator=g).tolist(),
             "token_ids": torch.randint(3, vocab_size, (r,), generator=g).tolist()} for p, r in lengths]


# --------------------------------------------------------------------------- one distiller
def distill_spec(drafter: str, model_dir: str | None, *, micro_batch_tokens: int, max_tokens: int | None,
                 epochs: int):
    """The `speculative_decoding` block NeMo-RL's policy workers would build the distiller from:
    `drafter` online with its checkpoint `model_dir` (none for mtp: its layers are the policy's)."""
    from nemo_rl_specdec.config.run import SpecDecConfig

    block: dict = {"enabled": True, "drafter": drafter, "num_speculative_tokens": 1 if in_policy(drafter) else 4,
                   "refresh": {"mode": "online", "distill": {"micro_batch_tokens": micro_batch_tokens,
                                                             "max_tokens": max_tokens, "epochs": epochs}}}
    if not in_policy(drafter):
        block[drafter] = {"model": str(model_dir)}
    return SpecDecConfig.model_validate(block)


def make_distiller(drafter: str, drafter_dir: str, *, device: Any, temperature: float = 1.0, seed: int = 0,
                   micro_batch_tokens: int = _DISTILL.micro_batch_tokens,
                   max_tokens: int | None = _DISTILL.max_tokens, epochs: int = _DISTILL.epochs):
    """The drafter's online distiller, built through the public API as the policy workers build it;
    for mtp, `drafter_dir` is the policy checkpoint (`model_path`)."""
    from nemo_rl_specdec.drafters.registry import drafter as drafter_of
    from nemo_rl_specdec.drafters.roles import ModelWeights

    spec = distill_spec(drafter, drafter_dir, micro_batch_tokens=micro_batch_tokens, max_tokens=max_tokens,
                        epochs=epochs)
    return drafter_of(spec, ModelWeights).distiller(spec, temperature=temperature, seed=seed, device=device,
                                      model_path=drafter_dir if in_policy(drafter) else None)


def _sync(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def measure(distiller, teacher, rollouts: list, *, device: Any, steps: int, warmup: int) -> dict:
    """`warmup` + `steps` distillation steps of `distiller` towards `teacher` on `rollouts`: the peak
    memory split (bench/memory.py) over all of them, the timed steps' wall clock (median, min, max) and
    the distiller's own stats of the last step."""
    params = [p for p in distiller.module.parameters() if p.requires_grad]
    n_params = sum(p.numel() for p in params)
    param_bytes = params[0].element_size() if params else 4
    teacher_b = tensor_bytes(teacher)
    probe = PeakMemory(device)
    probe.start(held=teacher_b + tensor_bytes(distiller.module))
    times, stats = [], []
    for i in range(warmup + steps):
        _sync(device)
        t0 = time.perf_counter()
        s = distiller.step(teacher, rollouts)
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            stats.append(s)
    row = split_memory(probe.peak(), teacher_b, state_bytes(n_params, param_bytes))
    last = stats[-1]
    row.update(probe.report())
    row.update({"distiller_params": n_params, "distiller_param_dtype": str(params[0].dtype).removeprefix("torch.")
                if params else None, "teacher_params": sum(p.numel() for p in teacher.parameters()),
                "step_s": statistics.median(times), "step_s_min": min(times), "step_s_max": max(times),
                "step_s_all": times, "teacher_s": statistics.median(s["teacher_s"] for s in stats),
                "train_s": statistics.median(s["train_s"] for s in stats), "kl_first": last.get("kl_first"),
                "kl_last": last.get("kl_last"), "trained_positions": last.get("trained_positions"),
                "response_tokens": last.get("tokens"), "kl_finite": all(
                    math.isfinite(s.get("kl_first", float("nan"))) and math.isfinite(s.get("kl_last", float("nan")))
                    for s in stats)})
    return row


def error_text(e: BaseException, limit: int = 600) -> str:
    """`Type: message` of an exception (one line, cut to `limit` characters), and where it was raised."""
    tb = traceback.extract_tb(e.__traceback__)
    where = f" [at {Path(tb[-1].filename).name}:{tb[-1].lineno}]" if tb else ""
    msg = " ".join(f"{type(e).__name__}: {e}".split())
    return cut(msg, limit) + where


def failed_row(job: dict, error: str) -> dict:
    """A drafter's row when it could not be measured: every measured figure None, the error kept."""
    return {**job_fields(job), "status": "failed", "error": error, **{k: None for k in REQUIRED
            if k not in ("name", "drafter", "status", "error", "device", "teacher_dtype")}}


def job_fields(job: dict) -> dict:
    return {"name": job["name"], "drafter": job["drafter"], "device": job["device"],
            "teacher_dtype": job["teacher_dtype"], "vocab_size": job["vocab_size"], "memory": job.get("memory"),
            "tokens": sum(p + r for p, r in job["lengths"]), "rollouts": len(job["lengths"]),
            "micro_batch_tokens": job["micro_batch_tokens"], "max_tokens": job["max_tokens"], "epochs": job["epochs"]}


def estimate(job: dict) -> dict:
    """`job`'s memory without allocating it (train/estimate.py): the teacher and the distiller built
    from their configs under fake tensors, two steps tracked by torch's MemTracker (the second is
    the steady state; later ones allocate as it does, and every tracked op costs Python time), the
    peak split as `measure` splits it. No time is measured (the steps compute nothing)."""
    from nemo_rl_specdec.train.estimate import fake_tensors

    with fake_tensors():
        row = tracked_step(job)
    row.update({"memory_method": "estimated: torch FakeTensorMode + MemTracker (nothing allocated)",
                "step_s": None, "step_s_min": None, "step_s_max": None})
    return row


def tracked_step(job: dict) -> dict:
    """`job`'s teacher and distiller built, two steps tracked by torch's MemTracker, the peak split as
    `measure` splits it. Under `fake_tensors` (`estimate`) nothing is allocated; outside it, the
    same step allocates for real and the tracker counts the bytes of every tensor it makes (how the
    estimate is checked against real allocation)."""
    import torch

    from nemo_rl_specdec.bench.random_models import build_teacher
    from nemo_rl_specdec.train.estimate import track_step

    rollouts = random_rollouts(job["lengths"], job["vocab_size"], seed=job["seed"])
    teacher = build_teacher(job["teacher_dir"], getattr(torch, job["teacher_dtype"]), job["device"], seed=job["seed"])
    distiller = make_distiller(job["drafter"], job["drafter_dir"], device=job["device"],
                               temperature=job["temperature"], seed=job["seed"],
                               micro_batch_tokens=job["micro_batch_tokens"], max_tokens=job["max_tokens"],
                               epochs=job["epochs"])
    t = track_step(distiller, teacher, rollouts)
    row = split_memory(t["peak"], t["teacher"], state_bytes(t["params"], t["param_bytes"]))
    row.update({"distiller_params": t["params"], "teacher_params": sum(p.numel() for p in teacher.parameters()),
                "distiller_param_dtype": t["param_dtype"],
                "draft_vocab_size": getattr(distiller, "draft_vocab_size", None)})
    return row


def run_job(job: dict) -> dict:
    """One drafter measured (or its memory estimated, ``job['memory']``) in this process: the
    teacher, the distiller, the steps (any error of them becomes a failed row naming the phase it
    happened in)."""
    import torch

    from nemo_rl_specdec.bench.random_models import build_teacher

    if job.get("memory") == "estimated":
        try:
            return {**job_fields(job), "status": "ok", "error": None, **estimate(job)}
        except Exception as e:  # noqa: BLE001 - the row records it; the suite goes on with the next drafter
            return failed_row(job, f"estimate: {error_text(e)}")
    phase = "teacher"
    try:
        device = torch.device(job["device"])
        teacher = build_teacher(job["teacher_dir"], getattr(torch, job["teacher_dtype"]), device, seed=job["seed"])
        phase = "distiller"
        distiller = make_distiller(job["drafter"], job["drafter_dir"], device=device, temperature=job["temperature"],
                                   seed=job["seed"], micro_batch_tokens=job["micro_batch_tokens"],
                                   max_tokens=job["max_tokens"], epochs=job["epochs"])
        phase = "step"
        rollouts = random_rollouts(job["lengths"], job["vocab_size"], seed=job["seed"])
        row = measure(distiller, teacher, rollouts, device=device, steps=job["steps"], warmup=job["warmup"])
    except Exception as e:  # noqa: BLE001 - the row records it; the suite goes on with the next drafter
        return failed_row(job, f"{phase}: {error_text(e)}")
    return {**job_fields(job), "status": "ok", "error": None, **row}


def run_in_subprocess(job: dict, timeout_s: float) -> dict:
    """`run_job` in a fresh Python process; a process that dies (killed for memory, say) or overruns
    `timeout_s` gives a failed row with its exit status and the tail of its stderr."""
    with tempfile.TemporaryDirectory(prefix="specdec-distill-") as d:
        job_path, row_path = Path(d) / "job.json", Path(d) / "row.json"
        job_path.write_text(json.dumps(job))
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([root] + [p for p in os.environ.get("PYTHONPATH", "")
                                                                     .split(os.pathsep) if p])}
        cmd = [sys.executable, "-m", "nemo_rl_specdec.bench.distill", "--worker", str(job_path), "--out", str(row_path)]
        try:
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return failed_row(job, f"worker: no result within {timeout_s:g} s")
        if res.returncode == 0 and row_path.is_file():
            return json.loads(row_path.read_text())
        tail = " | ".join(line for line in (res.stderr or "").strip().splitlines()[-5:])
        return failed_row(job, f"worker: exit status {res.returncode}"
                          + (" (killed: out of memory?)" if res.returncode in (-9, 137) else "") + f": {tail}")


def jobs(o: dict, checkpoints: dict, device: str) -> list[dict]:
    """One worker job per drafter of `checkpoints` ({drafter: (teacher dir, drafter dir)})."""
    lengths = rollout_lengths(o["tokens"], o["rollouts"], o["prompt_share"])
    return [{"name": f"{name} {o['teacher_dtype']} {device}", "drafter": name, "device": device,
             "teacher_dir": t, "drafter_dir": p, "teacher_dtype": o["teacher_dtype"], "vocab_size": o["vocab_size"],
             "lengths": lengths, "micro_batch_tokens": o["micro_batch_tokens"], "max_tokens": o["max_tokens"],
             "epochs": o["epochs"], "temperature": o.get("temperature", 1.0), "steps": o["steps"],
             "warmup": o["warmup"], "seed": o["seed"],
             "memory": resolve_memory(o.get("memory", "auto"), o.get("shape", "small"), device)}
            for name, (t, p) in checkpoints.items()]


def measure_drafters(o: dict, shapes: dict, device: str, root, on_row: Callable | None = None) -> list[dict]:
    """The random checkpoints of `shapes` under `root`, then each drafter of ``o['drafters']``
    measured in its own process; returns the rows (each also handed to `on_row` as it comes)."""
    from nemo_rl_specdec.bench.random_models import write_checkpoints

    estimated = resolve_memory(o.get("memory", "auto"), o.get("shape", "small"), device) == "estimated"
    ckpts = write_checkpoints(shapes, root, drafters=o["drafters"], device="meta" if estimated else device,
                              seed=o["seed"])
    rows = []
    for job in jobs(o, ckpts, device):
        _say(f"{job['name']}: {len(job['lengths'])} rollouts, {sum(map(sum, job['lengths']))} tokens, vocabulary "
             f"{job['vocab_size']}")
        row = run_in_subprocess(job, o["timeout_s"])
        if row["status"] == "ok" and row["step_s"] is None:
            _say(f"{job['name']}: estimated peak {row['peak_bytes'] / GB:.2f} GB (teacher "
                 f"{row['teacher_bytes'] / GB:.2f}, state {row['state_bytes'] / GB:.2f}, transient "
                 f"{row['transient_bytes'] / GB:.2f})")
        elif row["status"] == "ok":
            _say(f"{job['name']}: step {row['step_s']:.2f} s, peak {row['peak_bytes'] / GB:.2f} GB (teacher "
                 f"{row['teacher_bytes'] / GB:.2f}, state {row['state_bytes'] / GB:.2f}, transient "
                 f"{row['transient_bytes'] / GB:.2f})")
        else:
            _say(f"{job['name']}: FAILED {row['error']}")
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


# (header, key, scale): GB columns are bytes / 1e9
TABLE = [("drafter", "drafter", None), ("teacher", "teacher_dtype", None), ("status", "status", None),
         ("memory", "memory", None),
         ("params M", "distiller_params", 1e6), ("teacher GB", "teacher_bytes", GB), ("state GB", "state_bytes", GB),
         ("transient GB", "transient_bytes", GB), ("peak GB", "peak_bytes", GB), ("step s", "step_s", 1),
         ("min", "step_s_min", 1), ("max", "step_s_max", 1), ("teacher s", "teacher_s", 1),
         ("train s", "train_s", 1)]


def table_rows(results: list[dict]) -> list[dict]:
    """The table's cells of each result (None stays None: the table prints '-')."""
    return [{h: (r.get(k) if scale is None or r.get(k) is None else float(r[k]) / scale) for h, k, scale in TABLE}
            for r in results]


def print_errors(results: list[dict]) -> None:
    """The failed rows' errors, one line each, under the table."""
    for r in results:
        if r.get("error"):
            print(f"{r['name']}: {r['error']}")


def run(cfg, args) -> list:
    from nemo_rl_specdec.bench import print_table
    from nemo_rl_specdec.bench.random_models import qwen3_8b_shapes, small_shapes

    o = options(cfg)
    device = resolve_device(o["device"])
    shapes = (qwen3_8b_shapes(o["vocab_size"]) if o["shape"] == "qwen3-8b"
              else small_shapes(o["vocab_size"], o["hidden_size"], o["layers"], o["head_dim"]))
    t = shapes["teacher"]
    _say(f"{o['drafters']} on {device}, memory {resolve_memory(o['memory'], o['shape'], device)}: teacher "
         f"{t['hidden_size']} x {t['num_hidden_layers']} layers in {o['teacher_dtype']}, "
         f"vocabulary {o['vocab_size']}, {o['rollouts']} rollouts of {o['tokens']} tokens in all, micro-batches "
         f"of {o['micro_batch_tokens']}, max_tokens {o['max_tokens']}, "
         + ("two steps, estimated" if resolve_memory(o["memory"], o["shape"], device) == "estimated"
            else f"{o['warmup']} + {o['steps']} steps"))
    with tempfile.TemporaryDirectory(prefix="specdec-distill-ckpt-") as root:
        results = measure_drafters(o, shapes, device, root)
    for r in results:
        r["shapes"] = shapes
    print_table(table_rows(results), [h for h, _, _ in TABLE])
    print_errors(results)
    return results


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(description="one drafter's distillation measured in this process (a worker of "
                                             "bench --suite distill)")
    ap.add_argument("--worker", required=True, help="the job's JSON file")
    ap.add_argument("--out", required=True, help="where the row goes (JSON)")
    a = ap.parse_args(argv)
    row = run_job(json.loads(Path(a.worker).read_text()))
    Path(a.out).write_text(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
