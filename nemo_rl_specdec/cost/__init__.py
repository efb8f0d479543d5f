"""A GPU's step cost: the one function every priced figure comes from.

- `model`: the step cost (`CostModel.step_cost`): the target forward on a roofline (or the linear
  form), the drafter's forwards, and a history proposer's host time;
- `schema`: the cost blocks (target and draft shapes, hardware, a drafter's costs) and their errors;
- `profile`: hardware profiles (``configs/hardware/``), one GPU and target model each;
- `trace`: what an engine did, step by step;
- `price`: a trace's rollout time on a profile, and the per-step rules' costs from a profile;
- `fit`: the fits of the function's parameters (the roofline on timed forwards, the linear form's
  non-negative least squares with its outlier refit);
- `online`: the engine's online fit of the linear form on its own steps, and what the per-step
  rules read of a step cost (`StepCostSource`: that fit, or `price`'s `PricedStepCost`).

It sits below drafters/, scheduling/ and sim/, which all call it.
"""
