"""PNG plots of a scenario's sweeps: speedup vs k, vs acceptance, vs cluster size.

Each plot shows the rollout speedup and the end-to-end step speedup against the scenario's
baseline (speculation off, baseline placement), with y = 1 (no gain) drawn for reference.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any


def _plot(points: list[dict[str, Any]], x: str, xlabel: str, title: str, path: Path, mark=None,
          log2_x: bool = False) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [p[x] for p in points]
    fig, ax = plt.subplots(figsize=(5.5, 3.8), dpi=110)
    ax.plot(xs, [p["rollout_speedup"] for p in points], "o-", label="rollout")
    ax.plot(xs, [p["step_speedup"] for p in points], "s--", label="step (end to end)")
    ax.axhline(1.0, color="grey", lw=0.8)
    if log2_x and min(xs) > 0:
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(v) for v in xs])
    if mark is not None:
        ax.axvline(mark, color="grey", lw=0.8, ls=":", label="scenario")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("speedup vs baseline")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_plots(result: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write the sweep plots of `result` (from `report.simulate(..., sweeps=True)`)."""
    sweeps = result.get("sweeps")
    if not sweeps:
        raise ValueError("result has no sweeps; run simulate(..., sweeps=True)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = result.get("scenario", "scenario")
    written = []
    specs = [
        ("k", "k", "draft tokens per step (k)", f"{name}: speedup vs k", result.get("k")),
        ("alpha", "alpha", "per-position acceptance alpha", f"{name}: speedup vs acceptance", result.get("alpha")),
        ("num_engines", "num_engines", "engines", f"{name}: speedup vs cluster size", result.get("num_engines")),
    ]
    files = {"k": "speedup_vs_k.png", "alpha": "speedup_vs_acceptance.png", "num_engines": "speedup_vs_cluster.png"}
    for key, x, xlabel, title, mark in specs:
        pts = sweeps.get(key) or []
        if not pts:
            continue
        path = out / files[key]
        _plot(pts, x, xlabel, title, path, mark, log2_x=(key == "num_engines"))
        written.append(path)
    return written
