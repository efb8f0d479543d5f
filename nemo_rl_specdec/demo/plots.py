"""PNG plots of a demo run: acceptance vs step and vs policy age, rollout time spec vs baseline,
reward curves with and without speculation."""
from __future__ import annotations

from pathlib import Path


def plot_run(rows: list, out: Path) -> list:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    drafter = rows[0]["drafter"]
    has_frozen = "frozen_acceptance_length" in rows[0]
    files = []

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(steps, [r["acceptance_length"] for r in rows], "o-", label=f"{drafter} (lockstep refresh)")
    if has_frozen:
        ax.plot(steps, [r["frozen_acceptance_length"] for r in rows], "s--", label="draft model (frozen)")
    ax.set_xlabel("RL step")
    ax.set_ylabel("tokens per target forward")
    ax.set_title("Acceptance length vs step")
    ax.legend()
    files.append(_save(fig, out / "acceptance_vs_step.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter([r["policy_age"] for r in rows], [r["acceptance_length"] for r in rows], label=drafter)
    if has_frozen:
        ax.plot([r["frozen_policy_age"] for r in rows], [r["frozen_acceptance_length"] for r in rows], "s--",
                label="draft model (frozen)")
    ax.set_xlabel("policy age (policy version - version the drafter was built from)")
    ax.set_ylabel("tokens per target forward")
    ax.set_title("Acceptance length vs policy age")
    ax.legend()
    files.append(_save(fig, out / "acceptance_vs_policy_age.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    w = 0.4
    ax.bar([s - w / 2 for s in steps], [r["rollout_s_baseline"] for r in rows], w, label="no speculation")
    ax.bar([s + w / 2 for s in steps], [r["rollout_s"] for r in rows], w, label=f"speculative ({drafter})")
    ax.set_xlabel("RL step")
    ax.set_ylabel("rollout wall time (s)")
    ax.set_title("Rollout time per step (same batch, same weights)")
    ax.legend()
    files.append(_save(fig, out / "rollout_time.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(steps, [r["reward_mean_baseline"] for r in rows], "o-", label="no speculation")
    ax.plot(steps, [r["reward_mean"] for r in rows], "x--", label=f"speculative ({drafter})")
    ax.set_xlabel("RL step")
    ax.set_ylabel("mean reward")
    ax.set_title("Reward curves (must agree: lossless)")
    ax.legend()
    files.append(_save(fig, out / "reward.png"))
    return files


def _save(fig, path: Path) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)
