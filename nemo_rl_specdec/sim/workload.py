"""Rollout batches: response lengths with GRPO group structure, and the length history the
predictor has seen.

A batch holds `num_prompts` problems, each sampled `generations_per_prompt` times, laid out
prompt-major (a group's samples are adjacent, as NeMo-RL builds its batch). Lengths are drawn
per scenario (`workload.lengths`): a parametric long tail with per-problem medians, or measured
lengths. The predictor's history for a problem is `history_rollouts` earlier, independent
draws of the same problem (its rollouts from an earlier epoch). Everything is drawn from one
seeded generator, so a baseline run and a speculative run see the same batches.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Batch:
    step: int
    problem_ids: list[str]          # per request
    lengths: np.ndarray             # per request, response tokens (int)
    prompt_lens: np.ndarray         # per request
    history: list[tuple[str, int]] = field(default_factory=list)  # (problem_id, length) seen before

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def total_tokens(self) -> int:
        return int(self.lengths.sum() + self.prompt_lens.sum())


def _problem_sampler(wl, rng: np.random.Generator):
    """A function drawing m lengths of one new problem, and its history draws."""
    L = wl.lengths

    def clip(x):
        return np.clip(np.rint(x), L.min_len, L.max_len).astype(int)

    if L.dist == "lognormal":
        mu = np.log(L.median) + L.sigma_between * rng.standard_normal()
        return lambda m: clip(np.exp(mu + L.sigma_within * rng.standard_normal(m)))
    if L.dist == "values":
        vals = np.asarray(L.values)
        return lambda m: clip(rng.choice(vals, size=m, replace=True))
    group = np.asarray(L.groups[int(rng.integers(len(L.groups)))])
    return lambda m: clip(rng.choice(group, size=m, replace=True))


def make_batches(wl, num_steps: int, seed: int, num_prompts: int | None = None) -> list[Batch]:
    """`num_steps` batches for workload config `wl` (a scenario's `workload`)."""
    rng = np.random.default_rng(seed)
    P = wl.num_prompts if num_prompts is None else num_prompts
    G = wl.generations_per_prompt
    out = []
    for s in range(num_steps):
        pids, lens, hist = [], [], []
        for p in range(P):
            pid = f"s{s}p{p}"
            draw = _problem_sampler(wl, rng)
            lens.append(draw(G))
            pids += [pid] * G
            if wl.history_rollouts:
                hist += [(pid, int(x)) for x in draw(wl.history_rollouts)]
        lengths = np.concatenate(lens)
        out.append(Batch(s, pids, lengths, np.full(len(lengths), wl.prompt_len, dtype=int), hist))
    return out
