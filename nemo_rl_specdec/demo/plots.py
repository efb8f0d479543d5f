"""PNG plots of a demo run, one figure per function in FIGURES: acceptance vs step and vs policy
age, acceptance per draft position, policy and drafter versions, refresh time, rollout time spec
vs baseline, reward curves with and without speculation."""
from __future__ import annotations

from pathlib import Path

NAN = float("nan")


def _lines(name, title, ylabel, *series):
    """A figure over the steps: one line per (key, style, label) whose key some row has (None is a
    gap); `{drafter}` in a label or the title names the run's drafter."""
    def draw(ax, rows, drafter):
        steps = [r["step"] for r in rows]
        for key, style, label in series:
            if any(r.get(key) is not None for r in rows):
                ax.plot(steps, [NAN if r.get(key) is None else r[key] for r in rows], style,
                        label=label.format(drafter=drafter))
        ax.set(xlabel="RL step", ylabel=ylabel, title=title.format(drafter=drafter))
        return name
    return draw


_acceptance_vs_step = _lines("acceptance_vs_step.png", "Acceptance length vs step", "tokens per target forward",
                             ("acceptance_length", "o-", "{drafter} (lockstep refresh)"),
                             ("frozen_acceptance_length", "s--", "draft model (frozen)"))
_versions = _lines(
    "versions.png",
    "Policy and drafter versions",
    "version (at generation)",
    ("policy_version", "o-", "policy version"),
    ("drafter_version", "x--", "drafter version ({drafter})"),
)
_refresh_time = _lines("refresh_time.png", "Drafter refresh time per step ({drafter})", "seconds",
                       ("refresh_s", "o-", "drafter refresh (engine update)"),
                       ("distill_s", "x--", "drafter distillation (online)"))
_reward = _lines("reward.png", "Reward curves (must agree: lossless)", "mean reward",
                 ("reward_mean_baseline", "o-", "no speculation"), ("reward_mean", "x--", "speculative ({drafter})"))


def _acceptance_vs_policy_age(ax, rows, drafter):
    ax.scatter([r["policy_age"] for r in rows], [r["acceptance_length"] for r in rows], label=drafter)
    if "frozen_acceptance_length" in rows[0]:
        ax.plot([r["frozen_policy_age"] for r in rows], [r["frozen_acceptance_length"] for r in rows], "s--",
                label="draft model (frozen)")
    ax.set(xlabel="policy age (policy version - version the drafter was built from)",
           ylabel="tokens per target forward", title="Acceptance length vs policy age")
    return "acceptance_vs_policy_age.png"


def _acceptance_by_position(ax, rows, drafter):
    """One line per draft position (1 = first draft token): drafts accepted at that position over
    drafts. A step without drafts, or drafting fewer positions, leaves a gap."""
    steps = [r["step"] for r in rows]
    per_pos = [r.get("accepted_per_position") or [] for r in rows]
    for i in range(max(map(len, per_pos), default=0)):
        ax.plot(steps, [p[i] if i < len(p) else NAN for p in per_pos], "o-", label=f"position {i + 1}")
    ax.set(xlabel="RL step", ylabel="accepted at position / drafts", ylim=(0, 1.05),
           title=f"Acceptance per draft position ({drafter})")
    return "acceptance_by_position.png"


def _rollout_time(ax, rows, drafter):
    steps, w = [r["step"] for r in rows], 0.4
    ax.bar([s - w / 2 for s in steps], [r["rollout_s_baseline"] for r in rows], w, label="no speculation")
    ax.bar([s + w / 2 for s in steps], [r["rollout_s"] for r in rows], w, label=f"speculative ({drafter})")
    ax.set(xlabel="RL step", ylabel="rollout wall time (s)", title="Rollout time per step (same batch, same weights)")
    return "rollout_time.png"


FIGURES = (_acceptance_vs_step, _acceptance_vs_policy_age, _acceptance_by_position, _versions, _refresh_time,
           _rollout_time, _reward)


def plot_run(rows: list, out: Path) -> list:
    """Writes one PNG per figure in FIGURES under `out`; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    for draw in FIGURES:
        fig, ax = plt.subplots(figsize=(6, 4))
        name = draw(ax, rows, rows[0]["drafter"])
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
        fig.tight_layout()
        fig.savefig(Path(out) / name, dpi=100)
        plt.close(fig)
        files.append(str(Path(out) / name))
    return files
