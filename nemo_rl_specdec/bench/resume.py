"""Bench suite `resume`: what the drafter's state costs in NeMo-RL's checkpoint, per drafter at
Qwen3-8B shapes: its size, and the time to save and restore it through the real code path.

    nemo-rl-specdec bench configs/tiny_cpu.yaml --suite resume --json OUT.json [bench.resume.KEY=VALUE ...]

No engine, no NeMo-RL. Rows (``drafters``, all by default):

- ``eagle3`` online: an Eagle3 head of Qwen3-8B's width (``bench/random_models.py``
  ``qwen3_8b_shapes``) with its default draft vocabulary (32,000 of 151,936; ``draft_vocab_size``);
- ``draft_model`` online: a Qwen3-0.6B-shaped draft model (tied embeddings);
- ``das``: the DAS rollout window of one engine at a Qwen3-8B GRPO workload (the run file's
  ``suffix`` block: ``window_steps``, ``scope``, ``max_tree_depth``, ``max_memory_mb``), and
  ``das <engines> engines``: the checkpoint's whole ``engines.pt``, one window per engine.

**Size.** An online drafter's part (``distiller.pt``: ``Distiller.checkpoint_state``) is counted
exactly from the shapes: the distiller is built as NeMo-RL's policy workers build it
(``bench/distill.py`` ``make_distiller``) under ``train.estimate.fake_tensors()`` from config-only
checkpoints (``write_checkpoints(..., device="meta")``), nothing allocated; its bytes are the
module's state (parameters and persistent buffers as ``checkpoint_state`` takes them: a tied weight,
the draft model's embedding and ``lm_head``, once) plus the AdamW state
AdamW keeps per trainable parameter (``exp_avg`` and ``exp_avg_sq`` of the parameter's shape and
dtype, and a scalar ``step``), which assumes every trainable parameter gets a gradient in a step.
The DAS window's size depends on the rollouts' content (the store keeps what its memory cap holds,
measured in suffix-tree bytes), so it comes from a real store: the bytes of its saved file per
stored token.

**Time.** Through the real code path, on this machine: ``adapter.checkpoint.write_state`` (each part
streamed by ``torch.save`` into a file, fsync, SHA-256, the manifest, the directory renamed whole)
and ``read_state(..., load=True)`` (sizes, SHA-256, ``torch.load``), median of ``repeats``, each into
a fresh directory under ``dir`` (the system's temporary directory by default). With ``cold`` (the
default) the state's files are dropped from the page cache (``posix_fadvise DONTNEED``) before the
read, so the restore reads the disk (a virtual machine's host may still cache it). Phases:

- save = export + write: export is what the live object hands the checkpoint (distiller: the CPU
  copy of every tensor ``checkpoint_state`` takes; DAS: the proposer's state with ``store.export()``,
  through ``drafter_state.to_bytes``/``from_bytes`` as the engine's RPC carries it);
- restore = read + install: install is what takes the loaded state in (distiller: each module
  tensor copied into the live one, as ``load_state_dict`` does; AdamW's state is adopted as
  loaded; DAS: the RPC's bytes and ``RolloutStore.restore``, which rebuilds the suffix trees).

An online drafter's full state does not fit this machine (several GB, and AdamW triples it), so it
is measured on a real state of its largest tensors (each with its two AdamW moments) that fit
``measure_mb`` together, real random values in the ``checkpoint_state`` layout, and reported per
GiB; the full-size time is that rate times the full size, labelled ``projected`` (``measured``
where the whole state fits the cap). DAS: a real ``RolloutStore`` filled over ``window_steps``
policy versions with the refresh suite's synthetic GRPO rollouts (``bench/refresh.py``: siblings
sharing long spans) of ``response_tokens`` and ``prompt_tokens`` each, scaled down to about
``das_measure_tokens`` tokens offered; timed per million stored tokens. Where the memory cap cut
the measured store, the full workload is cut to the same cap, and the full-size row is the
measured one (``measured (cap binds)``); otherwise the full window (``window_steps`` x
``rollouts_per_step`` rollouts, within the cap at the measured bytes per token) is projected. The
``das <engines> engines`` row projects one engine's figures to the checkpoint: bytes, write and read
times ``engines`` times (the driver writes and reads ``engines.pt`` alone), export and install
once (every engine does its own at the same time).

Run-file knobs, under ``bench.resume`` (all optional, bounds in brackets): ``drafters`` (all three),
``vocab_size`` (151936 [8, 2**20]), ``draft_vocab_size`` (null: the head's default, 32,000 for
larger vocabularies [1, vocab_size]), ``measure_mb`` (1024 MiB of tensors measured per online
drafter [1, 8192]; the process holds about twice that), ``repeats`` (3 [1, 20]), ``cold`` (true),
``dir`` (null: the temporary directory), ``rollouts_per_step`` (2048 [1, 65536]: 512 prompts x 4
samples), ``problems`` (512 [1, 65536]; divides ``rollouts_per_step``), ``response_tokens`` (8000
[1, 131072]: mean response length), ``prompt_tokens`` (512 [0, 131072]), ``engines`` (32 [1, 1024]:
Qwen3-8B at one GPU per engine on 32 GPUs), ``das_measure_tokens`` (2,000,000 [1000, 50,000,000];
the store's trees take a few hundred bytes per token), ``seed`` (0), ``shape`` (qwen3-8b | small: the
distiller suite's small shapes, hidden 256 x 4 layers, for tests).
"""
from __future__ import annotations

import functools
import math
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from nemo_rl_specdec.bench import names_option, option, say, suite_options
from nemo_rl_specdec.bench.distill import error_text
from nemo_rl_specdec.config.run import ConfigError

# what every result dict carries (the dispatcher checks it; this suite measures no speedup)
REQUIRED = ("name", "drafter", "status", "error", "carried", "state_bytes", "state_basis", "measured_bytes",
            "save_s", "restore_s", "unit", "save_s_per_unit", "restore_s_per_unit", "save_s_full",
            "restore_s_full", "full_basis")
DRAFTERS = ("eagle3", "draft_model", "das")
DEFAULTS = {"drafters": list(DRAFTERS), "vocab_size": 151936, "draft_vocab_size": None, "measure_mb": 1024,
            "repeats": 3, "cold": True, "dir": None, "rollouts_per_step": 2048, "problems": 512,
            "response_tokens": 8000, "prompt_tokens": 512, "engines": 32, "das_measure_tokens": 2_000_000, "seed": 0,
            "shape": "qwen3-8b"}
SHAPES = ("qwen3-8b", "small")
# integer settings: (lowest, highest); beyond the highest a run does not fit this machine or an hour
INTS = {"vocab_size": (8, 1 << 20), "measure_mb": (1, 8192), "repeats": (1, 20), "rollouts_per_step": (1, 65536),
        "problems": (1, 65536), "response_tokens": (1, 131072), "prompt_tokens": (0, 131072), "engines": (1, 1024),
        "das_measure_tokens": (1000, 50_000_000), "seed": (0, 2**32 - 1)}
GiB = float(1 << 30)
MEASURED, PROJECTED, CAP_BOUND = "measured", "projected", "measured (cap binds)"

_say = functools.partial(say, "resume")


def options(cfg) -> dict:
    """The suite's settings from ``bench.resume`` (defaults above) and the run's ``suffix`` block;
    ConfigError names a bad key."""
    b = suite_options(cfg, "resume", f"a mapping of {sorted(DEFAULTS)}", known=DEFAULTS)
    o = {**DEFAULTS, **b}
    for k, (lo, hi) in INTS.items():
        o[k] = option(o, "resume", k, None, lo, hi)
    o["drafters"] = list(dict.fromkeys(names_option(o, "resume", "drafters", DRAFTERS)))
    if o["draft_vocab_size"] is not None:
        o["draft_vocab_size"] = option(o, "resume", "draft_vocab_size", None, 1, o["vocab_size"])
    if o["shape"] not in SHAPES:
        raise ConfigError(f"bench.resume.shape: got {o['shape']!r}; allowed: {' | '.join(SHAPES)}")
    if not isinstance(o["cold"], bool):
        raise ConfigError(f"bench.resume.cold: got {o['cold']!r}; allowed: true | false")
    if o["dir"] is not None and not (isinstance(o["dir"], str) and Path(o["dir"]).is_dir()):
        raise ConfigError(f"bench.resume.dir: got {o['dir']!r}; allowed: an existing directory, or null (the "
                          "system's temporary directory)")
    if o["rollouts_per_step"] % o["problems"]:
        raise ConfigError(f"bench.resume.rollouts_per_step: got {o['rollouts_per_step']} for {o['problems']} "
                          "problems; allowed: a multiple of bench.resume.problems (every prompt has the same "
                          "number of samples)")
    s = cfg.spec.suffix if getattr(cfg, "spec", None) is not None else None
    if s is None:
        from nemo_rl_specdec.drafters.suffix import SuffixConfig

        s = SuffixConfig()
    o["suffix"] = {"window_steps": int(s.window_steps), "scope": s.scope, "max_tree_depth": int(s.max_tree_depth),
                   "max_memory_mb": float(s.max_memory_mb)}
    return o


# --------------------------------------------------------------------------- the real code path
def drop_cache(state_dir: Path) -> None:
    """The state's files out of the page cache (written and fsynced: clean pages), so the next read
    reads the disk; a no-op where the OS has no posix_fadvise."""
    if not hasattr(os, "posix_fadvise"):
        return
    for p in Path(state_dir).iterdir():
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed_round_trip(export, install, spec, manifest: dict, root: Path, cold: bool) -> dict:
    """One save and restore through adapter/checkpoint.py: `export()` -> the parts, `write_state` into
    a fresh directory under `root`, (`cold`: out of the page cache), `read_state(load=True)`, then
    `install(parts)`. Returns each phase's seconds and the state directory's bytes."""
    from nemo_rl_specdec.adapter import checkpoint

    ckpt = Path(tempfile.mkdtemp(prefix="step_", dir=root))
    try:
        t0 = time.perf_counter()
        parts = export()
        t1 = time.perf_counter()
        state_dir = checkpoint.write_state(ckpt, manifest, parts)
        t2 = time.perf_counter()
        del parts
        file_bytes = sum(p.stat().st_size for p in state_dir.iterdir())
        if cold:
            drop_cache(state_dir)
        t3 = time.perf_counter()
        loaded = checkpoint.read_state(ckpt, spec, load=True)
        t4 = time.perf_counter()
        install(loaded["parts"])
        t5 = time.perf_counter()
        del loaded
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)
    return {"export_s": t1 - t0, "write_s": t2 - t1, "read_s": t4 - t3, "install_s": t5 - t4,
            "file_bytes": file_bytes}


def medians(runs: list[dict]) -> dict:
    """Median of each phase over the repeats, save and restore as the medians of their sums, and the
    spread of each (min, max)."""
    out = {k: statistics.median(r[k] for r in runs) for k in ("export_s", "write_s", "read_s", "install_s")}
    saves = [r["export_s"] + r["write_s"] for r in runs]
    restores = [r["read_s"] + r["install_s"] for r in runs]
    out.update(save_s=statistics.median(saves), save_s_min=min(saves), save_s_max=max(saves),
               restore_s=statistics.median(restores), restore_s_min=min(restores), restore_s_max=max(restores),
               file_bytes=runs[-1]["file_bytes"], repeats=len(runs))
    return out


def engine_entry(proposer: dict | None) -> dict:
    """One engine's entry of `engines.pt` (adapter/workers.py `_specdec_saved` of the worker
    extension's `specdec_export_state`): the actor's versions and its worker's state."""
    return {"version": 1, "pending": None,
            "worker": {"state": {"policy_version": 1, "drafter_version": 1, "drafter_built_from": 1, "updates": 1,
                                 "disabled": False, "disabled_reason": None}, "proposer": proposer}}


# --------------------------------------------------------------------------- online drafters
def adamw_step_bytes() -> int:
    """Bytes of AdamW's per-parameter `step` (a scalar tensor of torch's scalar dtype)."""
    import torch

    try:
        from torch.optim.optimizer import _get_scalar_dtype

        return torch.empty((), dtype=_get_scalar_dtype()).element_size()
    except ImportError:  # an older torch: float32 steps
        return 4


def layout(distiller) -> dict:
    """A distiller's checkpoint state by shapes: every tensor of its module's state as
    `Distiller.checkpoint_state` saves it (a tied weight once, whatever its names), with its index
    among the optimizer's parameters where it is a trainable parameter's first
    name, and the bytes of it and of AdamW's state. Works on fake tensors (nothing is read)."""
    params = list(distiller.module.parameters())
    index = {id(p): i for i, p in enumerate(params)}
    seen: set = set()
    tensors = []
    for name, t in distiller.module.state_dict(keep_vars=True).items():
        first = id(t) not in seen
        seen.add(id(t))
        trainable = first and id(t) in index and t.requires_grad
        tensors.append({"name": name, "shape": tuple(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
                        "bytes": t.numel() * t.element_size(), "param": index.get(id(t)) if trainable else None,
                        "tied": not first})
    step_b = adamw_step_bytes()
    module_b = sum(t["bytes"] for t in tensors if not t["tied"])
    adam_b = sum(2 * t["bytes"] + step_b for t in tensors if t["param"] is not None)
    group = {k: v for k, v in distiller.opt.state_dict()["param_groups"][0].items() if k != "params"}
    return {"kind": distiller.kind, "vocab_size": int(distiller.vocab_size),
            "draft_vocab_size": distiller._draft_vocab(), "tensors": tensors, "module_bytes": module_b,
            "tied_bytes": sum(t["bytes"] for t in tensors if t["tied"]),
            "adamw_bytes": adam_b, "state_bytes": module_b + adam_b, "step_bytes": step_b,
            "params": sum(math.prod(t["shape"]) for t in tensors if t["param"] is not None),
            "param_group": group}


def shaped(distiller_name: str, o: dict, root) -> tuple:
    """(the drafter's `speculative_decoding` block, its layout) at Qwen3-8B shapes: config-only
    checkpoints under `root`, the distiller built under fake tensors."""
    from nemo_rl_specdec.bench.random_models import qwen3_8b_shapes, small_shapes

    shapes = qwen3_8b_shapes(o["vocab_size"]) if o["shape"] == "qwen3-8b" else small_shapes(o["vocab_size"])
    if o.get("draft_vocab_size") is not None:
        shapes["eagle3"]["draft_vocab_size"] = int(o["draft_vocab_size"])
    return distiller_shaped(distiller_name, shapes, root, seed=o["seed"])


def distiller_shaped(drafter: str, shapes: dict, root, seed: int = 0) -> tuple:
    """`shaped` for any `shapes` (`bench/random_models.py`): (block, layout)."""
    from nemo_rl_specdec.bench.distill import distill_spec, make_distiller
    from nemo_rl_specdec.bench.random_models import write_checkpoints
    from nemo_rl_specdec.train.estimate import fake_tensors

    ckpts = write_checkpoints(shapes, root, drafters=[drafter], device="meta", seed=seed)
    model_dir = ckpts[drafter][1]
    with fake_tensors():
        distiller = make_distiller(drafter, model_dir, device="cpu", seed=seed)
        lay = layout(distiller)
    spec = distill_spec(drafter, model_dir, micro_batch_tokens=distiller.micro_batch_tokens,
                        max_tokens=distiller.max_tokens, epochs=distiller.epochs)
    return spec, lay


def pick(tensors: list[dict], cap: int, step_bytes: int) -> list[dict]:
    """The largest tensors whose state (a trainable one with its two AdamW moments and step) fits
    `cap` bytes together, largest first; a tensor that no longer fits is passed over for smaller ones."""
    out, left = [], cap
    for t in sorted(tensors, key=lambda t: -t["bytes"]):
        cost = t["bytes"] * (3 if t["param"] is not None else 1) + (step_bytes if t["param"] is not None else 0)
        if cost <= left:
            out.append(t)
            left -= cost
    return out


def real_state(lay: dict, chosen: list[dict], seed: int = 0) -> dict:
    """A `Distiller.checkpoint_state` of the `chosen` tensors with random values: the module's
    tensors, AdamW's state of the trainable ones (their indices as the optimizer numbers them), the
    counters."""
    import torch

    from nemo_rl_specdec.train.estimate import tensor_nbytes

    g = torch.Generator().manual_seed(seed)
    module, state = {}, {}
    for t in chosen:
        dtype = getattr(torch, t["dtype"])
        if dtype.is_floating_point:
            module[t["name"]] = torch.randn(t["shape"], generator=g, dtype=dtype)
        elif dtype == torch.bool:
            module[t["name"]] = torch.rand(t["shape"], generator=g) < 0.2
        else:
            module[t["name"]] = torch.randint(0, 1 << 15, t["shape"], generator=g, dtype=dtype)
        if t["param"] is not None:
            state[t["param"]] = {"step": torch.tensor(7.0, dtype=torch.float32 if lay["step_bytes"] == 4 else None),
                                 "exp_avg": torch.randn(t["shape"], generator=g, dtype=dtype) * 1e-3,
                                 "exp_avg_sq": torch.rand(t["shape"], generator=g, dtype=dtype) * 1e-6}
    group = {**lay["param_group"], "params": sorted(state)}
    tensors = list(module.values()) + [v for s in state.values() for v in s.values()]
    return {"kind": lay["kind"], "vocab_size": lay["vocab_size"], "draft_vocab_size": lay["draft_vocab_size"],
            "module": module, "optimizer": {"state": state, "param_groups": [group]}, "steps": 7,
            "history": [{"kl_first": 1.0, "kl_last": 0.5, "tokens": 8192}] * 7, "_bytes": tensor_nbytes(tensors)}


def measure_online(spec, lay: dict, state: dict, o: dict, root: Path) -> dict:
    """`state` saved and restored `repeats` times through the real code path, as NeMo-RL's checkpoint
    carries an online drafter (`engines.pt` with the engines' versions, `distiller.pt` with rank 0's
    part: the distiller's state and the policy worker's counters)."""
    from nemo_rl_specdec.adapter import checkpoint

    live = state["module"]

    def cpu(x):
        if isinstance(x, dict):
            return {k: cpu(v) for k, v in x.items()}
        if isinstance(x, list):
            return [cpu(v) for v in x]
        return x.detach().to("cpu", copy=True) if hasattr(x, "detach") else x

    def export():
        saved = {k: v for k, v in state.items() if k != "_bytes"}
        return {checkpoint.ENGINES: [engine_entry(None)],
                checkpoint.DISTILLER: {"seq": 7, "steps": 7, "stats": {}, "distiller": cpu(saved)}}

    def install(parts):
        saved = parts[checkpoint.DISTILLER]["distiller"]["module"]
        for k, v in live.items():
            v.copy_(saved[k])

    manifest = {**checkpoint.expected(spec), "engines": 1, "saved_s": None, "vocab_size": lay["vocab_size"]}
    if lay["draft_vocab_size"] is not None:
        manifest["draft_vocab_size"] = int(lay["draft_vocab_size"])
    runs = [timed_round_trip(export, install, spec, manifest, root, o["cold"]) for _ in range(o["repeats"])]
    return medians(runs)


def online_row(drafter: str, o: dict, root: Path) -> dict:
    """One online drafter's row: its exact state size from the shapes, and the time measured on a
    real state of its largest tensors up to ``measure_mb``, per GiB and projected to the full size."""
    with tempfile.TemporaryDirectory(prefix=f"specdec-resume-{drafter}-", dir=root) as d:
        spec, lay = shaped(drafter, o, d)
        return online_row_from(drafter, spec, lay, o, root)


def online_row_from(drafter: str, spec, lay: dict, o: dict, root: Path) -> dict:
    from nemo_rl_specdec.bench import release_memory

    saved = [t for t in lay["tensors"] if not t["tied"]]  # a tied weight is saved once
    chosen = pick(saved, int(o["measure_mb"]) << 20, lay["step_bytes"])
    if not chosen:
        raise ConfigError(f"bench.resume.measure_mb: got {o['measure_mb']}; allowed: at least "
                          f"{math.ceil(min(3 * t['bytes'] for t in lay['tensors']) / 2**20)} for {drafter} (its "
                          "smallest tensor with its AdamW moments)")
    state = real_state(lay, chosen, seed=o["seed"])
    measured = state["_bytes"]
    full = lay["state_bytes"]
    whole = len(chosen) == len(saved)
    _say(f"{drafter}: state {full / GiB:.2f} GiB exact ({lay['params'] / 1e6:.1f}M trainable parameters + AdamW); "
         f"measuring {measured / GiB:.2f} GiB of it ({len(chosen)} of {len(saved)} tensors), "
         f"{o['repeats']} repeats{', cold reads' if o['cold'] else ''}")
    m = measure_online(spec, lay, state, o, Path(root))
    del state
    release_memory()
    scale = full / measured
    row = {"name": drafter, "drafter": drafter, "status": "ok", "error": None,
           "carried": f"{lay['params'] / 1e6:.1f}M params",
           "state_bytes": full, "state_basis": "exact", "module_bytes": lay["module_bytes"],
           "adamw_bytes": lay["adamw_bytes"], "tied_bytes": lay["tied_bytes"],
           "params": lay["params"], "tensors": len(lay["tensors"]),
           "vocab_size": lay["vocab_size"], "draft_vocab_size": lay["draft_vocab_size"],
           "measured_bytes": measured, "measured_tensors": len(chosen), **m,
           "unit": "GiB", "save_s_per_unit": m["save_s"] / (measured / GiB),
           "restore_s_per_unit": m["restore_s"] / (measured / GiB),
           "save_s_full": m["save_s"] * scale, "restore_s_full": m["restore_s"] * scale,
           "full_basis": MEASURED if whole else PROJECTED, "cold": o["cold"]}
    return row


# --------------------------------------------------------------------------- DAS
def das_spec(suffix: dict):
    """The `speculative_decoding` block of DAS with the run's suffix settings."""
    from nemo_rl_specdec.config.run import SpecDecConfig

    return SpecDecConfig.model_validate({"enabled": True, "drafter": "suffix", "suffix": {"backend": "das", **suffix}})


def das_workload(o: dict) -> dict:
    """The full window (`window_steps` versions of `rollouts_per_step` rollouts) and the scaled-down
    one measured: about `das_measure_tokens` tokens offered, whole prompts (`problems` scaled, the
    samples per prompt kept)."""
    s = o["suffix"]
    per_rollout = o["response_tokens"] + min(o["prompt_tokens"], s["max_tree_depth"] - 1)  # what an entry stores
    samples = o["rollouts_per_step"] // o["problems"]
    want = math.ceil(o["das_measure_tokens"] / (s["window_steps"] * per_rollout))
    problems = max(1, min(o["problems"], want // samples))
    return {"per_rollout": per_rollout, "samples": samples,
            "offered_tokens": s["window_steps"] * o["rollouts_per_step"] * per_rollout,
            "measured_rollouts": problems * samples, "measured_problems": problems}


def filled_store(o: dict, w: dict):
    """A real RolloutStore with the run's suffix settings, filled over `window_steps` policy versions
    with the refresh suite's synthetic rollouts of the measured workload."""
    from nemo_rl_specdec.bench.refresh import DEFAULTS as REFRESH, common_bank, step_records
    from nemo_rl_specdec.drafters.machinery.store import RolloutStore

    s = o["suffix"]
    store = RolloutStore(window_steps=s["window_steps"], scope=s["scope"], max_tree_depth=s["max_tree_depth"],
                         max_memory_bytes=s["max_memory_mb"] * 2**20)
    gen = {**REFRESH, "rollouts": w["measured_rollouts"], "problems": w["measured_problems"],
           "tokens": o["response_tokens"], "prompt_tokens": o["prompt_tokens"], "vocab": o["vocab_size"],
           "seed": o["seed"]}
    common = common_bank(gen)
    for step in range(1, s["window_steps"] + 1):
        store.rebuild(step_records(gen, step, 0, 1, common), step)
    return store


def das_rows(o: dict, root: Path) -> list[dict]:
    """The DAS window of one engine, measured on a real store and timed per million stored tokens,
    and the checkpoint's `engines.pt` for `engines` engines."""
    from nemo_rl_specdec.adapter import checkpoint
    from nemo_rl_specdec.bench import release_memory
    from nemo_rl_specdec.drafter_state import from_bytes, to_bytes
    from nemo_rl_specdec.drafters.machinery.calibration import AcceptanceCalibration
    from nemo_rl_specdec.drafters.machinery.step_judge import StepJudge
    from nemo_rl_specdec.drafters.machinery.store import RolloutStore

    s = o["suffix"]
    w = das_workload(o)
    spec = das_spec(s)
    _say(f"das: filling a store ({s['scope']}, depth {s['max_tree_depth']}, cap {s['max_memory_mb']:g} MB) over "
         f"{s['window_steps']} versions of {w['measured_rollouts']} rollouts of {w['per_rollout']} stored tokens")
    store = filled_store(o, w)
    st = store.stats()
    tokens, entries, cut = int(st["tokens"]), int(st["entries"]), store.evicted_memory > 0
    calibration, judge = AcceptanceCalibration(), StepJudge("DAS", {}, adaptive=True, auto_disable=True)

    def export():
        proposer = {"version": s["window_steps"], "staged_version": None, "depth": s["max_tree_depth"],
                    "store": store.export(), "calibration": calibration.state_dict(), "judge": judge.state_dict()}
        entry = engine_entry(None)
        entry["worker"] = from_bytes(to_bytes({**entry["worker"], "proposer": proposer}))  # the engine's RPC
        return {checkpoint.ENGINES: [entry]}

    def install(parts):
        saved = parts[checkpoint.ENGINES][0]["worker"]
        again = from_bytes(to_bytes(saved))  # the driver's RPC to the engine
        fresh = RolloutStore(window_steps=s["window_steps"], scope=s["scope"], max_tree_depth=s["max_tree_depth"],
                             max_memory_bytes=s["max_memory_mb"] * 2**20)
        kept = fresh.restore(again["proposer"]["store"])
        if kept != entries:
            raise RuntimeError(f"das: the restored store holds {kept} entries, {entries} were saved")

    manifest = {**checkpoint.expected(spec), "engines": 1, "saved_s": None}
    _say(f"das: {entries} rollouts, {tokens} tokens stored ({st['bytes'] / 2**20:.0f} MB of trees"
         f"{', cut by the cap' if cut else ''}); {o['repeats']} repeats{', cold reads' if o['cold'] else ''}")
    m = medians([timed_round_trip(export, install, spec, manifest, root, o["cold"]) for _ in range(o["repeats"])])
    tree_bytes = int(st["bytes"])
    store = None  # the trees freed before the next drafter
    release_memory()
    cap_tokens = s["max_memory_mb"] * 2**20 / (tree_bytes / tokens) if tokens and tree_bytes else float("inf")
    if cut:
        full_tokens, basis = tokens, CAP_BOUND
    else:
        full_tokens = int(min(w["offered_tokens"], cap_tokens))
        basis = MEASURED if full_tokens == tokens else PROJECTED
    per_m = tokens / 1e6
    scale = full_tokens / tokens if tokens else 1.0
    one = {"name": "das 1 engine", "drafter": "das", "status": "ok", "error": None,
           "carried": f"{full_tokens / 1e6:.2f}M tokens",
           "state_bytes": m["file_bytes"] * scale, "state_basis": MEASURED if scale == 1 else PROJECTED,
           "measured_bytes": m["file_bytes"], "measured_tokens": tokens, "measured_rollouts": entries,
           "tree_bytes": tree_bytes, "cut_by_cap": cut, "offered_tokens": w["offered_tokens"],
           "offered_tokens_measured": s["window_steps"] * w["measured_rollouts"] * w["per_rollout"],
           "full_tokens": full_tokens, "suffix": dict(s), **m,
           "unit": "M tokens", "save_s_per_unit": m["save_s"] / per_m if per_m else None,
           "restore_s_per_unit": m["restore_s"] / per_m if per_m else None,
           "save_s_full": m["save_s"] * scale, "restore_s_full": m["restore_s"] * scale, "full_basis": basis,
           "cold": o["cold"]}
    e = o["engines"]
    save_e = (m["export_s"] + e * m["write_s"]) * scale
    restore_e = (e * m["read_s"] + m["install_s"]) * scale
    total = {**{k: one[k] for k in ("drafter", "status", "error", "unit", "cold")},
             "name": f"das {e} engines", "carried": f"{e} x {full_tokens / 1e6:.2f}M tokens",
             "engines": e, "state_bytes": one["state_bytes"] * e,
             "state_basis": one["state_basis"] if e == 1 else PROJECTED,
             "measured_bytes": m["file_bytes"], "save_s": None, "restore_s": None,
             "save_s_per_unit": None, "restore_s_per_unit": None, "save_s_full": save_e, "restore_s_full": restore_e,
             "full_basis": basis if e == 1 else PROJECTED}
    return [one, total]


# --------------------------------------------------------------------------- the suite
def failed_row(drafter: str, error: str) -> dict:
    return {"name": drafter, "drafter": drafter, "status": "failed", "error": error,
            **{k: None for k in REQUIRED if k not in ("name", "drafter", "status", "error")}}


def measure_all(o: dict, root: Path) -> list[dict]:
    """Every drafter of ``o['drafters']``: its rows, or a failed row with the error (a
    misconfiguration, ConfigError, ends the suite)."""
    rows = []
    for d in o["drafters"]:
        try:
            rows.extend(das_rows(o, root) if d == "das" else [online_row(d, o, root)])
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 - the row records it; the suite goes on with the next drafter
            rows.append(failed_row(d, error_text(e)))
            _say(f"{d}: FAILED {rows[-1]['error']}")
    return rows


# (header, key, scale): GB columns are bytes / 1e9
TABLE = [("row", "name", None), ("carried", "carried", None), ("state GB", "state_bytes", 1e9),
         ("size is", "state_basis", None), ("measured GB", "measured_bytes", 1e9), ("save s", "save_s", 1),
         ("restore s", "restore_s", 1), ("per", "unit", None), ("save s/per", "save_s_per_unit", 1),
         ("restore s/per", "restore_s_per_unit", 1), ("full save s", "save_s_full", 1),
         ("full restore s", "restore_s_full", 1), ("full time is", "full_basis", None)]


def table_rows(results: list[dict]) -> list[dict]:
    return [{h: (r.get(k) if scale is None or r.get(k) is None else float(r[k]) / scale) for h, k, scale in TABLE}
            for r in results]


def run(cfg, args) -> list:
    from nemo_rl_specdec.bench import print_table

    o = options(cfg)
    base = Path(o["dir"]) if o["dir"] else Path(tempfile.gettempdir())
    _say(f"{o['drafters']}: vocabulary {o['vocab_size']}, up to {o['measure_mb']} MiB measured per online drafter, "
         f"DAS {o['suffix']} at {o['rollouts_per_step']} rollouts x {o['response_tokens']} tokens per step, "
         f"{o['engines']} engines; files under {base}")
    with tempfile.TemporaryDirectory(prefix="specdec-resume-", dir=base) as root:
        results = measure_all(o, Path(root))
    for r in results:
        r["options"] = {k: v for k, v in o.items() if k != "drafters"}
    print_table(table_rows(results), [h for h, _, _ in TABLE])
    for r in results:
        if r.get("error"):
            print(f"{r['name']}: {r['error']}")
    return results
