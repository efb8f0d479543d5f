"""A scenario's limits: the plausible range of every number it holds (docs/simulator.md, "Limits";
the cost blocks' are cost/schema.py's), and the error an invalid scenario raises."""
from __future__ import annotations

from nemo_rl_specdec.cost.schema import CostError


class ScenarioError(CostError):
    """Invalid scenario; the message names the dotted key path, the value and what is allowed."""


# Each limit admits every bundled scenario and prediction with room to spare; outside it a number is a
# typo or would make the simulation overflow or run for hours.
MAX_PHASE_S = 86400.0             # RL phases and the weight update (seconds)
MAX_PROMPTS = 100_000             # workload.num_prompts
MAX_GENERATIONS = 1024            # workload.generations_per_prompt
MAX_HISTORY = 1024                # workload.history_rollouts
MAX_STEPS = 1000                  # rl.num_steps
MAX_POLICY_LAG = 100
MAX_ENGINES = 16_384              # cluster.num_engines, sweep.num_engines
MAX_TRAINING_GPUS = 1_000_000
MAX_K = 64                        # speculation.num_speculative_tokens
MAX_BUDGET_INTERVAL = 1_000_000
MAX_SWEEP_POINTS = 32
MAX_SEED = 2 ** 32 - 1
MAX_CURVE = 1024                  # acceptance curves and segments
MAX_FACTOR = 1000.0               # acceptance.by_response_position factors
MAX_SIGMA = 5.0                   # log-std of the lognormal lengths
MIN_SPREAD = 1e-3                 # acceptance.spread: 0, or a spread a Beta distribution can take
# work of one simulated run (baseline or speculative): requests and history draws, budget
# recomputations, acceptance segments and engine-steps, each counted as one event
# (`Scenario.work`); the largest bundled scenario needs about 0.22 M
MAX_EVENTS_PER_RUN = 1_000_000
# `speculation.scheduling.k: auto` prices every batch size 1..max_num_seqs at every d = 0..k
MAX_K_AUTO_EVALS = 65_536
