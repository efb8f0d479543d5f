"""What drafters are built from, not drafters themselves (the plugins are the files one level up).

- `store`, `staging`: the DAS rollout store (suffix trees per problem and global, versioned,
  memory-capped) and its rebuild staged between engine steps;
- `calibration`: acceptance by draft position and source, learned from verified drafts (DAS,
  the judged n-gram, and `scheduling.k: auto` for model drafters);
- `step_judge`: the per-step rule (`scheduling.budget: adaptive`, `auto_disable`) and `StepJudge`
  (its step cost is the engine's online fit, `cost/online.py`);
- `hybrid_choice`: the hybrid drafter's per-step rule (history drafts only, or the model half's
  forward too, and per request the better of the two drafts);
- `proposer`: what our vLLM custom_class proposers (DAS, the judged n-gram) share.
- `checkpoint`: a model drafter's checkpoint read from safetensors, loaded into its module and
  checked (DFlash, Eagle3, MTP).
"""
