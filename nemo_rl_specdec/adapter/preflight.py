"""Checks run before any engine starts, in the Python NeMo-RL will start its vLLM workers with.

NeMo-RL's workers run in their own environment (a uv venv per worker class, or the container's
Python), with the vLLM that NeMo-RL version pins (v0.7.0: 0.20.0; main: 0.25.1). One subprocess
there reports what that vLLM accepts (`worker_facts`); `adapt_speculative_config` then fits our
`speculative_config` to it or refuses the run with an error naming the key path, and the suffix
drafter's `arctic_inference` must import there. Without this, each of these failed only when the
engines started, or not at all.
"""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from nemo_rl_specdec.adapter import api, translate
from nemo_rl_specdec.config import BLOCK_PATH, ConfigError
from nemo_rl_specdec.drafters.registry import drafter as drafter_of

# Run in the workers' Python: the vLLM version, SpeculativeConfig's fields, the methods its type
# admits, and whether arctic_inference's suffix tree imports.
FACTS_SCRIPT = r"""
import json, sys, typing
out = {"python": sys.executable}
try:
    import vllm
    from vllm.config import speculative as s
    out["vllm"] = getattr(vllm, "__version__", "unknown")
    cls = s.SpeculativeConfig
    fields = getattr(cls, "__dataclass_fields__", None) or getattr(cls, "model_fields", None) or {}
    out["fields"] = sorted(fields)
    def literals(t, acc):
        for a in typing.get_args(t):
            if isinstance(a, str):
                acc.add(a)
            else:
                literals(a, acc)
        return acc
    hint = typing.get_type_hints(cls).get("method") if hasattr(cls, "__annotations__") else None
    out["methods"] = sorted(literals(hint, set())) if hint is not None else None
except Exception as e:
    out["vllm_error"] = f"{type(e).__name__}: {e}"
try:
    import arctic_inference.suffix_decoding._C  # noqa: F401
    out["arctic"] = None
except Exception as e:
    out["arctic"] = f"{type(e).__name__}: {e}"
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
    """`sc` fitted to the workers' vLLM, or ConfigError naming the key path that vLLM cannot honour.

    - `draft_sample_method` (probabilistic drafts at T > 0) is dropped where vLLM has no such field:
      its drafts are then greedy, outputs stay exactly the policy's, acceptance at T > 0 may be
      lower; this is printed.
    - a method vLLM lacks (`custom_class` for DAS and our n-gram) or `num_speculative_tokens_per_batch_size`
      (`scheduling.k_by_batch_size`, `scheduling.k: auto`) where vLLM has no such field: the run is refused.
    """
    version, fields, methods = facts.get("vllm", "?"), set(facts.get("fields") or ()), facts.get("methods")
    where = f"vLLM {version} in NeMo-RL's workers ({facts.get('python', '?')})"
    out = dict(sc)
    method = out.get("method")
    if methods is not None and method not in methods:
        if method == "custom_class":
            name = spec.drafter  # suffix (das) or ngram (specdec): our proposers, beside vLLM's own backend
            got = getattr(drafter_of(spec).settings(spec), "backend", None)
            raise ConfigError(
                f"{BLOCK_PATH}.{name}.backend: got {got!r}, which runs as vLLM's custom_class proposer; {where} has "
                f"no custom_class method; allowed with this vLLM: 'vllm' (vLLM's own {name} proposer), or use a "
                "NeMo-RL whose vLLM has custom_class (main pins 0.25.1)")
        raise ConfigError(f"{BLOCK_PATH}.drafter: {translate.SPEC_KWARGS_PATH}.method={method!r} is not a method of "
                          f"{where}; it has {sorted(methods)}")
    if not fields:
        return out
    if "num_speculative_tokens_per_batch_size" in out and "num_speculative_tokens_per_batch_size" not in fields:
        key, fix = (("scheduling.k", "set it to null (one k for every batch size)") if spec.scheduling.k == "auto"
                    else ("scheduling.k_by_batch_size", "remove it (one k for every batch size)"))
        raise ConfigError(f"{BLOCK_PATH}.{key}: {where} has no num_speculative_tokens_per_batch_size, which "
                          f"{'k: auto re-chooses at run time' if key == 'scheduling.k' else 'it sets'}; {fix}, or "
                          "use a NeMo-RL whose vLLM has it (main pins 0.25.1)")
    if "draft_sample_method" in out and "draft_sample_method" not in fields:
        out.pop("draft_sample_method")
        log(f"[specdec] {where} has no draft_sample_method: drafts are greedy; outputs stay exactly the policy's, "
            "acceptance at temperature > 0 may be lower than with probabilistic drafts")
    unknown = sorted(k for k in out if k not in fields)
    if unknown:
        raise ConfigError(f"{BLOCK_PATH}: {translate.SPEC_KWARGS_PATH} would carry {unknown}, which {where} does not "
                          f"accept; it accepts {sorted(fields)}")
    return out


def check(spec: Any, gen_cfg: dict, worker_fqn: str, run: Callable = subprocess.run,
          facts: dict | None = None) -> dict:
    """Everything above for one generation config (its speculative_config is rewritten in place).
    Returns the facts. Raises ImportError (arctic, with the build recipe) or ConfigError."""
    if spec is None:
        return {}
    facts = facts if facts is not None else worker_facts(worker_python(worker_fqn), run)
    if translate.needs_arctic(spec) and facts.get("arctic"):
        raise ImportError(translate.arctic_missing_message(
            f"the vLLM workers' Python ({facts.get('python', '?')})", facts["arctic"], spec.drafter))
    kwargs = gen_cfg.get("vllm_kwargs") or {}
    if kwargs.get("speculative_config"):
        kwargs = dict(kwargs)
        kwargs["speculative_config"] = adapt_speculative_config(kwargs["speculative_config"], facts, spec,
                                                                log=lambda m: print(m, file=sys.stderr))
        gen_cfg["vllm_kwargs"] = kwargs
    return facts
