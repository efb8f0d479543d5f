"""What drafters are built from, not drafters themselves (the plugins are the files one level up).

- `store`, `staging`: the DAS rollout store (suffix trees per problem and global, versioned,
  memory-capped) and its rebuild staged between engine steps;
- `calibration`: acceptance by draft position and source, learned from verified drafts (DAS,
  the judged n-gram, and `scheduling.k: auto` for model drafters);
- `step_cost`: the engine's online step-cost fit (the same users, and the simulator's CPU fit);
- `adaptive`: the per-step rule (`scheduling.budget: adaptive`, `auto_disable`) and `StepJudge`;
- `proposer`: what our vLLM custom_class proposers (DAS, the judged n-gram) share.
"""
