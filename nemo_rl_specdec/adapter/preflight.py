"""Checks run before any engine starts, in the Python NeMo-RL will start its vLLM workers with.

NeMo-RL's workers run in their own environment (a uv venv per worker class, or the container's
Python), with the vLLM that NeMo-RL version pins (v0.7.0: 0.20.0; main: 0.25.1). One subprocess
there reports what that vLLM accepts (`worker_facts`); `adapt_speculative_config` then fits our
`speculative_config` to it or refuses the run with an error naming the key path, the suffix
drafter's `arctic_inference` must import there, and a colocated run (NeMo-RL's default) needs a
vLLM platform with sleep mode (`check_sleep_mode`). Without this, each of these failed only when
the engines started, or not at all.
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from nemo_rl_specdec.adapter import api, translate
from nemo_rl_specdec.config.run import ConfigError, check_colocated_sleep
from nemo_rl_specdec.engine import vllm_compat

# Run in the workers' Python: what its vLLM's SpeculativeConfig accepts (vllm_compat.speculative_facts, by
# its source: our package need not be importable there), whether arctic_inference's suffix tree imports,
# and whether its vLLM platform has sleep mode (what vLLM itself asks before an engine with
# `enable_sleep_mode`, which NeMo-RL's workers always set, may start).
FACTS_SCRIPT = vllm_compat.SPECULATIVE_FACTS_SOURCE + r"""
import json
out = speculative_facts()
try:
    import arctic_inference.suffix_decoding._C  # noqa: F401
    out["arctic"] = None
except Exception as e:
    out["arctic"] = f"{type(e).__name__}: {e}"
try:
    from vllm.platforms import current_platform
    out["platform"] = type(current_platform).__name__
    out["sleep_mode"] = bool(current_platform.is_sleep_mode_available())
except Exception as e:
    out["sleep_mode"] = None
print("SPECDEC_FACTS " + json.dumps(out))
"""


def worker_python(worker_fqn: str) -> str:
    """The Python executable NeMo-RL will start `worker_fqn` with (building its venv if NeMo-RL would)."""
    py = api.resolve(api.ACTOR_PYTHON_ENV)(worker_fqn)
    if py.startswith("uv"):
        py = api.resolve(api.CREATE_LOCAL_VENV)(py, worker_fqn)
    return py


def worker_facts(python: str, run: Callable = subprocess.run) -> dict:
    """What the vLLM in `python` accepts (see FACTS_SCRIPT); raises if that Python cannot say."""
    res = run([python, "-c", FACTS_SCRIPT], capture_output=True, text=True)
    line = next((ln for ln in (res.stdout or "").splitlines() if ln.startswith("SPECDEC_FACTS ")), None)
    if res.returncode != 0 or line is None:
        tail = " | ".join((res.stderr or "").strip().splitlines()[-3:])
        raise RuntimeError(f"could not inspect the vLLM workers' Python ({python}): exit {res.returncode}: {tail}")
    facts = json.loads(line[len("SPECDEC_FACTS "):])
    if facts.get("vllm_error"):
        raise RuntimeError(f"vLLM does not import in the vLLM workers' Python ({python}): {facts['vllm_error']}")
    return facts


def adapt_speculative_config(sc: dict, facts: dict, spec: Any, log: Callable[[str], None] = print) -> dict:
    """`sc` fitted to the vLLM of NeMo-RL's workers (`vllm_compat.fit_speculative_config`), or ConfigError
    naming the key path that vLLM cannot honour."""
    where = f"vLLM {facts.get('vllm', '?')} in NeMo-RL's workers ({facts.get('python', '?')})"
    return vllm_compat.fit_speculative_config(sc, facts, spec, where=where, sc_path=translate.SPEC_KWARGS_PATH,
                                              elsewhere="use a NeMo-RL whose vLLM has it (main pins 0.25.1)", log=log)


COLOCATED_PATH = "policy.generation.colocated.enabled"


def check_sleep_mode(gen_cfg: dict, facts: dict) -> None:
    """A colocated run (NeMo-RL's default) sleeps its engines after each generation phase and wakes
    them for each refit; refused (ConfigError) where the workers' vLLM platform has no sleep mode."""
    if not (gen_cfg.get("colocated") or {}).get("enabled") or facts.get("sleep_mode") is not False:
        return
    raise ConfigError(
        f"{COLOCATED_PATH}: got true (NeMo-RL's default: the vLLM engines sleep after each generation phase and "
        f"wake for each refit), but vLLM {facts.get('vllm', '?')} on platform {facts.get('platform', '?')} in "
        f"NeMo-RL's workers ({facts.get('python', '?')}) has no sleep mode; allowed with this vLLM: false "
        "(generation on resources of its own, policy.generation.colocated.resources), or a vLLM platform with "
        "sleep mode (CUDA, ROCm)")


def check(spec: Any, gen_cfg: dict, worker_fqn: str, run: Callable = subprocess.run,
          facts: dict | None = None) -> dict:
    """Everything above for one generation config (its speculative_config is rewritten in place).
    Returns the facts. Raises ImportError (arctic, with the build recipe) or ConfigError (a block or a
    colocated run this vLLM cannot run)."""
    if spec is None:
        return {}
    facts = facts if facts is not None else worker_facts(worker_python(worker_fqn), run)
    if translate.needs_arctic(spec) and facts.get("arctic"):
        raise ImportError(translate.arctic_missing_message(
            f"the vLLM workers' Python ({facts.get('python', '?')})", facts["arctic"], spec.drafter))
    check_sleep_mode(gen_cfg, facts)
    check_colocated_sleep(gen_cfg, spec)
    kwargs = gen_cfg.get("vllm_kwargs") or {}
    if kwargs.get("speculative_config"):
        kwargs = dict(kwargs)
        kwargs["speculative_config"] = adapt_speculative_config(kwargs["speculative_config"], facts, spec,
                                                                log=lambda m: print(m, file=sys.stderr))
        gen_cfg["vllm_kwargs"] = kwargs
    return facts
