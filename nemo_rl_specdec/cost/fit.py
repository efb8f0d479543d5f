"""Fit the target step-cost model t = c_base + c_tok * n_tokens to measured steps.

Samples are (tokens processed in one engine step, seconds that step took): from vLLM step
timings, or derived from a throughput run — a batch of B requests decoding without
speculation processes B tokens per step and takes B / (tokens per second) seconds; with k
drafts per request it verifies B * (k + 1) tokens and takes B * (mean accepted length) /
(tokens per second). `fit_cost_model` is an ordinary least-squares line constrained to
non-negative coefficients (a negative fixed or per-token cost is not physical: when the
unconstrained fit goes negative, that coefficient is pinned at 0 and the other refitted).
Scenarios fit with `pin=False`: a pinned coefficient is an error there, since a cost model
whose step time does not grow with tokens (or has no fixed part) is silently wrong about
speculation.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

OUTLIER_MADS = 3.0  # a sample whose residual is further than this many robust deviations is not a cost sample


@dataclass(frozen=True)
class NNLSFit:
    coef: np.ndarray        # the constants, >= 0
    keep: np.ndarray        # the samples the final fit used (bool mask)
    r2: float               # R^2 on those

    @property
    def kept(self) -> int:
        return int(self.keep.sum())


def nnls_fit(X, y, refit: Callable[[np.ndarray], bool] | None = None) -> NNLSFit:
    """The one fit of the linear step form's constants (or a proposer's): non-negative least squares
    of `y` on the columns `X`, refitted once without the samples further than `OUTLIER_MADS` robust
    deviations out (a step the engine or the proposer was held up in: a descheduled thread, a first
    call's compile, a pause between calls), when `refit(keep)` accepts what is left (None: never
    refit)."""
    from scipy.optimize import nnls

    X, y = np.asarray(X, dtype=float), np.asarray(y, dtype=float)
    coef, _ = nnls(X, y)
    keep = np.ones(len(y), dtype=bool)
    if refit is not None:
        res = y - X @ coef
        dev = np.abs(res - np.median(res))
        out = dev <= OUTLIER_MADS * 1.4826 * np.median(dev)
        if np.median(dev) > 0 and not out.all() and refit(out):
            keep = out
            coef, _ = nnls(X[keep], y[keep])
    pred, yk = X[keep] @ coef, y[keep]
    ss = float(((yk - yk.mean()) ** 2).sum())
    return NNLSFit(coef, keep, 1.0 - float(((yk - pred) ** 2).sum()) / ss if ss > 0 else 1.0)


def _check(samples: Sequence[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
    try:
        arr = np.asarray([(float(n), float(t)) for n, t in samples], dtype=float)
    except (TypeError, ValueError):
        raise ValueError("samples must be a list of (n_tokens_in_step, seconds) pairs") from None
    if len(arr) < 2:
        raise ValueError(f"need at least 2 samples to fit c_base and c_tok, got {len(arr)}")
    n, t = arr[:, 0], arr[:, 1]
    if not np.all(np.isfinite(arr)) or np.any(n < 0) or np.any(t <= 0):
        raise ValueError("samples need n_tokens >= 0 and seconds > 0 (finite)")
    if np.ptp(n) == 0:
        raise ValueError("all samples have the same n_tokens: c_base and c_tok cannot be separated")
    return n, t


def fit_cost_model(samples: Sequence[Sequence[float]], pin: bool = True) -> tuple[float, float]:
    """(c_base, c_tok) in seconds from [(n_tokens_in_step, seconds), ...] (see module doc).
    With pin=False a fit that would pin a coefficient at 0 raises ValueError."""
    n, t = _check(samples)
    X = np.stack([np.ones_like(n), n], axis=1)
    (c_base, c_tok), *_ = np.linalg.lstsq(X, t, rcond=None)
    if not pin and c_tok <= 0:
        raise ValueError(f"the fit gives c_tok_s = {c_tok:.3g} <= 0 (step time does not grow with tokens): "
                         "add samples over a wider range of tokens per step")
    if not pin and c_base <= 0:
        raise ValueError(f"the fit gives c_base_s = {c_base:.3g} <= 0: add samples with few tokens per step")
    if c_tok < 0:
        c_base, c_tok = float(t.mean()), 0.0
    elif c_base < 0:
        c_base, c_tok = 0.0, float((n @ t) / (n @ n))
    return float(c_base), float(c_tok)


def samples_from_throughput(batch: int, tokens_per_s: float, k: int = 0,
                            mean_accepted_length: float = 1.0) -> tuple[float, float]:
    """One (n_tokens_in_step, seconds) sample from a decode throughput measurement: `batch`
    requests each verifying k + 1 tokens per step and committing `mean_accepted_length`."""
    if batch < 1 or tokens_per_s <= 0 or k < 0 or not 1 <= mean_accepted_length <= k + 1:
        raise ValueError("need batch >= 1, tokens_per_s > 0, k >= 0, 1 <= mean_accepted_length <= k + 1")
    return float(batch * (k + 1)), float(batch * mean_accepted_length / tokens_per_s)


# ---------------------------------------------------------------------------------- roofline
ROOFLINE_FITTED = ("mem_bw_Bps", "flops_per_s", "overhead_s", "eager_overhead_s", "overhead_per_seq_s")
MAX_ROOFLINE_SAMPLES = 2_000      # the fit prices every sample at every iteration


def fit_roofline(samples: Sequence[dict], shape, capture_sizes: Sequence[int]) -> dict:
    """The roofline constants (`ROOFLINE_FITTED`) that best explain measured forward times, in
    relative error: samples are `nemo_rl_specdec/tools/time_forward.py`'s (tokens, ctx_sum, attn_ctx, seconds; a
    step past the largest capture size ran eagerly), `shape` the timed model's `ModelShape`. The
    model is `costmodel.Roofline.forward` plus `overhead_per_seq_s` per request, as `CostModel` prices a step.
    Returns the constants, R^2 of log time, and the median and largest relative residuals."""
    from scipy.optimize import least_squares

    from nemo_rl_specdec.cost.model import Roofline

    if len(samples) < len(ROOFLINE_FITTED) + 1:
        raise ValueError(f"need at least {len(ROOFLINE_FITTED) + 1} samples to fit the roofline, got {len(samples)}")
    t = np.asarray([s["seconds"] for s in samples], dtype=float)
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ValueError("samples need seconds > 0 (finite)")
    sizes = tuple(capture_sizes)
    if not any(s["tokens"] > sizes[-1] for s in samples) or not any(s["tokens"] <= sizes[-1] for s in samples):
        raise ValueError(f"need samples on both sides of the largest capture size {sizes[-1]} "
                         "(graph-replayed and eager steps) to separate the eager overhead")

    def predict(x):
        bw, fl, ov, eager, per_seq = np.exp(x)
        r = Roofline(bw, fl, ov, capture_sizes=sizes, eager_overhead_s=eager, overhead_per_seq_s=per_seq)
        out = []
        for s in samples:
            const, (m0, _, f0, _) = r.forward(shape, s["tokens"], s["ctx_sum"], 0.0, s["attn_ctx"], 0.0)
            out.append(const + r.overhead_per_seq_s * s["requests"] + max(m0, f0))
        return np.asarray(out)

    x0 = np.log([2e12, 5e14, 1e-3, 1e-3, 1e-5])
    res = least_squares(lambda x: predict(x) / t - 1.0, x0, method="trf")
    pred = predict(res.x)
    rel = np.abs(pred / t - 1.0)
    lt, lp = np.log(t), np.log(pred)
    ss_tot = float(((lt - lt.mean()) ** 2).sum())
    fitted = dict(zip(ROOFLINE_FITTED, (float(v) for v in np.exp(res.x)), strict=True))
    return {**fitted, "r2_log": 1.0 - float(((lt - lp) ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0,
            "median_rel_residual": float(np.median(rel)), "max_rel_residual": float(rel.max()),
            "samples": len(samples)}


def _samples_file(path: str) -> tuple:
    """(ModelShape, samples, graph_max) of a `nemo_rl_specdec/tools/time_forward.py` samples file, or a ValueError."""
    import json
    from pathlib import Path

    from nemo_rl_specdec.cost.model import ModelShape

    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not (isinstance(data, dict) and isinstance(data.get("samples"), list) and isinstance(data.get("model"), dict)):
        raise ValueError("a time_forward samples JSON is a mapping with a `model` mapping and a `samples` list")
    if len(data["samples"]) > MAX_ROOFLINE_SAMPLES:
        raise ValueError(f"{len(data['samples']):,} samples; at most {MAX_ROOFLINE_SAMPLES:,} are fitted")
    graph_max = data.get("graph_max")
    if isinstance(graph_max, bool) or not isinstance(graph_max, int) or not 1 <= graph_max <= 65_536:
        raise ValueError(f"graph_max={graph_max!r}: expected the largest CUDA-graph size, an integer from 1 to 65,536")
    m = data["model"]
    shape = ModelShape(m["weight_bytes"], m["flops_per_token"], m["kv_bytes_per_token"], m["attn_flops_per_ctx"],
                       m.get("num_layers", 0), m.get("hidden_size", 0))
    return shape, data["samples"], graph_max, data


def roofline_from_file(path: str) -> dict:
    """`fit_roofline` over a `nemo_rl_specdec/tools/time_forward.py` samples file: its recorded model shape, and
    vLLM's capture sizes up to the largest size it replayed from a CUDA graph."""
    from nemo_rl_specdec.cost.model import vllm_capture_sizes

    shape, samples, graph_max, data = _samples_file(path)
    fit = fit_roofline(samples, shape, vllm_capture_sizes(graph_max))
    return {**fit, "device": data.get("device", ""), "attention": data.get("attention", ""),
            "num_layers": shape.num_layers, "hidden_size": shape.hidden_size}


def fit_layer_widths(draft_files: Sequence[str], target_file: str) -> dict:
    """The fixed time of a forward per layer as a line in the layer's width, ``fixed_s + per_width_s x
    hidden_size``, fitted on timed forwards of draft models (`draft_files`, their graph-replayed
    samples) less their roofline time on the GPU they were timed on (the roofline fitted on
    `target_file`, a target timed on that GPU): non-negative least squares of the residual time on
    (layers, layers x width), in relative error (each sample weighed by its time, as the roofline
    is fitted), so that small forwards, whose time is mostly fixed, count as much as large ones.
    Returns the two constants, the target's width and fixed time per layer on that GPU, and per file
    its layers, width and the median and largest relative error of the fitted forward times."""
    from nemo_rl_specdec.cost.model import Roofline, vllm_capture_sizes

    target = roofline_from_file(target_file)
    rows, y, pred_base, secs, which = [], [], [], [], []
    files = []
    for path in draft_files:
        shape, samples, graph_max, _ = _samples_file(path)
        if not (shape.num_layers and shape.hidden_size):
            raise ValueError(f"{path}: model.num_layers and model.hidden_size are needed to fit a fixed time by width")
        roof = Roofline(target["mem_bw_Bps"], target["flops_per_s"], capture_sizes=vllm_capture_sizes(graph_max))
        files.append((str(path), shape.num_layers, shape.hidden_size))
        for s in samples:
            if s.get("mode") != "graph":   # an eager step's launch overhead is not the layers' fixed time
                continue
            const, (m0, _, f0, _) = roof.forward(shape, s["tokens"], s["ctx_sum"], 0.0, s["attn_ctx"], 0.0,
                                                 overhead=False)
            base = const + max(m0, f0)
            rows.append([float(shape.num_layers), float(shape.num_layers * shape.hidden_size)])
            y.append(float(s["seconds"]) - base)
            pred_base.append(base)
            secs.append(float(s["seconds"]))
            which.append(len(files) - 1)
    if len({h for _, _, h in files}) < 2:
        raise ValueError("need draft forwards of at least two layer widths to fit a fixed time by width")
    t = np.asarray(secs)
    fit = nnls_fit(np.asarray(rows) / t[:, None], np.asarray(y) / t)
    a, b = (float(c) for c in fit.coef)
    pred = np.asarray(pred_base) + np.asarray(rows) @ fit.coef
    rel = np.abs(pred / np.asarray(secs) - 1.0)
    w = np.asarray(which)
    return {"fixed_s": a, "per_width_s": b, "target_hidden_size": int(target["hidden_size"]),
            "target_layer_s": float(target["overhead_s"]) / max(1, int(target["num_layers"])),
            "device": target["device"],
            "files": [{"file": f, "num_layers": n, "hidden_size": h,
                       "median_rel_residual": float(np.median(rel[w == i])),
                       "max_rel_residual": float(rel[w == i].max())}
                      for i, (f, n, h) in enumerate(files)]}
