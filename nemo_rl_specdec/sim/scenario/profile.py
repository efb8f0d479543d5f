"""A scenario's `hardware_profile: NAME`: the target's shape, the roofline and the drafter's costs
taken from a hardware profile (configs/hardware/, cost/profile.py), the one cost model the priced
benches use."""
from __future__ import annotations

from pydantic import ValidationError

from nemo_rl_specdec.config import yaml_loader
from nemo_rl_specdec.config.schema import short
from nemo_rl_specdec.cost.profile import load_profile, profile_path
from nemo_rl_specdec.cost.schema import CostError
from nemo_rl_specdec.sim.scenario.drafting import Drafter
from nemo_rl_specdec.sim.scenario.limits import ScenarioError

PROFILE_GIVES = {"model": None, "hardware": ("roofline", "c_base_s", "c_tok_s", "c_ctx_s", "c_seq_s", "fit_samples"),
                 "drafter": ("kind", "model", "fwd_base_s", "tok_s", "ctx_s", "per_request_s", "step_overhead_s")}


def with_profile(raw: dict, where: str = "") -> dict:
    """`raw` with `hardware_profile: NAME` (configs/hardware/, cost/profile.py) replaced by what the
    profile prices: the target's shape (`model`), the roofline (`hardware.roofline`, and
    `memory_bytes` unless given), and the costs of the drafter named by `drafter.name`
    (`drafter.profile_entry` names another entry, e.g. `das` or `vllm_suffix` for the suffix
    drafter): the one cost model the priced benches use."""
    raw = dict(raw)
    name = raw.pop("hardware_profile")
    if not isinstance(name, str):
        raise ScenarioError(f"{where}hardware_profile: got {name!r}; allowed: a profile name in configs/hardware/")
    for key in ("hardware", "drafter", "hybrid"):
        if raw.get(key) is not None and not isinstance(raw[key], dict):
            raise ScenarioError(f"{where}{key}: got {short(raw[key])}; allowed: a mapping of settings")
    for key, fields in PROFILE_GIVES.items():
        given = raw.get(key) or {}
        clash = ([key] if fields is None and key in raw and raw[key] is not None else
                 [f"{key}.{f}" for f in (fields or ()) if isinstance(given, dict) and given.get(f) is not None])
        if clash:
            got = given if fields is None else given[clash[0].split(".")[1]]
            raise ScenarioError(f"{where}{clash[0]}: got {short(got)}; allowed: null with hardware_profile ({name} "
                                "gives it)")
    try:
        path = profile_path(name)
    except CostError as e:
        raise ScenarioError(f"{where}hardware_profile: {e}") from None
    prof = yaml_loader.load(path, error=ScenarioError, what="hardware profile")
    dr = {k: v for k, v in dict(raw.get("drafter") or {}).items() if v is not None}
    entry = dr.pop("profile_entry", dr.get("name", Drafter().name))
    entries = prof.get("drafters") or {}
    if entry not in entries:
        raise ScenarioError(f"{where}drafter.profile_entry: {path}: drafters.{entry}: not in this hardware profile; "
                            f"it prices {sorted(entries)}")
    try:
        d = Drafter.model_validate(entries[entry])   # the entry's kind checked against the registry
        d.fwd_base_s = load_profile(str(path)).drafter(entry).fwd_base_s   # as the profile prices it
    except (ValidationError, ValueError, KeyError, CostError) as e:
        raise ScenarioError(f"{where}hardware_profile: {path}: {short(e, 300)}") from None
    raw["model"] = prof["model"]
    hw = {k: v for k, v in dict(raw.get("hardware") or {}).items() if v is not None}
    hw["roofline"] = prof["hardware"]["roofline"]
    hw.setdefault("memory_bytes", prof["hardware"].get("memory_bytes"))
    hw.setdefault("name", prof["hardware"].get("name", name))
    raw["hardware"] = hw
    dr.setdefault("name", d.name)
    if dr["name"] != d.name:
        raise ScenarioError(f"{where}drafter.name: got {dr['name']!r}; {name}'s entry {entry!r} prices {d.name!r}")
    dr.update(d.model_dump(mode="json", include={"kind", "model", "fwd_base_s", "tok_s", "ctx_s", "per_request_s",
                                                 "step_overhead_s"}))
    raw["drafter"] = dr
    hy = raw.get("hybrid")
    if isinstance(hy, dict):
        hy = {key: v for key, v in hy.items() if v is not None}
        h_entry = hy.get("profile_entry", "das")
        h = entries.get(h_entry)
        if not isinstance(h, dict) or not (h.get("per_request_s") or h.get("step_overhead_s")):
            raise ScenarioError(f"{where}hybrid.profile_entry: {path}: drafters.{h_entry}: not a history proposer's "
                                f"entry with its host time; it prices {sorted(entries)}")
        clash = [f for f in ("per_request_s", "step_overhead_s") if f in hy]
        if clash:
            raise ScenarioError(f"{where}hybrid.{clash[0]}: got {hy[clash[0]]!r}; allowed: null with hardware_profile "
                                f"({name} gives it)")
        raw["hybrid"] = {**hy, "per_request_s": float(h.get("per_request_s") or 0.0),
                         "step_overhead_s": float(h.get("step_overhead_s") or 0.0)}
    return raw
