"""The drafter's state in NeMo-RL's checkpoints: our marker, what a checkpoint carries, and the
resume check and restore that read it.

NeMo-RL saves a checkpoint as `checkpointing.checkpoint_dir/step_N/` (its `CheckpointManager`:
`init_tmp_checkpoint` makes `tmp_step_N/` with `training_info.json`, GRPO writes the policy and the
dataloader state into it, and the finalisation renames it `step_N`, which `keep_top_k` rotates). At
setup, `grpo.setup` resumes from the `step_N` with the highest N in that directory.

- **Save** (`Session.save`, run by our `init_tmp_checkpoint`, installed by `run_grpo.install`): every
  checkpoint NeMo-RL starts gets, before GRPO writes anything else there, `speculative_decoding/`
  (`STATE_DIR`) and then `speculative_decoding.json` (`MARKER`, written last). The state directory is
  written under a temporary name and renamed whole, so a crash mid-save leaves no state a resume
  would read (and NeMo-RL never finalises the `tmp_step_N` it was in). It holds `state.json` (what
  the files are, their sizes and SHA-256, and what the state was saved for: drafter, vocabularies,
  DAS tree depth) and, as the run has them:
  - `engines.pt`: per engine, its policy and drafter versions, the rollouts its worker actor holds
    for the next update, and its proposer's state (DAS: the rollout window by policy version, the
    acceptance calibration, the per-step rule's step-cost fit); the driver's planner (the lengths
    each problem produced, the acceptance the budgets assume);
  - `distiller.pt` (`refresh.mode: online`): the drafter replica of policy rank 0 (every rank holds
    the same), its AdamW state, the distiller's step counters and history, and the policy workers'
    counters (policy steps, drafters made).
- **Resume check** (`check_resume`, in the launcher's `prepare()`, before NeMo-RL is imported and any
  engine starts): the checkpoint NeMo-RL would resume from must carry our marker, for this drafter,
  and (unless `speculative_decoding.resume: fresh`) a complete, uncorrupted state saved for this
  drafter, its vocabularies and tree depth. Each refusal names the checkpoint and what is wrong;
  nothing in the checkpoint is changed.
- **Restore** (`Session`, handed the checkpoint by `run_grpo.install`): our `VllmGeneration` restores
  every engine once its engines are up, and our `Policy` restores the distiller in every policy
  worker before it publishes its first drafter, which the first refit pushes: all before the first
  generate.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import time
import uuid
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nemo_rl_specdec import drafter_state
from nemo_rl_specdec.config.run import BLOCK_PATH, ConfigError
from nemo_rl_specdec.drafters.registry import drafter as drafter_of
from nemo_rl_specdec.drafters.roles import Declared, PricedDrafter, Refreshable, VllmMapping

MARKER = "speculative_decoding.json"
FORMAT = "nemo-rl-specdec/checkpoint"
VERSION = 2  # 1: the marker alone (no drafter state); 2: the marker names the state directory
READABLE = (1, 2)
STATE_DIR = "speculative_decoding"
STATE_FORMAT = "nemo-rl-specdec/drafter-state"
# 1: a hybrid engine's proposer state nested its history half's; 2: it is the history half's own
STATE_VERSION = 2
STATE_READABLE = (1, 2)
MANIFEST = "state.json"
ENGINES, DISTILLER = "engines.pt", "distiller.pt"
RESUME_KEY = "speculative_decoding.resume"
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


def write_marker(checkpoint_path: Any, spec: Any, state: bool = True) -> Path:
    """The marker (atomically: written aside, then renamed); `state`: the checkpoint holds `STATE_DIR`."""
    path = Path(checkpoint_path) / MARKER
    tmp = path.with_name(f".{MARKER}.{uuid.uuid4().hex[:8]}")
    tmp.write_text(json.dumps({"format": FORMAT, "version": VERSION, **identity(spec),
                               "state": STATE_DIR if state else None}, indent=1))
    os.replace(tmp, path)
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
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") not in READABLE:
        raise ConfigError(f"{DIR_KEY}: {path} is not a {FORMAT} marker of a version this package reads "
                          f"(found format {data.get('format') if isinstance(data, dict) else None!r} version "
                          f"{data.get('version') if isinstance(data, dict) else None!r}; readable: versions "
                          f"{list(READABLE)}); {fresh_hint(Path(checkpoint_path))}")
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
    written without the block or with another drafter, or (unless `resume: fresh`) without a drafter
    state this run can restore. Returns the checkpoint it resumes from, or None."""
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
    if spec.resume == "fresh":
        return step_dir
    if not found.get("state"):
        raise ConfigError(
            f"{DIR_KEY}: {step_dir} was written by an older nemo-rl-specdec (marker version {found.get('version')}), "
            f"which saved no drafter state; set {BLOCK_PATH}.resume: fresh to resume the policy with the drafter "
            "started over (its versions from 1, an empty DAS store, an online drafter from its checkpoint)")
    read_state(step_dir, spec, run=run)
    return step_dir


def wrap_init_tmp_checkpoint(original: Callable, session: Session) -> Callable:
    """NeMo-RL's `CheckpointManager.init_tmp_checkpoint` (same parameters), whose new checkpoint
    directory also gets the drafter's state and our marker (`Session.save`)."""

    @functools.wraps(original)
    def init_tmp_checkpoint(self, *args, **kwargs):
        path = original(self, *args, **kwargs)
        session.save(path)
        return path

    return init_tmp_checkpoint


# ---------------------------------------------------------------------- the state's files
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def expected(spec: Any, run: dict | None = None) -> dict:
    """What a state must have been saved for to be restored into a run with the block `spec`: the
    drafter, its Eagle3 draft vocabulary setting, DAS's tree depth, the policy's vocabulary (from
    `run`, when its model config is readable here)."""
    out: dict = {"identity": identity(spec)}
    settings = drafter_of(spec, VllmMapping).settings(spec)
    if hasattr(settings, "draft_vocab_size"):  # a head that drafts from a vocabulary of its own
        out["draft_vocab_size"] = settings.draft_vocab_size
    if rollout_prompt_tail(spec) is not None:  # a store of rollouts: its sequences depend on the tree depth
        out["max_tree_depth"] = int(spec.suffix.max_tree_depth)
    vocab = _policy_vocab(run)
    if vocab is not None:
        out["vocab_size"] = vocab
    return out


def rollout_prompt_tail(spec: Any) -> int | None:
    """The prompt tail rollouts carry to the drafter (None: the drafter keeps no rollouts)."""
    return drafter_of(spec, Refreshable).rollout_prompt_tail(spec)


def _policy_vocab(run: dict | None) -> int | None:
    """The policy's vocabulary size from its config.json when it is a local directory, else None."""
    name = ((run or {}).get("policy") or {}).get("model_name")
    cfg = Path(str(name)) / "config.json" if name else None
    if cfg is None or not cfg.is_file():
        return None
    try:
        return int(json.loads(cfg.read_text()).get("vocab_size"))
    except (OSError, ValueError, TypeError):
        return None


def write_state(checkpoint_path: Any, manifest: dict, parts: dict[str, Any]) -> Path:
    """`STATE_DIR` in `checkpoint_path`: every part as a torch file, then `MANIFEST` with their sizes
    and digests, all under a temporary name that is renamed whole at the end."""
    root = Path(checkpoint_path)
    final = root / STATE_DIR
    tmp = root / f".{STATE_DIR}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        files = {}
        for name, obj in parts.items():
            path = tmp / name
            with open(path, "wb") as f:
                drafter_state.save(obj, f)
                f.flush()
                os.fsync(f.fileno())
            files[name] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
        (tmp / MANIFEST).write_text(json.dumps({"format": STATE_FORMAT, "version": STATE_VERSION, **manifest,
                                                "files": files}, indent=1))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def read_state(checkpoint_path: Any, spec: Any, run: dict | None = None, load: bool = False) -> dict:
    """The manifest of the state in `checkpoint_path`, checked: readable, every file whole (size and
    SHA-256), saved for what `spec` (and `run`) asks (`expected`). With `load`, also each part's
    content under its file name. ConfigError naming the checkpoint and what is wrong otherwise."""
    root = Path(checkpoint_path) / STATE_DIR
    hint = f"{BLOCK_PATH}.resume: fresh starts the drafter over instead; {fresh_hint(Path(checkpoint_path))}"

    def refuse(what: str):
        raise ConfigError(f"{DIR_KEY}: the drafter state in {root} {what}; {hint}")

    try:
        manifest = json.loads((root / MANIFEST).read_text())
    except FileNotFoundError:
        refuse(f"has no {MANIFEST}")
    except (OSError, ValueError) as e:
        refuse(f"has an unreadable {MANIFEST} ({e})")
    if not isinstance(manifest, dict) or manifest.get("format") != STATE_FORMAT \
            or manifest.get("version") not in STATE_READABLE:
        refuse(f"is not a {STATE_FORMAT} state of a version this package reads ({list(STATE_READABLE)})")
    for name, meta in (manifest.get("files") or {}).items():
        path = root / name
        if not path.is_file():
            refuse(f"is missing {name}")
        size = path.stat().st_size
        if size != meta.get("bytes"):
            refuse(f"has {name} truncated or grown: {size} bytes, {meta.get('bytes')} saved")
        if _sha256(path) != meta.get("sha256"):
            refuse(f"has {name} corrupt: its SHA-256 is not the one saved")
    want = expected(spec, run)
    if manifest.get("identity") != want["identity"]:
        refuse(f"was saved for {describe(manifest.get('identity') or {})}; "
               f"this run asks for {describe(want['identity'])}")
    if manifest["version"] == 1 and drafter_of(spec, PricedDrafter).cost_parts is not None:
        refuse("was written by an older nemo-rl-specdec (state version 1), whose engine state of a drafter made of "
               "parts this one does not read")
    for key, what in (("draft_vocab_size", f"{BLOCK_PATH}.eagle3.draft_vocab_size"),
                      ("max_tree_depth", f"{BLOCK_PATH}.suffix.max_tree_depth"),
                      ("vocab_size", "the policy's vocabulary size (policy.model_name)")):
        if key in want and key in manifest and want[key] is not None and manifest[key] != want[key]:
            refuse(f"was saved with {key} {manifest[key]}; this run has {what} {want[key]}")
    if load:
        for name in manifest.get("files") or {}:
            try:
                with open(root / name, "rb") as f:
                    manifest.setdefault("parts", {})[name] = drafter_state.load(f)
            except Exception as e:  # a file that passed its digest but does not load: another writer's
                refuse(f"has {name} that does not load ({type(e).__name__}: {e})")
    return manifest


# ---------------------------------------------------------------------- save and restore in a run
class Session:
    """One launch with the block: what is saved at each checkpoint and restored at a resume. The live
    `VllmGeneration` and `Policy` attach themselves when built (weak references)."""

    def __init__(self, spec: Any, resume_from: Path | None = None, run: dict | None = None):
        self.spec, self.run = spec, run
        self.resume_from = Path(resume_from) if resume_from is not None and spec.resume != "fresh" else None
        self._generation: Any = None
        self._policy: Any = None
        self.saves: list[dict] = []  # per checkpoint written: its path, bytes and seconds
        self._loaded: dict | None = None

    def attach_generation(self, generation: Any) -> None:
        self._generation = weakref.ref(generation)

    def attach_policy(self, policy: Any) -> None:
        self._policy = weakref.ref(policy)

    def _live(self, ref: Any) -> Any:
        return ref() if ref is not None else None

    def loaded(self) -> dict | None:
        """The state the run resumes from (read once, checked as `read_state`), or None."""
        if self.resume_from is None:
            return None
        if self._loaded is None:
            self._loaded = read_state(self.resume_from, self.spec, run=self.run, load=True)
        return self._loaded

    def save(self, checkpoint_path: Any) -> Path:
        """The drafter's state and the marker into a checkpoint NeMo-RL has just started."""
        t0 = time.perf_counter()
        generation, policy = self._live(self._generation), self._live(self._policy)
        if generation is None:
            raise RuntimeError(f"{BLOCK_PATH}: NeMo-RL saves a checkpoint at {checkpoint_path}, but no VllmGeneration "
                               "of nemo-rl-specdec is running: the drafter's state cannot be saved with it")
        parts: dict = {ENGINES: generation.specdec_export_state()}
        if policy is not None:
            parts[DISTILLER] = policy.specdec_export_state()
        manifest = expected(self.spec, self.run)
        manifest["engines"] = len(parts[ENGINES]["engines"])
        if DISTILLER in parts:
            d = parts[DISTILLER]["distiller"]
            manifest["vocab_size"] = int(d["vocab_size"])
            if d.get("draft_vocab_size") is not None:
                manifest["draft_vocab_size"] = int(d["draft_vocab_size"])
        path = write_state(checkpoint_path, manifest, parts)
        write_marker(checkpoint_path, self.spec)
        size = sum(p.stat().st_size for p in path.iterdir())
        self.saves.append({"path": str(checkpoint_path), "bytes": size, "seconds": time.perf_counter() - t0})
        return path

    def engines_state(self) -> dict | None:
        state = self.loaded()
        return None if state is None else state["parts"][ENGINES]

    def distiller_state(self) -> dict | None:
        state = self.loaded()
        if state is None:
            return None
        part = state["parts"].get(DISTILLER)
        if part is None and self.spec.refresh.mode == "online":
            raise ConfigError(f"{DIR_KEY}: the drafter state in {self.resume_from} holds no online "
                              f"drafter ({DISTILLER}), but this run distils one (refresh.mode: online); "
                              f"{BLOCK_PATH}.resume: fresh starts it over instead")
        return part


SESSION: Session | None = None  # the launch's, set by run_grpo.install


def session() -> Session | None:
    return SESSION
