"""Our marker in NeMo-RL's checkpoints, and the resume check that reads it.

NeMo-RL saves a checkpoint as `checkpointing.checkpoint_dir/step_N/` (its `CheckpointManager`:
`init_tmp_checkpoint` makes `tmp_step_N/` with `training_info.json`, GRPO writes the policy and the
dataloader state into it, and the finalisation renames it `step_N`). At setup, `grpo.setup`
resumes from the `step_N` with the highest N in that directory, whatever `checkpointing.enabled`
says.

- `wrap_init_tmp_checkpoint` (installed by `run_grpo.install`, undone with the rest): every
  checkpoint NeMo-RL starts gets `speculative_decoding.json` (`MARKER`), the drafter the run drafts
  with (`identity`), before GRPO writes anything else there.
- `check_resume` (run by the launcher's `prepare()`, before NeMo-RL is imported): a run with the
  block that would resume from a checkpoint written without it (no marker), or with another
  drafter, is refused with one error naming the checkpoint, what it was written with, what the run
  asks for, and how to start fresh.

What a resumed run continues and what starts cold is in docs/nemo_rl.md ("Checkpoint and resume").
"""
from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nemo_rl_specdec.config import BLOCK_PATH, ConfigError
from nemo_rl_specdec.drafters.base import Declared, VllmMapping
from nemo_rl_specdec.drafters.registry import drafter as drafter_of

MARKER = "speculative_decoding.json"
FORMAT = "nemo-rl-specdec/checkpoint"
VERSION = 1
DIR_KEY = "checkpointing.checkpoint_dir"
_STEP_DIR = re.compile(r"step_(\d+)")


def identity(spec: Any) -> dict:
    """What makes one drafter's saved state another's: the drafter, its backend (suffix) and its own
    checkpoint (draft_model, eagle3, dflash)."""
    out: dict = {"drafter": spec.drafter}
    backend = getattr(drafter_of(spec, VllmMapping).settings(spec), "backend", None)
    if backend is not None:
        out["backend"] = str(backend)
    ckpt = drafter_of(spec, Declared).checkpoint(spec)
    if ckpt is not None:
        out["model"] = str(ckpt)
    return out


def describe(ident: dict) -> str:
    extra = ", ".join(f"{k} {ident[k]}" for k in ("backend", "model") if k in ident)
    return f"drafter={ident.get('drafter')!r}" + (f" ({extra})" if extra else "")


def write_marker(checkpoint_path: Any, spec: Any) -> Path:
    path = Path(checkpoint_path) / MARKER
    path.write_text(json.dumps({"format": FORMAT, "version": VERSION, **identity(spec)}, indent=1))
    return path


def read_marker(checkpoint_path: Any) -> dict | None:
    """The marker of a checkpoint, or None when it has none; ConfigError when it is not ours or unreadable."""
    path = Path(checkpoint_path) / MARKER
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{DIR_KEY}: {path} is not readable JSON ({e}); "
                          f"{fresh_hint(Path(checkpoint_path))}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        raise ConfigError(f"{DIR_KEY}: {path} is not a {FORMAT} version {VERSION} marker; "
                          f"{fresh_hint(Path(checkpoint_path))}")
    return data


def latest_checkpoint(checkpoint_dir: Any) -> Path | None:
    """The checkpoint NeMo-RL resumes from: the `step_N` directory with the highest N (its
    `CheckpointManager.get_latest_checkpoint_path`), or None."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return None
    steps = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.fullmatch(p.name))]
    return max(steps)[1] if steps else None


def fresh_hint(step_dir: Path) -> str:
    return (f"to start fresh, set {DIR_KEY} to a new directory (or move {step_dir.parent}/step_* away); "
            "to resume it, run with the block it was written with")


def check_resume(run: dict, spec: Any) -> Path | None:
    """Refuse (ConfigError) a run with the block `spec` whose NeMo-RL would resume from a checkpoint
    written without the block or with another drafter. Returns the checkpoint it resumes from, or None."""
    if spec is None:
        return None
    ckpt_cfg = run.get("checkpointing")
    directory = ckpt_cfg.get("checkpoint_dir") if isinstance(ckpt_cfg, dict) else None
    step_dir = latest_checkpoint(directory) if directory else None  # none set: NeMo-RL has nowhere to resume from
    if step_dir is None:
        return None
    want = identity(spec)
    found = read_marker(step_dir)
    if found is None:
        raise ConfigError(
            f"{DIR_KEY}: NeMo-RL would resume from {step_dir}, which was written without {BLOCK_PATH} (it has no "
            f"{MARKER}); this run asks for {describe(want)}; {fresh_hint(step_dir)}")
    got = {k: found[k] for k in ("drafter", "backend", "model") if k in found}
    if got != want:
        raise ConfigError(
            f"{DIR_KEY}: NeMo-RL would resume from {step_dir}, which was written with {BLOCK_PATH} {describe(got)}; "
            f"this run asks for {describe(want)}; {fresh_hint(step_dir)}")
    return step_dir


def wrap_init_tmp_checkpoint(original: Callable, spec: Any) -> Callable:
    """NeMo-RL's `CheckpointManager.init_tmp_checkpoint` (same parameters), whose new checkpoint
    directory also gets our marker."""

    @functools.wraps(original)
    def init_tmp_checkpoint(self, *args, **kwargs):
        path = original(self, *args, **kwargs)
        write_marker(path, spec)
        return path

    return init_tmp_checkpoint
