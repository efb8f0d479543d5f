"""The scenario's drafter blocks: `drafter` (cost/schema.py's `DraftCost`, its name a registered
or published drafter, which implies its kind), `acceptance` (how its drafts are accepted, by
position) and `hybrid` (the history half of a hybrid drafter, read from a bench result)."""
from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from nemo_rl_specdec.config.schema import PathError, short
from nemo_rl_specdec.cost.schema import MAX_STEP_COST_S, MAX_TOKENS, DraftCost, _Strict, _unit
from nemo_rl_specdec.drafters.base import HOST, PARALLEL, SEQUENTIAL
from nemo_rl_specdec.drafters.registry import registered
from nemo_rl_specdec.drafters.roles import PricedDrafter
from nemo_rl_specdec.resources import config_lookups
from nemo_rl_specdec.scheduling.budget import expected_accepted
from nemo_rl_specdec.sim import acceptance as acc
from nemo_rl_specdec.sim.scenario.files import first_line, is_path
from nemo_rl_specdec.sim.scenario.limits import MAX_CURVE, MAX_FACTOR, MAX_K

# the simulator's drafter kinds by how drafting costs (drafters/base.py: draft_cost)
SIM_KIND = {HOST: "list", SEQUENTIAL: "model", PARALLEL: "block"}
# published drafters the simulator prices that this package does not run (a registered drafter of the same
# name takes precedence)
PUBLISHED_DRAFTERS = {"dspark": "block"}


def drafter_kinds() -> dict:
    """Drafter name -> simulator kind: every registered drafter, plus the published ones."""
    return {**PUBLISHED_DRAFTERS, **{n: SIM_KIND[d.draft_cost] for n, d in registered(PricedDrafter).items()}}


class Drafter(DraftCost):
    """A scenario's drafter: `DraftCost` (cost/schema.py) whose `name` is a registered or published
    drafter, which implies its kind."""

    @model_validator(mode="after")
    def _kind(self):
        kinds = drafter_kinds()
        if self.name != "custom" and self.name not in kinds:
            raise PathError("name", self.name, f"one of {sorted(kinds) + ['custom']}")
        default = kinds.get(self.name)
        if self.kind is None:
            if default is None:
                raise ValueError("drafter 'custom' needs kind: list | model | block")
            self.kind = default
        elif default is not None and self.kind != default:
            raise ValueError(f"drafter {self.name!r} is a {default} drafter; kind={self.kind!r} contradicts it")
        return self.check_coverage()


class Acceptance(_Strict):
    """Exactly one of: alpha (position j accepted, given j-1 was, with probability
    alpha * decay**(j-1); decay 1 is geometric), conditional (those conditionals given
    directly), per_position (measured unconditional acceptance of positions 1, 2, ...),
    mean_accepted_length (tokens per step, bonus included, measured at `measured_at_k` drafts,
    default speculation.num_speculative_tokens; alpha is solved from it with the given decay, so changing k keeps
    the per-position acceptance when measured_at_k is given), or bench_json (a bench result's
    accepted_per_position). See sim/acceptance.py."""

    alpha: float | None = Field(None, ge=0, le=1)
    conditional: list[float] | None = None
    per_position: list[float] | None = None
    mean_accepted_length: float | None = Field(None, ge=1, le=MAX_K + 1)
    bench_json: str | None = Field(None, description="a `nemo-rl-specdec bench --json` file")
    bench_result: str | None = Field(None, description="the result's name in bench_json (default: the only one)")
    measured_at_k: int | None = Field(
        None, ge=1, le=MAX_K, description="the k at which mean_accepted_length was measured (default: "
        "speculation.num_speculative_tokens)"
    )
    decay: float = Field(1.0, gt=0, le=1, description="conditional acceptance falls by this factor per position")
    trained_depth: int | None = Field(
        None, ge=1, le=MAX_K, description="the deepest draft position the drafter was trained for (and its "
        "acceptance measured at): positions past it are credited no acceptance (none is extrapolated)")
    spread: float = Field(0.0, ge=0, le=0.5, description="std of a per-request alpha; keeps the mean accepted length")
    by_response_position: list[list[float]] | None = Field(
        None, description="[[from_position, factor], ...]: from that many response tokens on, a request's accepted "
        "drafts per step are multiplied by factor (never above its drafts); first from_position 0, ascending")

    @model_validator(mode="after")
    def _one(self):
        forms = ("alpha", "conditional", "per_position", "mean_accepted_length", "bench_json")
        given = [n for n in forms if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(forms)} (got {given or 'none'})")
        for key in ("conditional", "per_position"):
            v = getattr(self, key)
            if v is not None and (not 1 <= len(v) <= MAX_CURVE or any(not 0 <= x <= 1 for x in v)):
                raise PathError(key, v, f"a list of 1 to {MAX_CURVE} values from 0 to 1 (position 1 "
                                 "first)")
        if self.conditional is not None:
            self.per_position = acc.from_conditional(self.conditional)
        if self.bench_json is not None:
            try:
                self.per_position = acc.curve_from_bench(self.bench_json, self.bench_result)
            except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
                why = e if isinstance(e, (OSError, ValueError)) else f"{type(e).__name__}: {e}"
                raise PathError("bench_json", self.bench_json,
                                 f"a readable bench JSON ({short(why, 200)})") from None
        elif self.bench_result is not None:
            raise PathError("bench_result", self.bench_result, "null unless bench_json is given")
        if self.by_response_position is not None:
            pts = self.by_response_position
            ok = (pts and len(pts) <= MAX_CURVE and all(len(p) == 2 and 0 <= p[1] <= MAX_FACTOR for p in pts)
                  and pts[0][0] == 0 and all(a[0] < b[0] for a, b in zip(pts, pts[1:], strict=False))
                  and pts[-1][0] <= MAX_TOKENS)
            if not ok:
                raise PathError("by_response_position", pts,
                                 f"1 to {MAX_CURVE} [from_position, factor] pairs with the first from_position 0, "
                                 f"from_positions strictly ascending up to {MAX_TOKENS:,} and factors from 0 to "
                                 f"{MAX_FACTOR:g}")
        if self.per_position is not None:
            try:
                expected_accepted(self.per_position, len(self.per_position))  # validates the curve
            except ValueError as e:
                key = next(k for k in ("per_position", "conditional", "bench_json") if getattr(self, k) is not None)
                raise PathError(key, getattr(self, key), str(e)) from None
            for key in ("spread", "decay"):
                if getattr(self, key) != (0.0 if key == "spread" else 1.0):
                    raise PathError(key, getattr(self, key),
                                     "its default: it applies to alpha / mean_accepted_length, not to a measured curve")
        return self


class Hybrid(_Strict):
    """`hybrid`: the scenario's drafter is a hybrid (`drafters/machinery/hybrid_choice.py`): the
    `drafter` and `acceptance` blocks are its model half, and this block its history half, read from
    a `bench --suite hybrid --json` result (`bench_result`, default ``das_all``: DAS with every draft
    verified): its `coverage` (share of request-steps with a history draft) and
    `accepted_per_position` (acceptance of those drafts by position). At every event the engine
    applies `hybrid_choice.choose`: history drafts only, or the model half's `model_k` forwards too,
    each request taking the better of its two drafts; the history proposer's host time and the model
    half's first forward (the engine runs it where the model half is skipped too: it writes the
    head's KV of the verified tokens) are paid on every step."""

    bench_json: str = Field(description="a `nemo-rl-specdec bench --suite hybrid --json` file (a path, or relative "
                            "to configs/sim/)")
    bench_result: str = Field("das_all", description="the history half's result in bench_json")
    profile_entry: str = Field("das", description="with hardware_profile: the entry pricing the history proposer")
    per_request_s: float = Field(0.0, ge=0, le=MAX_STEP_COST_S, description="history proposer host time per request "
                                 "per step", **_unit("s"))
    step_overhead_s: float = Field(0.0, ge=0, le=MAX_STEP_COST_S, description="history proposer host time per step",
                                   **_unit("s"))
    model_k: int | None = Field(None, ge=1, le=MAX_K, description="the model half's draft depth (forwards when it "
                                "runs; default speculation.num_speculative_tokens)")
    replicas: int = Field(20, ge=1, le=1000, description="a request stands for this many, round(coverage * replicas) "
                          "of them with a history draft (the coverage's resolution)")
    coverage: float | None = Field(None, description="read from bench_json (not given)")
    per_position: list[float] | None = Field(None, description="read from bench_json (not given)")

    @model_validator(mode="after")
    def _read(self):
        import json

        if self.coverage is not None or self.per_position is not None:
            raise PathError("coverage", self.coverage, "not given: both are read from hybrid.bench_json")
        path = next((p for p in [Path(self.bench_json), *config_lookups(self.bench_json, "sim")] if is_path(p, "file")),
                    None)
        if path is None:
            raise PathError("bench_json", self.bench_json, "a bench JSON file (a path, or relative to "
                             "configs/sim/)")
        try:
            rows = {r.get("name"): r for r in json.loads(path.read_text()).get("results", [])}
            row = rows[self.bench_result]
            cov, curve = float(row["coverage"]), acc.monotone_curve(row["accepted_per_position"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise PathError("bench_json", self.bench_json, f"a bench --suite hybrid JSON with a result "
                             f"{self.bench_result!r} carrying coverage and accepted_per_position "
                             f"({short(first_line(e), 200)})") from None
        if not 0 < cov <= 1 or not curve:
            raise PathError("bench_json", self.bench_json, f"result {self.bench_result!r} with coverage in "
                             f"(0, 1] and a non-empty accepted_per_position (got {cov}, {curve})")
        self.coverage, self.per_position = cov, curve
        return self
