"""Scenario files for the simulator: schema, loading, `key=value` overrides, clear errors.

A scenario is a YAML file (loaded with OmegaConf, so `${...}` interpolation works) that
describes one engine's hardware cost model, the cluster, the drafter and its acceptance, the
speculation and scheduling policies, the rollout workload, the RL step around the rollout,
the sweeps to plot, and optionally the published figures it should reproduce. Every key is
documented in docs/simulator.md. Unknown keys are errors; types are strict (schema.Strict: `true`
is not a number, "3" and 3.5 are not integers), numbers finite and within a plausible range, and
the sizes together within a work budget (`Scenario.work`; docs/simulator.md, "Limits"). Every
error names the file and the dotted key path (e.g. `scenario.acceptance.alpha: got 1.3; allowed:
...`), on one line per key.

The schema is split by block: `drafting` (drafter, acceptance, hybrid), `speculation`,
`workload` (cluster, workload, rl), `comparison` (baseline, sweep, calibration), their root
`schema.Scenario` with the checks across blocks, and `limits`; the cost blocks (model, hardware)
are cost/schema.py's. `files` finds scenarios, `profile` merges a hardware profile in, and `load`
reads, overrides and validates.

`extends: other.yaml` at the top level starts from another scenario (looked up next to the
file, then in configs/sim/) and overrides its keys. Reading, overrides (`key=value`, `+key=value`,
`++key=value`, `~key`) and interpolation are config/yaml_loader.py's.
"""
from __future__ import annotations

from nemo_rl_specdec.sim.scenario.comparison import METRICS, Baseline, Sweep
from nemo_rl_specdec.sim.scenario.drafting import Acceptance, Drafter, Hybrid, drafter_kinds
from nemo_rl_specdec.sim.scenario.files import SIM_CONFIGS, resolve_scenario_path, scenario_files
from nemo_rl_specdec.sim.scenario.limits import ScenarioError
from nemo_rl_specdec.sim.scenario.load import load_scenario, validate_scenario
from nemo_rl_specdec.sim.scenario.profile import with_profile
from nemo_rl_specdec.sim.scenario.schema import Scenario
from nemo_rl_specdec.sim.scenario.speculation import SpecScheduling, Speculation

__all__ = ["METRICS", "SIM_CONFIGS", "Acceptance", "Baseline", "Drafter", "Hybrid", "Scenario", "ScenarioError",
           "SpecScheduling", "Speculation", "Sweep", "drafter_kinds", "load_scenario", "resolve_scenario_path",
           "scenario_files", "validate_scenario", "with_profile"]
