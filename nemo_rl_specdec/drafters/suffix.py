"""The `suffix` drafter: DAS, a training-free drafter that speculates from the policy's recent
rollouts (`suffix.backend: das`, the default), or vLLM's built-in suffix decoding (`backend: vllm`).

`Suffix` declares the drafter (its `suffix:` sub-block, refresh modes, vLLM mapping).
`DASProposer` is a vLLM ``custom_class`` proposer (``speculative_config={"method":
"custom_class", "model": "nemo_rl_specdec.drafters.suffix.DASProposer", ...}``).
Its state is a :class:`~nemo_rl_specdec.drafters.machinery.store.RolloutStore` of recent rollouts
(per-problem and global arctic-inference suffix trees, windowed by policy version), refreshed
through the lockstep update (``refresh.mode: rebuild``): the worker extension calls
:meth:`DASProposer.specdec_rebuild` with the step's rollouts and the new policy version, or, when
the rollouts were handed over as the rollout ended (``Engine.stage_rollouts``), installs the
rebuild staged for exactly that version (:mod:`~nemo_rl_specdec.drafters.machinery.staging`).

Per request and per engine step, :meth:`DASProposer.propose`:

- reads the problem id and the speculation budget from ``SamplingParams.extra_args``
  (``problem_id``, ``specdec_budget``; budget 0 means no drafts); a request that outlives its
  predicted length (``specdec_predicted_len``, output tokens) is promoted to the full k: the
  prediction that withheld its drafts was wrong, and it is now the tail that sets the makespan;
- feeds back how many tokens of its previous draft vLLM accepted (``len(sampled_token_ids[row])
  - 1``) into an :class:`~nemo_rl_specdec.drafters.machinery.calibration.AcceptanceCalibration`;
- matches the request's own context (prompt + verified output so far, last ``max_match_len``
  tokens: arctic re-walks the tree from the root for every match length, so the cost grows with
  the square of the matched tail, and trees are built only ``max_match_len - 1 + min(k,
  max_spec_factor x max_match_len)`` deep, as deep as such a query reads) in the trees its
  scope allows (problem tree, global tree; a request without a problem id uses the global tree
  and is counted in ``no_problem_id``), and
  keeps the draft with more calibrated expected accepted tokens; the global tree is skipped
  only when it cannot win;
- shares its verified tokens with its siblings (same problem id) through the store as it
  generates, settled exactly at the next rebuild: while its problem has no stored rollouts
  (``suffix.share_in_flight: cold``, the default), always, or never (``off``);
- if the store's draft is shorter than allowed, also tries a per-request tree of the
  request's own prompt and output (prompt-lookup style) and keeps the draft with more
  calibrated expected accepted tokens;
- while a rebuild is staged (:meth:`DASProposer.specdec_stage`, installed at the update by
  :meth:`DASProposer.specdec_install_staged`), reads and writes nothing in the store: drafts
  then come from the per-request tree only (``fenced_rows``);
- lets the draft length follow the match: at most ``max_spec_factor`` x match length, tokens
  only while their frequency-estimated probability is >= ``min_token_prob``, and never more than
  min(num_speculative_tokens, budget, the k of ``scheduling.k_by_batch_size`` at the step's batch
  size, tokens left before max_model_len): vLLM applies that schedule to its own proposers only,
  so DAS applies it itself. More than k drafts
  would kill the engine, so the clamp is unconditional;
- with ``scheduling.budget: adaptive``, then cuts every request's draft to the length that
  maximises the step's committed tokens per second (:mod:`~nemo_rl_specdec.drafters.machinery.step_judge`),
  from the calibrated acceptance of each draft token and the engine's step cost fitted online
  from the time between calls (:mod:`~nemo_rl_specdec.cost.online`;
  drafts are not cut during its warm-up). A step where no draft token pays for itself drafts
  nothing; each switch between drafting and not is logged with the numbers behind it. Under the
  other budgets, ``auto_disable`` (on by default) applies the all-or-nothing form: a step keeps
  every draft, or none where they are predicted to lose. Steps turned off are counted by
  batch-size bin (``off_by_batch``).

vLLM's rejection sampler verifies every draft against the target, so outputs are exactly the
policy's (greedy: identical; T > 0: same distribution).
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from nemo_rl_specdec.config.schema import PathError, schedule_lookup
from nemo_rl_specdec.drafters.base import HOST, LIST, Drafter
from nemo_rl_specdec.drafters.machinery.calibration import SOURCES, AcceptanceCalibration, resolve_withheld
from nemo_rl_specdec.drafters.machinery.proposer import SpecdecProposer
from nemo_rl_specdec.drafters.machinery.staging import StagedRebuild
from nemo_rl_specdec.drafters.machinery.store import RolloutStore, StoreInputError
from nemo_rl_specdec.drafters.roles import Block, DrafterSettings
from nemo_rl_specdec.rollouts import RolloutBatch

log = logging.getLogger("nemo_rl_specdec")


class SuffixConfig(DrafterSettings):
    """DAS suffix-tree drafter built from recent rollouts (or vLLM's built-in `suffix`)."""

    # vLLM's own default for method suffix (its tree depth): at a small batch a deep draft is nearly free
    # on a GPU; DAS's per-step rule cuts each draft by the step's cost (machinery/step_judge.py)
    default_k: ClassVar[int] = 24

    backend: Literal["das", "vllm"] = "das"
    window_steps: int = Field(4, ge=1, description="policy versions kept in the rollout store")
    scope: Literal["problem", "global", "both"] = "both"
    max_tree_depth: int = Field(64, ge=1, le=4096)
    max_match_len: int = Field(16, ge=2, le=4096, description="das backend: tokens of a request's tail matched "
                               "against the trees per step (arctic's matching cost grows with its square)")
    max_spec_factor: float = Field(1.0, gt=0)
    min_token_prob: float = Field(0.1, ge=0, le=1)
    max_memory_mb: float = Field(512.0, gt=0, description="store cap; oldest versions evicted first")
    max_cached_requests: int = Field(10000, ge=0, description="vllm backend only")
    share_in_flight: Literal["cold", "always", "off"] = Field(
        "cold", description="das backend: running requests share their verified tokens with same-problem siblings "
        "through the store while their problem has no stored rollouts (cold), always, or never (off)")

    @field_validator("share_in_flight", mode="before")
    @classmethod
    def _yaml_off(cls, v: Any) -> Any:
        # YAML 1.1 (OmegaConf, Hydra) reads an unquoted `off` as the boolean false
        return "off" if v is False else v

    @model_validator(mode="after")
    def _read_by_backend(self) -> SuffixConfig:
        """A key the chosen backend does not read keeps its default: set otherwise, it would do nothing."""
        for other, keys in _READ_ONLY_BY.items():
            for key in keys if other != self.backend else ():
                default = type(self).model_fields[key].default
                if getattr(self, key) != default:
                    raise PathError(key, getattr(self, key), f"its default ({default!r}) with backend "
                                    f"{self.backend!r}: only backend {other!r} reads it")
        return self


# backend -> the suffix keys only that backend reads
_READ_ONLY_BY = {"das": ("window_steps", "scope", "max_match_len", "max_memory_mb", "share_in_flight"),
                 "vllm": ("max_cached_requests",)}


def for_backend(block: dict, backend: str) -> dict:
    """`block` (a suffix sub-block as a dict) switched to `backend`, with the keys only the other
    backend reads back at their defaults."""
    reset = {k: SuffixConfig.model_fields[k].default
             for other, keys in _READ_ONLY_BY.items() if other != backend for k in keys}
    return {**block, "backend": backend, **reset}


def _backend_overrides(backend: str) -> tuple:
    """for_backend as `key=value` overrides relative to the speculative block (bench rows)."""
    return tuple(f"suffix.{k}={v}" for k, v in for_backend({}, backend).items())


class Suffix(Drafter):
    """What both suffix backends share: the sub-block, arctic's suffix trees in the workers."""

    name = "suffix"
    kind = LIST
    draft_cost = HOST
    config = SuffixConfig
    worker_modules = ("arctic_inference.suffix_decoding",)  # both backends build arctic's suffix trees
    variants = (("suffix (DAS)", _backend_overrides("das")),
                ("suffix (vLLM)", (*_backend_overrides("vllm"), "refresh.mode=frozen")))


class DAS(Suffix):
    """`suffix.backend: das`: our proposer (`DASProposer`) over a store of recent rollouts."""

    backend = "das"
    refresh_modes = ("rebuild", "frozen")
    judges_steps = True
    takes_request_budgets = True
    cost_entry = "das"

    def vllm_config(self, spec: Block, temperature: float) -> dict:
        return {"method": "custom_class", "model": f"{__name__}.DASProposer",
                "num_speculative_tokens": spec.num_speculative_tokens}

    def rollout_prompt_tail(self, spec: Block) -> int | None:
        # the store keeps a prompt's last max_tree_depth - 1 tokens: a match never reaches further back
        return spec.suffix.max_tree_depth - 1


class VllmSuffix(Suffix):
    """`suffix.backend: vllm`: vLLM's suffix decoding, whose cache learns from the engine's own finished
    requests (it takes no rollouts)."""

    backend = "vllm"
    described = "drafter 'suffix' with suffix.backend 'vllm' (it takes no rollouts; DAS does)"
    refresh_modes = ("frozen",)
    caches_own_requests = True
    cost_entry = "vllm_suffix"

    def vllm_config(self, spec: Block, temperature: float) -> dict:
        s = spec.suffix
        return {"method": "suffix", "num_speculative_tokens": spec.num_speculative_tokens,
                "suffix_decoding_max_tree_depth": s.max_tree_depth,
                "suffix_decoding_max_cached_requests": s.max_cached_requests,
                "suffix_decoding_max_spec_factor": s.max_spec_factor,
                "suffix_decoding_min_token_prob": s.min_token_prob}


TRACE_LIMIT = 1_000_000  # drafts kept when tracing is on (tests, debugging)
_SOURCE_INDEX = {s: i for i, s in enumerate(SOURCES)}
_LOCAL = _SOURCE_INDEX["local"]


@dataclass
class _ReqState:
    problem_id: str | None
    budget: int  # max drafts for this request (already clamped to k)
    prompt_len: int = 0
    predicted: float | None = None  # predicted output length; past it the budget becomes k
    local: Any = None  # arctic SuffixTree of this request's own prompt + output, built lazily
    local_upto: int = 0  # tokens of the context already in `local`
    live_id: int | None = None  # this request's in-flight entry in the store
    live_upto: int = 0  # tokens of the context already in the in-flight entry
    last_src: int = -1  # source index of the draft proposed at the last step (-1: none), for calibration
    last_probs: Any = None  # its tokens' tree-estimated path probabilities
    # drafts computed at the last steps but not proposed: (source, probs, tokens not yet compared with
    # what the target produced, tokens matched so far); resolved against the realized tokens
    others: list = field(default_factory=list)


@dataclass
class _Step:
    """One step's lookups (`DASProposer.lookup`), before the per-step rule cuts them and `emit` proposes them."""

    rows: int
    pending: list  # (row, request id, state, tokens, probs, source index) of every draft
    verified: int  # requests whose last step verified something (decode rows)
    ctx_sum: int
    new_rows: bool  # a request seen for the first time: the step that just ran prefilled it
    judged: bool  # the proposer's own per-step rule applies
    skipped: bool  # its batch-size bin is off: no lookups were made
    grew: bool  # the store's in-flight entries grew
    seen: set
    t0: float
    cpu0: float


def _rollout_rows(rollouts: Any) -> RolloutBatch | list:
    """The rollouts as the store reads them: a RolloutBatch in place, else a list of records, engine
    rollouts or dicts (`rollouts.as_record`); the store validates them."""
    if rollouts is None or isinstance(rollouts, (dict, str, bytes)):
        raise StoreInputError(f"rollouts: expected a list of rollout dicts, got {type(rollouts).__name__}")
    return rollouts if isinstance(rollouts, RolloutBatch) else list(rollouts)


def _k_lookup(table: Sequence[Sequence[int]] | None, k: int) -> list | None:
    """`scheduling.k_by_batch_size` (validated `[[lo, hi, k], ...]`) as a dense lookup by batch size up
    to its last range, index 0 unused (`schema.schedule_lookup` at each size, capped at `k`). None: no
    table."""
    if not table:
        return None
    return [0] + [schedule_lookup(table, b, k) for b in range(1, max(int(hi) for _, hi, _ in table) + 1)]


def _suffix_settings(spec: dict | None) -> dict:
    """The `suffix` sub-block of the speculative block, validated with the config schema."""
    raw = dict((spec or {}).get("suffix") or {})
    return SuffixConfig(**raw).model_dump()


class DASProposer(SpecdecProposer):
    """vLLM custom_class proposer over a windowed, per-problem rollout store (see module docstring)."""

    metrics_prefix = "das"

    def __init__(self, vllm_config: Any):
        sc = vllm_config.speculative_config
        self.k = int(sc.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.runner = None
        self.use_local = True
        self.version = 0  # policy version installed by the last rebuild: tags in-flight entries
        self._reqs: dict = {}
        self.trace: list | None = None
        self.counters = {"calls": 0, "rows": 0, "drafts": 0, "draft_tokens": 0, "from_problem": 0,
                         "from_global": 0, "from_local": 0, "budget_zero": 0, "budget_promoted": 0, "propose_s": 0.0,
                         "propose_cpu_s": 0.0,
                         "rebuilds": 0, "rebuild_s": 0.0, "rollouts_added": 0, "no_problem_id": 0,
                         "fenced_rows": 0, "staged": 0, "rebuild_bg_s": 0.0, "rebuild_bg_cpu_s": 0.0}
        self._staged: StagedRebuild | None = None
        # the last staged rebuild installed: its version, the install's wait (the critical path) and
        # the rebuild's own wall and CPU seconds on its thread(s)
        self.last_install: dict | None = None
        self._from = [0] * len(SOURCES)  # drafts per source within one propose call
        self.configure(None)

    # ------------------------------------------------------------------ lifecycle
    def configure(self, spec: dict | None) -> None:
        """(Re)build the store from the speculative block (`None`: schema defaults). Drops content."""
        s = _suffix_settings(spec)
        self._drop_staged()
        self.settings = s
        self.share = s["share_in_flight"]  # in-flight sharing between siblings: cold | always | off
        # a query matches at most match_len - 1 tokens of the request's tail and drafts at most
        # min(k, max_spec_factor x match length) more, so nodes deeper than that are never read: trees
        # that deep give the same drafts as max_tree_depth-deep ones, and insertion (cost grows with
        # depth) is cheaper
        self.match_len = min(int(s["max_tree_depth"]), int(s["max_match_len"]))
        self.max_spec_factor = float(s["max_spec_factor"])
        reach = min(max(1, self.k), math.ceil(self.max_spec_factor * self.match_len))
        self.depth = min(int(s["max_tree_depth"]), self.match_len - 1 + reach)
        self.calibration = AcceptanceCalibration()
        self.min_token_prob = float(s["min_token_prob"])
        self.store = RolloutStore(window_steps=s["window_steps"], scope=s["scope"], max_tree_depth=self.depth,
                                  max_memory_bytes=float(s["max_memory_mb"]) * 2**20)
        self.judge = self.make_judge("DAS", spec)
        self.k_by_batch = _k_lookup(((spec or {}).get("scheduling") or {}).get("k_by_batch_size"), self.k)
        self._reqs.clear()

    def specdec_rebuild(self, rollouts: Any, version: int) -> int:
        """Refresh (rebuild mode): add the step's rollouts, slide the window to the new policy version,
        enforce the memory cap. Rollouts: a RolloutBatch, or records, engine `Rollout`s or dicts
        {problem_id, prompt_token_ids, token_ids, policy_version}. Returns the number added."""
        from nemo_rl_specdec.lockstep import DrafterRefreshError

        t0 = time.perf_counter()
        if self._staged is not None:
            raise DrafterRefreshError(f"DAS: the update to policy version {version} carries rollouts, but a rebuild "
                                      f"for version {self._staged.version} is staged; install or drop it first")
        try:
            added = self.store.rebuild(_rollout_rows(rollouts), version)
        except StoreInputError as e:
            raise DrafterRefreshError(f"DAS store rebuild for policy version {version} rejected its input: {e}") from e
        self._installed(int(version), added)
        self.counters["rebuild_s"] += time.perf_counter() - t0
        return added

    def _installed(self, version: int, added: int) -> None:
        self.version = version
        for st in self._reqs.values():  # in-flight entries were settled: running requests start new ones
            st.live_id = None
        self.counters["rebuilds"] += 1
        self.counters["rollouts_added"] += added

    def specdec_stage(self, rollouts: Any, version: int) -> dict:
        """Start rebuilding the store for policy `version` from a step's final rollouts on a background
        thread (see :mod:`~nemo_rl_specdec.drafters.machinery.staging`); :meth:`specdec_install_staged` at the
        update installs it. From now until then the store is fenced: no draft reads it. More rollouts
        for the version already staged are appended (rebuilt after the staged ones, installed with them)."""
        from nemo_rl_specdec.lockstep import DrafterRefreshError

        version = int(version)
        before = self._staged
        if before is not None and before.version != version:
            raise DrafterRefreshError(f"DAS: cannot stage rollouts for policy version {version}: a rebuild for "
                                      f"version {before.version} is already staged and not installed")
        if version <= self.version:
            raise DrafterRefreshError(f"DAS: cannot stage rollouts for policy version {version}: the store already "
                                      f"serves version {self.version} (versions only move forward)")
        try:
            rows = _rollout_rows(rollouts)
        except StoreInputError as e:
            raise DrafterRefreshError(f"DAS store rebuild for policy version {version} rejected its input: {e}") from e
        store = self.store
        self._staged = StagedRebuild(version, lambda: store.rebuild(rows, version), after=before)
        self.counters["staged"] += 1
        return {"staged_version": version, "rollouts": len(rows), "appended": before is not None}

    def specdec_wait_staged(self, timeout: float | None = None) -> bool:
        """Wait up to `timeout` seconds for the staged rebuild to finish (True if none is pending)."""
        job = self._staged
        return True if job is None else job.wait(timeout)

    def specdec_install_staged(self, version: int) -> int:
        """Install the staged rebuild as policy `version`: wait for what is left of it (the critical-path
        cost, counted in ``rebuild_s``), check that it was staged for this very version, unfence the
        store. Returns the number of rollouts added."""
        from nemo_rl_specdec.lockstep import DrafterRefreshError

        version = int(version)
        job = self._staged
        if job is None:
            raise DrafterRefreshError(f"DAS: the update to policy version {version} uses staged rollouts, "
                                      "but none were staged")
        if job.version != version:
            raise DrafterRefreshError(f"DAS: the staged rollouts are for policy version {job.version}, but the "
                                      f"update installs version {version}; the store stays fenced and generation "
                                      "is refused until an update for the staged version lands")
        t0 = time.perf_counter()
        job.wait()
        self._staged = None
        wait_s = time.perf_counter() - t0
        self.last_install = {"version": version, "wait_s": wait_s, "rebuild_s": job.busy_s,
                             "rebuild_cpu_s": job.thread_cpu_s}
        self.counters["rebuild_s"] += wait_s
        self.counters["rebuild_bg_s"] += job.busy_s
        self.counters["rebuild_bg_cpu_s"] += job.thread_cpu_s
        if job.error is not None:
            e = job.error
            if isinstance(e, StoreInputError):
                raise DrafterRefreshError(f"DAS store rebuild for policy version {version} rejected its input: "
                                          f"{e}") from e
            raise DrafterRefreshError(f"DAS store rebuild for policy version {version} failed: {e!r}") from e
        assert job.added is not None   # a job that ended without an error counted what it added
        self._installed(version, job.added)
        return job.added

    def _drop_staged(self) -> None:
        job, self._staged = getattr(self, "_staged", None), None
        if job is not None:
            job.wait()

    def specdec_export_state(self) -> dict:
        """What a checkpoint carries of this proposer: the store's window as the next update installs it
        (a staged rebuild is waited for, and the version it is for kept), the policy version the store
        serves, the acceptance calibration and the per-step rule's state."""
        from nemo_rl_specdec.lockstep import DrafterRefreshError

        job = self._staged
        if job is not None:
            job.wait()
            if job.error is not None:
                raise DrafterRefreshError(f"DAS: the store rebuild staged for policy version {job.version} failed "
                                          f"({job.error!r}): there is no window to save")
        return {"version": self.version, "staged_version": None if job is None else job.version,
                "depth": self.depth, "store": self.store.export(), "calibration": self.calibration.state_dict(),
                "judge": self.judge.state_dict()}

    def specdec_restore_state(self, state: dict) -> int:
        """Restore `specdec_export_state` (at a resume, before anything drafts): the window, calibration
        and rule; the store serves the saved version, and rollouts staged then are part of the window
        (the first update installs nothing new for them). Returns the entries restored."""
        from nemo_rl_specdec.lockstep import DrafterRefreshError

        if int(state["depth"]) != self.depth:
            raise DrafterRefreshError(f"DAS: the saved window was built with tree depth {state['depth']}, this "
                                      f"engine's is {self.depth} (suffix.max_tree_depth, max_match_len, k)")
        self._drop_staged()
        try:
            n = self.store.restore(state["store"])
            self.calibration.load_state_dict(state["calibration"])
            self.judge.load_state_dict(state["judge"])
        except (StoreInputError, ValueError, KeyError) as e:
            raise DrafterRefreshError(f"DAS: the saved state does not restore: {e}") from e
        self.version = int(state["version"])
        self._reqs.clear()
        return n

    def specdec_stats(self) -> dict:
        """Store contents, counters, settings. While a staged rebuild is still running on its thread
        the store is not read (it is being written): ``store`` then says which version is staged."""
        job = self._staged
        if job is not None and not job.done:
            store = {"staged_version": job.version, "rebuilding": True}
        else:
            store = self.store.stats()
        return {"store": store, "counters": dict(self.counters), "active_requests": len(self._reqs),
                "k": self.k, "settings": dict(self.settings), "staged_version": job.version if job else None,
                "calibration": self.calibration.table(), **self.judge.stats()}

    def acceptance_metrics(self) -> dict:
        """Per draft source and probability bin (`<source>/bin<b>`: the tree's path probability in
        [b/10, (b+1)/10), bin 10 is p = 1): acceptance per match confidence."""
        return {f"{src}/bin{b}": r for i, src in enumerate(SOURCES) for b, r in enumerate(self.calibration.rates[i])}

    def specdec_trace(self, enable: bool = True) -> list:
        """Start (clear) or stop recording every proposed draft as (req_id, problem_id, tokens).
        Returns what was recorded so far."""
        prev = self.trace or []
        self.trace = [] if enable else None
        return prev

    # ------------------------------------------------------------------ proposing
    def _request_state(self, req_id: str, row: int) -> _ReqState:
        extra = None
        req = self.runner.requests.get(req_id) if self.runner is not None else None
        if req is not None and req.sampling_params is not None:
            extra = req.sampling_params.extra_args
        prompt = getattr(req, "prompt_token_ids", None) if req is not None else None
        if prompt is not None:
            prompt_len = len(prompt)
        else:
            npt = getattr(self.runner.input_batch, "num_prompt_tokens", None)
            prompt_len = int(npt[row]) if npt is not None else 0
        extra = extra or {}
        pid = extra.get("problem_id")
        if pid is not None and not isinstance(pid, str):
            pid = str(pid)
        if pid is None:  # drafts from the global tree only (scope problem: the id-less rollouts' tree)
            self.counters["no_problem_id"] += 1
        budget = self.k
        b = extra.get("specdec_budget")
        if b is not None:
            try:
                budget = max(0, min(self.k, int(b)))
            except (TypeError, ValueError):
                log.warning("DAS: request %s has a non-integer specdec_budget %r; using k=%d", req_id, b, self.k)
        pred = extra.get("specdec_predicted_len")
        try:
            pred = None if pred is None else float(pred)
        except (TypeError, ValueError):
            log.warning("DAS: request %s has a non-numeric specdec_predicted_len %r; ignored", req_id, pred)
            pred = None
        st = _ReqState(pid, budget, prompt_len, predicted=pred)
        self._reqs[req_id] = st
        return st

    def _live_update(self, st: _ReqState, row: np.ndarray, n: int) -> bool:
        """Add this step's verified tokens to the request's in-flight entry (opening it at first sight
        with the prompt tail). Returns True when the store grew."""
        if st.live_id is None or st.live_id not in self.store:
            if st.problem_id is None or st.live_id is not None or (
                    self.share == "cold" and self.store.has_history(st.problem_id)):
                return False  # "cold": siblings share only while their problem has no stored rollouts yet
            start = max(0, st.prompt_len - self.store.prompt_tail)
            st.live_id = self.store.start_live(row[start:n], problem_id=st.problem_id, version=self.version)
            st.live_upto = n
            return st.live_id is not None
        if st.live_upto < n:
            self.store.extend_live(st.live_id, row[st.live_upto:n])
            st.live_upto = n
            return True
        return False

    def _local_draft(self, st: _ReqState, row: np.ndarray, n: int, ctx: np.ndarray, limit: int) -> Any:
        if st.local is None:
            st.local = self.store._Tree(self.depth)
        if st.local_upto < n:
            st.local.extend_ndarray(0, row[st.local_upto:n])
            st.local_upto = n
        return st.local.speculate_ndarray(ctx, limit, self.max_spec_factor, 0.0, self.min_token_prob, False)

    def _cut(self, pending: list, requests: int, ctx_sum: int) -> list:
        """Cut the pending drafts by the per-step rule (`StepJudge`). A draft cut to nothing is scored
        against the tokens the target produces, like a losing draft."""
        keep = self.judge.choose(self.gains(pending), [len(p[3]) for p in pending], requests, ctx_sum)
        if keep is None:
            return pending
        kept = []
        for entry, d in zip(pending, keep, strict=True):
            if d:
                i, rid, st, tokens, probs, src = entry
                kept.append((i, rid, st, tokens[:d], probs[:d], src))
            else:
                self.withhold(entry)
        return kept

    def propose(self, sampled_token_ids: Any, num_tokens_no_spec: Any, token_ids_cpu: Any,
                slot_mappings: Any = None) -> list:
        step = self.lookup(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        if step is None:
            return [[] for _ in range(len(sampled_token_ids))]
        if step.judged and step.pending:
            step.pending = self._cut(step.pending, step.verified, step.ctx_sum)
        return self.emit(step)

    def lookup(self, sampled_token_ids: Any, num_tokens_no_spec: Any, token_ids_cpu: Any) -> _Step | None:
        """The first half of a step (`propose` = lookup, the per-step rule, `emit`): feed back what the
        last drafts got, and look up every request's draft. None: nothing to draft (no runner, k = 0)."""
        t0, cpu0 = time.perf_counter(), time.thread_time()
        rows = len(sampled_token_ids)
        c = self.counters
        c["calls"] += 1
        runner = self.runner
        if runner is None or self.k <= 0:
            return None
        req_ids = runner.input_batch.req_ids
        reqs = self._reqs
        seen = set()
        store, calib, match, k = self.store, self.calibration, self.match_len, self.k
        fenced = self._staged is not None  # a staged rebuild owns the store until it is installed
        live = self.share != "off" and not fenced
        local_bound = calib.max_rate[_LOCAL]
        grew = False
        ns = np.asarray(num_tokens_no_spec[:rows]).tolist()  # one conversion for the batch
        verified = ctx_sum = 0
        new_rows = False  # a request seen for the first time: the step that just ran prefilled it
        judged = self.judge.active and not fenced
        skipped = judged and self.judge.skip(rows)  # this batch size is off: no lookups (machinery/step_judge.py)
        pending: list = []  # (row, request id, state, tokens, probs, source index) of every draft
        kb = self.k_by_batch  # scheduling.k_by_batch_size: vLLM does not apply it to a custom_class proposer's drafts
        k_cap = k if kb is None else kb[min(rows, len(kb) - 1)]
        for i in range(rows):
            rid = req_ids[i]
            if rid is None:
                continue
            seen.add(rid)
            st = reqs.get(rid)
            if st is None:
                st = self._request_state(rid, i)
                new_rows = True
            sampled = sampled_token_ids[i]
            if not sampled:  # partial prefill chunk: nothing to verify yet
                continue
            if st.last_src >= 0:  # this step verified the request's last draft: accepted = sampled - 1
                calib.record(st.last_src, st.last_probs, len(sampled) - 1)
                st.last_src = -1
            if st.others:
                st.others = resolve_withheld(calib, st.others, sampled)
            verified += 1
            n = ns[i]
            ctx_sum += n
            row = token_ids_cpu[i]
            if live:
                grew |= self._live_update(st, row, n)
            if st.budget < k and st.predicted is not None and n - st.prompt_len > st.predicted:
                st.budget = k
                c["budget_promoted"] += 1
            limit = min(st.budget, k_cap, self.max_model_len - n - 1)
            if limit <= 0 or skipped:
                if st.budget == 0:
                    c["budget_zero"] += 1
                continue
            ctx = row[n - match:n] if n > match else row[:n]
            if fenced:
                c["fenced_rows"] += 1
                tokens, probs, source, score = [], [], "", 0.0
            else:
                d = store.speculate(ctx, st.problem_id, limit, self.max_spec_factor, self.min_token_prob, calib)
                tokens, probs, source, score = d.token_ids, d.probs, d.source, d.score
                if d.other is not None:
                    o = d.other
                    st.others.append((_SOURCE_INDEX[o.source], o.probs[:k], o.token_ids[:k], 0))
            if self.use_local and len(tokens) < limit and score < limit * local_bound:
                ld = self._local_draft(st, row, n, ctx, limit)
                if ld.token_ids:
                    if calib.expected(_LOCAL, ld.probs) > score:
                        if tokens:
                            st.others.append((_SOURCE_INDEX[source], probs[:k], tokens[:k], 0))
                        tokens, probs, source = ld.token_ids, ld.probs, "local"
                    else:
                        st.others.append((_LOCAL, ld.probs[:k], ld.token_ids[:k], 0))
            if not tokens:
                continue
            if len(tokens) > k:  # never more than k: more kills the engine
                tokens, probs = tokens[:k], probs[:k]
            pending.append((i, rid, st, tokens, probs, _SOURCE_INDEX[source]))
        return _Step(rows, pending, verified, ctx_sum, new_rows, judged, skipped, grew, seen, t0, cpu0)

    def gains(self, pending: list) -> np.ndarray:
        """Calibrated acceptance of every token of the pending drafts (a NaN-padded matrix, k wide)."""
        return self.calibration.rate_matrix([p[5] for p in pending], [p[4] for p in pending], self.k)

    def withhold(self, entry: tuple) -> None:
        """A pending draft not proposed this step: scored against the tokens the target produces."""
        _, _, st, tokens, probs, src = entry
        st.others.append((src, probs, tokens, 0))

    def emit(self, step: _Step, extra_tokens: int = 0) -> list:
        """The second half of a step: propose `step.pending` (as cut), and account for the step.
        `extra_tokens`: draft tokens from elsewhere the step verifies too (a hybrid's model drafts)."""
        out: list = [[] for _ in range(step.rows)]
        c = self.counters
        drafted = drafted_tokens = 0
        for i, rid, st, tokens, probs, src in step.pending:
            out[i] = tokens
            st.last_src, st.last_probs = src, probs
            drafted += 1
            drafted_tokens += len(tokens)
            self._from[src] += 1
            if self.trace is not None and len(self.trace) < TRACE_LIMIT:
                self.trace.append((rid, st.problem_id, tuple(tokens)))
        self.judge.called(step.t0, step.verified, step.verified + drafted_tokens + extra_tokens, step.ctx_sum,
                          prefilled=step.new_rows, skipped=step.skipped)
        c["rows"] += step.verified
        c["drafts"] += drafted
        c["draft_tokens"] += drafted_tokens
        for name, j in _SOURCE_INDEX.items():
            c["from_" + name] += self._from[j]
            self._from[j] = 0
        reqs = self._reqs
        if len(reqs) > len(step.seen):  # finished or preempted requests: drop their state
            for rid in [r for r in reqs if r not in step.seen]:  # (their in-flight entries wait for the rebuild)
                del reqs[rid]
        if step.grew and self.store.live_over_cap():
            self.store.enforce_memory()
        c["propose_s"] += time.perf_counter() - step.t0
        c["propose_cpu_s"] += time.thread_time() - step.cpu0  # this thread's CPU: wall minus waiting for a core
        return out
