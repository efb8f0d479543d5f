"""vLLM's built-in history drafters as a user would run them: the baselines of every priced verdict.

A user who brings no drafter of their own picks the best of vLLM's built-ins as they come, so a
verdict compares against the best of these rows, priced (`best`):

- ``vllm_suffix``: vLLM's suffix decoding at the run file's k and suffix block (matched k);
- ``vllm_suffix_default``: ``method: suffix`` and nothing else, as vLLM's `SpeculativeConfig`
  fills it in: ``num_speculative_tokens`` defaults to ``suffix_decoding_max_tree_depth``, and
  each request's draft length follows its match (at most ``max_spec_factor`` x the match length,
  tokens while their frequency-estimated probability is >= ``min_token_prob``), so at the tail of
  a rollout, where a long draft is nearly free on a GPU, the drafts are long;
- ``ngram``: vLLM's n-gram prompt lookup at the run file's k and ngram block (matched k);
- ``ngram_default``: the lookup bounds at vLLM's defaults (both set when neither is given).
  vLLM requires ``num_speculative_tokens`` for ``method: ngram`` (it has no default), so k is
  `NGRAM_DOCS_K`, the value of the n-gram example in vLLM's speculative decoding documentation.

The default rows' settings are read from the installed vLLM's `SpeculativeConfig` (`vllm_defaults`),
so they follow a vLLM upgrade.
"""
from __future__ import annotations

import functools

# vLLM's built-in rows, each the with_spec changes of one baseline (`changes`)
BUILTINS = ("vllm_suffix", "vllm_suffix_default", "ngram", "ngram_default")
# vLLM has no default k for method: ngram; its documentation's n-gram example runs num_speculative_tokens 5
NGRAM_DOCS_K = 5


@functools.cache
def vllm_defaults() -> dict:
    """The settings vLLM's `SpeculativeConfig` gives ``method: suffix`` given nothing else, and
    ``method: ngram`` given only k (`NGRAM_DOCS_K`), in the keys of our ``suffix`` and ``ngram``
    blocks."""
    from vllm.config.speculative import SpeculativeConfig

    s = SpeculativeConfig(method="suffix")
    n = SpeculativeConfig(method="ngram", num_speculative_tokens=NGRAM_DOCS_K)
    return {"suffix": {"num_speculative_tokens": int(s.num_speculative_tokens),
                       "max_tree_depth": int(s.suffix_decoding_max_tree_depth),
                       "max_spec_factor": float(s.suffix_decoding_max_spec_factor),
                       "min_token_prob": float(s.suffix_decoding_min_token_prob),
                       "max_cached_requests": int(s.suffix_decoding_max_cached_requests)},
            "ngram": {"num_speculative_tokens": int(n.num_speculative_tokens),
                      "prompt_lookup_min": int(n.prompt_lookup_min),
                      "prompt_lookup_max": int(n.prompt_lookup_max)}}


def changes(name: str, cfg) -> dict:
    """The speculative block's changes (`RunConfig.with_spec`) that make the built-in row `name` of
    the run file `cfg`: the matched-k rows keep the run file's k and sub-block; the default rows
    take vLLM's settings, and the scheduling block and per-step switch at their defaults (vLLM's
    proposer runs as it comes)."""
    from nemo_rl_specdec.drafters.suffix import for_backend

    frozen = {"refresh": {"mode": "frozen"}}
    plain = {**frozen, "scheduling": {}, "auto_disable": None}

    def at_vllm_defaults(drafter: str) -> dict:
        d = dict(vllm_defaults()[drafter])
        k = d.pop("num_speculative_tokens")
        return {"drafter": drafter, "num_speculative_tokens": k, drafter: {"backend": "vllm", **d}, **plain}

    k = {"num_speculative_tokens": cfg.spec.num_speculative_tokens}   # the run file's k, as its drafter resolved it
    rows = {
        "vllm_suffix": lambda: {"drafter": "suffix", "suffix": for_backend(cfg.spec.suffix.model_dump(), "vllm"),
                                **k, **frozen},
        "ngram": lambda: {"drafter": "ngram", "ngram": {**cfg.spec.ngram.model_dump(), "backend": "vllm"}, **k,
                          **frozen},
        "vllm_suffix_default": lambda: at_vllm_defaults("suffix"),
        "ngram_default": lambda: at_vllm_defaults("ngram"),
    }
    if name in rows:
        return rows[name]()
    raise ValueError(f"built-in row: {name!r}; allowed: {', '.join(BUILTINS)}")


def best(figures: dict, higher: bool = False) -> tuple[str, float]:
    """(name, figure) of the best built-in row of `figures` (row name -> a priced figure; rows that
    are not built-ins are left out): the least priced rollout time, or with `higher` the largest
    figure (a priced throughput ratio). Ties go to the first in `BUILTINS`."""
    rows = {n: x for n, x in figures.items() if n in BUILTINS and x is not None}
    if not rows:
        raise ValueError(f"best built-in: none of {', '.join(BUILTINS)} among the rows {sorted(figures)}")
    name = min(rows, key=lambda n: (-rows[n] if higher else rows[n], BUILTINS.index(n)))
    return name, rows[name]


def verdict(figures_by_host: dict, ours: str, higher: bool = False) -> list[dict]:
    """Per host speed (`figures_by_host`: host speed -> {row name -> priced figure}), the best
    built-in row and the ratio of the row `ours` to it: its priced rollout time over ours, or with
    `higher` our figure over its (a priced throughput ratio); > 1 means ours is faster."""
    out = []
    for h, figures in figures_by_host.items():
        name, x = best(figures, higher)
        mine = figures[ours]
        out.append({"host_speed": h, "best_builtin": name, "best_builtin_figure": x, "ours": ours,
                    "ratio": (mine / x if higher else x / mine) if mine and x else None})
    return out


def verdict_lines(rows: list, what: str, ks: dict | None = None) -> list[str]:
    """The printed verdict of `verdict`'s rows: `what` names our row's figure's kind (e.g. "priced
    rollout time"), `ks` the built-in rows' k."""
    def k(name: str) -> str:
        return f", k={ks[name]}" if ks and name in ks else ""

    return [f"{r['ours']} vs the best vLLM built-in ({r['best_builtin']}{k(r['best_builtin'])}), {what}, host "
            f"{r['host_speed']:g}x: " + (f"{r['ratio']:.3f}x" if r["ratio"] is not None else "n/a") for r in rows]


__all__ = ["BUILTINS", "NGRAM_DOCS_K", "best", "changes", "verdict", "verdict_lines", "vllm_defaults"]
