"""The device check: the online distillers on a GPU, with a float32 and a bfloat16 teacher, and their
step time and peak memory at Qwen3-8B shapes.

    python -m tools.device_check --out device_check.json

For a machine with a GPU but none of our serving stack: it needs only torch, transformers,
pydantic and safetensors (no vLLM, no Ray, no network). It imports the package's config,
drafters, train and bench modules, which import neither vLLM nor Ray.

(a) ``tiny``: each online distiller (draft_model, eagle3, dflash, mtp), built as NeMo-RL's policy
    workers build it (``ModelWeights.distiller(spec, ..., device=...)``) from the bundled tiny assets,
    takes two ``step``\\ s towards the bundled policy (``tiny/policy``; ``tiny_mtp`` for mtp) on
    ``--device``, once with the policy in float32 and once in bfloat16: per cell ``ok`` (both steps
    ran and their KLs are finite) or the error.
(b) ``8b``: the measurement of ``bench --suite distill`` (``bench/distill.py``, the same code: one
    process per drafter, peak memory split into teacher weights, distiller state and transient,
    step time median with min and max) at ``--shape qwen3-8b``: a Qwen3-8B-shaped teacher (4096
    hidden, 36 layers, 32 heads, 8 KV heads, 12288 MLP, 151,936 vocabulary) with random bfloat16
    weights, a draft model of Qwen3-0.6B's shape, an Eagle3 head of hidden 4096 with a 32,000-token
    draft vocabulary, a five-layer DFlash draft and a MiMo-style MTP layer (``bench/random_models.py``),
    ``refresh.distill``'s defaults (max_tokens 8192, micro_batch_tokens 4096), 4 rollouts of 512 +
    1536 random tokens. Then the same rows' memory estimated on the CPU (``bench --suite distill``'s
    estimate: fake tensors and torch's MemTracker, nothing allocated; part ``qwen3-8b est``), so
    measured and estimated state, transient and peak print in one table.

(c) ``forwards``: forward times of the target and of each drafter's forward at the shapes they have
    beside Qwen3-8B (``nemo_rl_specdec/tools/time_forward.py``, one process per shape, each within its time budget):
    the Qwen3-8B target over requests x tokens per request x context, one token per request for the
    Eagle3 head, the MTP layer and the Qwen3-0.6B draft model, a block of 8 or 16 per request for the
    DFlash draft. Each shape's samples go to ``forward_<shape>.json`` beside ``--out``; the cost
    model fits this card's roofline and each drafter's fixed time per forward from them
    (``nemo-rl-specdec fit-hardware``).

Prints one table (errors under it) and writes everything to ``--out`` (JSON). ``--device cpu
--skip-8b --forwards tiny`` (or ``--shape small``) runs it without a GPU, to check the tool itself.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

TINY_CELLS = {  # drafter: (its checkpoint, the policy it drafts for), bundled assets
    "draft_model": ("tiny/draft", "tiny/policy"),
    "eagle3": ("tiny/eagle3", "tiny/policy"),
    "dflash": ("tiny/dflash", "tiny/policy"),
    "mtp": ("tiny_mtp", "tiny_mtp"),
}
DTYPES = ("float32", "bfloat16")
DRAFTERS_8B = ("draft_model", "eagle3", "dflash", "mtp")
# part (c), per `nemo_rl_specdec/tools/time_forward.py` shape: contexts, requests, tokens per request, time budget (s)
FORWARDS = {
    "qwen3-8b": ("1024,4096,16384", "1,4,16,64,256", "1,2,4,8", 90),
    "eagle3-qwen3-8b": ("1024,4096,16384", "1,4,16,64,256", "1", 25),
    "mtp-qwen3-8b": ("1024,4096,16384", "1,4,16,64,256", "1", 20),
    "dflash-qwen3-8b": ("1024,4096,16384", "1,4,16,64,256", "8,16", 25),
    "qwen3-0.6b": ("1024,4096,16384", "1,4,16,64,256", "1", 25),
    "tiny": ("64,256", "1,4", "1,2", 30),   # checks the tool on a CPU
}


def log(msg: str) -> None:
    print(f"[device_check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def environment(device: str) -> dict:
    import torch
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "device": device, "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpu_memory_bytes"] = torch.cuda.get_device_properties(0).total_memory
    return env


def tiny_cell(drafter: str, dtype: str, device: str, steps: int = 2) -> dict:
    """One distiller on the bundled tiny assets, `steps` steps towards the bundled policy in `dtype`."""
    import torch
    from transformers import AutoModelForCausalLM

    from nemo_rl_specdec.bench.distill import error_text, make_distiller, random_rollouts
    from nemo_rl_specdec.resources import asset_path

    ckpt, policy = (str(asset_path(*p.split("/"))) for p in TINY_CELLS[drafter])
    cell = {"part": "tiny", "drafter": drafter, "teacher_dtype": dtype, "device": device, "status": "failed",
            "error": None, "steps": []}
    phase = "teacher"
    try:
        teacher = AutoModelForCausalLM.from_pretrained(policy, dtype=getattr(torch, dtype)).to(device).eval()
        phase = "distiller"
        d = make_distiller(drafter, ckpt, device=device, seed=0, micro_batch_tokens=96, max_tokens=None, epochs=2)
        phase = "step"
        rollouts = random_rollouts([(8, 24)] * 6, teacher.config.vocab_size, seed=0)
        for _ in range(steps):
            s = d.step(teacher, rollouts)
            cell["steps"].append({k: s.get(k) for k in ("kl_first", "kl_last", "trained_positions", "seconds",
                                                         "top1_agreement_after")})
    except Exception as e:  # noqa: BLE001 - the cell records it; the check goes on
        cell["error"] = f"{phase}: {error_text(e)}"
        return cell
    finite = all(math.isfinite(s["kl_first"]) and math.isfinite(s["kl_last"]) for s in cell["steps"])
    cell["status"] = "ok" if finite else "failed"
    cell["error"] = None if finite else "step: a KL is not finite"
    cell["step_s"] = statistics.median(s["seconds"] for s in cell["steps"])
    cell["kl_last"] = cell["steps"][-1]["kl_last"]
    return cell


def run_tiny(device: str, drafters=tuple(TINY_CELLS), dtypes=DTYPES) -> list[dict]:
    cells = []
    for drafter in drafters:
        for dtype in dtypes:
            cell = tiny_cell(drafter, dtype, device)
            log(f"tiny {drafter} {dtype}: {cell['status']}" + (f" ({cell['error']})" if cell["error"] else ""))
            cells.append(cell)
    return cells


def options_8b(args) -> dict:
    """The bench suite's options for part (b)."""
    from nemo_rl_specdec.bench.distill import DEFAULTS

    return {**DEFAULTS, "drafters": list(args.drafters_8b), "vocab_size": args.vocab_size, "tokens": args.tokens,
            "teacher_dtype": args.teacher_dtype, "steps": args.steps, "warmup": args.warmup,
            "timeout_s": args.timeout_s, "temperature": 1.0}


def shapes_8b(args) -> dict:
    """Part (b)'s shapes: Qwen3-8B's, or the bench's small ones."""
    from nemo_rl_specdec.bench.random_models import qwen3_8b_shapes, small_shapes

    return qwen3_8b_shapes(args.vocab_size) if args.shape == "qwen3-8b" else small_shapes(args.vocab_size)


def run_8b(args, device: str, shapes: dict, on_row=None, memory: str = "measured") -> list[dict]:
    """Part (b): the bench's rows at `shapes`, each marked with its part and handed to `on_row` as it
    comes; `memory` ``estimated``: the same drafters' memory estimated on the CPU under fake tensors
    (train/estimate.py), nothing allocated, to print beside what the device measured."""
    from nemo_rl_specdec.bench.distill import measure_drafters

    o = {**options_8b(args), "memory": memory}
    if memory == "estimated":
        device = "cpu"
    log(f"{args.shape} shapes on {device} ({memory}): {o['drafters']}, {o['tokens']} tokens, teacher "
        f"{o['teacher_dtype']}")

    def mark(row: dict) -> None:
        row["part"] = args.shape if memory == "measured" else f"{args.shape} est"
        if on_row is not None:
            on_row(row)

    with tempfile.TemporaryDirectory(prefix="specdec-device-check-") as root:
        return measure_drafters(o, shapes, device, root, on_row=mark)


def run_forwards(shapes: list, device: str, out_dir: Path, reps: int) -> list[dict]:
    """Part (c): `nemo_rl_specdec/tools/time_forward.py` once per shape, each in a process of its own (a model and its
    KV buffers are gone with it); one summary row per shape."""
    import subprocess

    rows = []
    for shape in shapes:
        contexts, requests, per_request, budget = FORWARDS[shape]
        path = out_dir / f"forward_{shape}.json"
        cmd = [sys.executable, "-m", "nemo_rl_specdec.tools.time_forward", "--shape", shape, "--device", device,
               "--out", str(path), "--contexts", contexts, "--requests", requests, "--per-request", per_request,
               "--budget-s", str(budget), "--reps", str(reps)] + (["--max-tokens", "32"] if shape == "tiny" else [])
        row = {"part": "forwards", "drafter": shape, "teacher_dtype": "-", "status": "failed", "error": None,
               "file": str(path)}
        log(f"forwards {shape}: {budget} s budget")
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=budget + 180)
            if res.returncode != 0:
                err = res.stderr.strip()
                row["error"] = err.splitlines()[-1][:300] if err else f"rc {res.returncode}"
        except subprocess.TimeoutExpired:
            row["error"] = f"no end within {budget + 180} s"
        if path.is_file():
            samples = json.loads(path.read_text())["samples"]
            row["samples"] = len(samples)
            if samples and row["error"] is None:
                row["status"] = "ok"
                one = [x["seconds"] for x in samples if x["tokens"] == 1]
                row["step_s_min"] = min(x["seconds"] for x in samples)
                row["step_s"] = statistics.median(one) if one else None
                row["step_s_max"] = max(x["seconds"] for x in samples)
        log(f"forwards {shape}: {row['status']}, {row.get('samples', 0)} samples"
            + (f" ({row['error']})" if row["error"] else ""))
        rows.append(row)
    return rows


# (header, key, scale)
COLUMNS = [("part", "part", None), ("drafter", "drafter", None), ("teacher", "teacher_dtype", None),
           ("status", "status", None), ("memory", "memory", None), ("step s", "step_s", 1),
           ("min", "step_s_min", 1), ("max", "step_s_max", 1),
           ("teacher GB", "teacher_bytes", 1e9), ("state GB", "state_bytes", 1e9),
           ("transient GB", "transient_bytes", 1e9), ("peak GB", "peak_bytes", 1e9)]


def format_table(rows: list[dict]) -> str:
    """A plain-text table of tiny cells and measured rows ('-' where a row has no value), then each
    error on a line of its own."""
    cells = [[h for h, _, _ in COLUMNS]]
    for r in rows:
        line = []
        for _, k, scale in COLUMNS:
            v = r.get(k)
            line.append("-" if v is None else (f"{v / scale:.3f}" if scale else str(v)))
        cells.append(line)
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    out = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells]
    out.insert(1, "  ".join("-" * w for w in widths))
    out += [f"{r['part']} {r['drafter']} {r['teacher_dtype']}: {r['error']}" for r in rows if r.get("error")]
    return "\n".join(out)


def imported_serving_stack() -> list[str]:
    """The vLLM / Ray modules this process imported (the check must import none)."""
    return sorted(m for m in sys.modules if m.split(".")[0] in ("vllm", "ray"))


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--out", default=None, help="write the JSON here")
    ap.add_argument("--skip-tiny", action="store_true", help="leave out part (a)")
    ap.add_argument("--skip-8b", action="store_true", help="leave out part (b)")
    ap.add_argument("--skip-estimate", action="store_true",
                    help="leave out part (b)'s memory estimate (fake tensors on the CPU, beside the measured rows)")
    ap.add_argument("--shape", choices=("qwen3-8b", "small"), default="qwen3-8b",
                    help="part (b)'s shapes: qwen3-8b, or the bench's small ones (to check the tool on a CPU)")
    ap.add_argument("--drafters-8b", type=lambda s: [d for d in s.split(",") if d], default=list(DRAFTERS_8B),
                    help="comma-separated drafters of part (b)")
    ap.add_argument("--vocab-size", type=int, default=151936)
    ap.add_argument("--tokens", type=int, default=8192, help="rollout tokens of part (b), 4 rollouts")
    ap.add_argument("--teacher-dtype", choices=("bfloat16", "float32"), default="bfloat16")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per drafter in part (b)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps before them")
    ap.add_argument("--timeout-s", type=float, default=240, help="per drafter of part (b)")
    ap.add_argument("--forwards", type=lambda s: [d for d in s.split(",") if d],
                    default=[k for k in FORWARDS if k != "tiny"], help="comma-separated shapes of part (c)")
    ap.add_argument("--skip-forwards", action="store_true", help="leave out part (c)")
    ap.add_argument("--forward-reps", type=int, default=10, help="timed runs per forward in part (c)")
    args = ap.parse_args(argv)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the MTP policy's load report lists every MTP tensor transformers skips
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            ap.error("--device cuda: torch sees no GPU (use --device cpu to check the tool itself)")
    from nemo_rl_specdec.bench.random_models import DRAFTERS

    bad = [d for d in args.drafters_8b if d not in DRAFTERS]
    if bad:
        ap.error(f"--drafters-8b: got {bad}; allowed: {list(DRAFTERS)}")
    bad = [d for d in args.forwards if d not in FORWARDS]
    if bad:
        ap.error(f"--forwards: got {bad}; allowed: {list(FORWARDS)}")
    for name, value, lo in (("--tokens", args.tokens, 8), ("--vocab-size", args.vocab_size, 8),
                            ("--steps", args.steps, 1), ("--warmup", args.warmup, 0)):
        if value < lo:
            ap.error(f"{name}: got {value}; allowed: >= {lo}")

    report: dict = {"environment": environment(args.device), "tiny": [], "forwards": [], "8b": [], "shapes": None}

    def save() -> None:  # after each part and each measured drafter: a run cut short keeps what it did
        report["environment"]["imported_vllm_or_ray"] = imported_serving_stack()
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(report, indent=2, default=str))

    if not args.skip_tiny:
        report["tiny"] = run_tiny(args.device)
        save()
    if not args.skip_forwards:
        out_dir = Path(args.out).parent if args.out else Path.cwd()
        out_dir.mkdir(parents=True, exist_ok=True)
        report["forwards"] = run_forwards(args.forwards, args.device, out_dir, args.forward_reps)
        save()
    if not args.skip_8b:
        report["shapes"] = shapes_8b(args)
        run_8b(args, args.device, report["shapes"], on_row=lambda row: (report["8b"].append(row), save()))
        if not args.skip_estimate:
            run_8b(args, args.device, report["shapes"], memory="estimated",
                   on_row=lambda row: (report["8b"].append(row), save()))
    save()
    env = report["environment"]
    print(f"device check: {env.get('gpu', args.device)}, torch {env['torch']}, transformers {env['transformers']}")
    print(format_table(report["tiny"] + report["forwards"] + report["8b"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
