"""Online drafter distillation inside NeMo-RL's DTensor policy workers (`refresh.mode: online` for
`draft_model` and `eagle3`), and the driver side that hands the result to the engines.

Worker side: `SpecDecDTensorPolicyWorker` / `SpecDecDTensorPolicyWorkerV2` are built when first
looked up by FQN (module `__getattr__`, as the vLLM worker actors in workers.py) from
`SpecDecDistillMixin` and NeMo-RL's `DTensorPolicyWorkerImpl` / `DTensorPolicyWorkerV2Impl`; the
patched `resolve_policy_worker_cls` picks them. Every rank holds a replica of the drafter
(train/distill.py, loaded from the drafter's own checkpoint onto the rank's device) and, after
NeMo-RL's `train` returns and when `refresh.every_n_steps` says so, distils it on its shard of the
step (the same `input_ids` / `token_mask` the policy just trained on):

- the teacher is the rank's policy model after the step, called under `torch.no_grad` (FSDP
  gathers its shards as in any forward); the drafter has its own parameters and optimizer, and the
  distiller refuses a teacher that shares a parameter with it, so no gradient reaches the policy;
- the replicas take identical optimizer steps (`DataParallel` over the data-parallel group), so
  the drafter rank 0 exports is every rank's; `specdec_take_drafter` checks that on each rank;
- no Megatron: plain torch and transformers, on whatever device the policy trains on.

Driver side (`wrap_policy`, installed on NeMo-RL's `Policy`): after the workers start, it
publishes the initial drafter; after every `Policy.train` it collects the new replica (an object
ref that rank 0 put in Ray's object store) and publishes it on this job's drafter board
(exchange.py). Each vLLM worker actor stages the newest drafter into the refit that carries the
new policy (workers.py), so policy and drafter change in one versioned update; a step that
distils nothing leaves the drafter to age, within `refresh.max_policy_lag`. The cost is
`specdec/drafter_train_s` (slowest rank) and `specdec/drafter_train_share` of the step period.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from nemo_rl_specdec.adapter import api
from nemo_rl_specdec.adapter.host import Host
from nemo_rl_specdec.lockstep import DrafterRefreshError

logger = logging.getLogger(__name__)

BASES = {
    "SpecDecDTensorPolicyWorker": (api.DTENSOR_WORKER_IMPL, "dtensor_policy_worker"),
    "SpecDecDTensorPolicyWorkerV2": (api.DTENSOR_WORKER_V2_IMPL, "dtensor_policy_worker_v2"),
}


def rollouts_from_train_data(data: Any) -> list[dict]:
    """(prompt, response) token lists per row of NeMo-RL's training batch: right-padded `input_ids`
    with `input_lengths`; the response starts at the row's first `token_mask` position (single-turn
    GRPO: the generated tokens). Rows without a masked token carry nothing to distil."""
    ids, lengths, mask = data["input_ids"], data["input_lengths"], data["token_mask"]
    ids, mask = ids.cpu(), mask.cpu()
    out = []
    for i, n in enumerate(lengths.tolist()):
        hits = mask[i, : int(n)].nonzero()
        if not len(hits):
            continue
        first = int(hits[0])
        row = ids[i, : int(n)].tolist()
        out.append({"prompt_token_ids": row[:first], "token_ids": row[first:]})
    return out


class SpecDecDistillMixin(Host):
    """In front of NeMo-RL's DTensor policy worker in the MRO. RPCs: `specdec_distill_setup(spec,
    temperature, seed)`, `specdec_take_drafter()`; wraps `train`."""

    _specdec_distiller: Any = None

    def specdec_distill_setup(self, spec: dict, temperature: float, seed: int = 0) -> dict:
        import torch

        from nemo_rl_specdec.config.run import SpecDecConfig
        from nemo_rl_specdec.drafters.registry import drafter as drafter_of
        from nemo_rl_specdec.drafters.roles import ModelWeights
        from nemo_rl_specdec.train.distill import DataParallel

        block = SpecDecConfig.model_validate(spec)
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        self._specdec_distiller = drafter_of(block, ModelWeights).distiller(block, temperature=temperature, seed=seed,
                                                                           device=device)
        mesh = getattr(self, "dp_mesh", None)
        self._specdec_dp = DataParallel(mesh.get_group() if mesh is not None else None, device=device)
        self._specdec_every = block.refresh.every_n_steps
        self._specdec_steps = 0  # policy steps trained (train calls outside eval mode)
        self._specdec_seq = 0    # drafters made: 0 is the checkpoint as loaded
        self._specdec_taken = -1
        self._specdec_stats: dict = {}
        return {"kind": self._specdec_distiller.kind, "device": str(device),
                "parameters": sum(p.numel() for p in self._specdec_distiller.module.parameters())}

    def train(self, data, loss_fn, eval_mode: bool = False, *args, **kwargs):
        out = super().train(data, loss_fn, eval_mode, *args, **kwargs)
        if self._specdec_distiller is not None and not eval_mode:
            from nemo_rl_specdec.train.distill import refresh_due

            self._specdec_steps += 1
            if refresh_due(self._specdec_steps, self._specdec_every):
                self._specdec_distil(data)
        return out

    def _specdec_distil(self, data: Any) -> None:
        from nemo_rl_specdec.lockstep import DrafterRefreshError
        from nemo_rl_specdec.train.distill import DistillInputError

        t0 = time.perf_counter()
        try:
            stats = self._specdec_distiller.step(self.model, rollouts_from_train_data(data), dp=self._specdec_dp)
        except DistillInputError as e:
            raise DrafterRefreshError(f"online distillation after policy step {self._specdec_steps}: {e}") from None
        self._specdec_seq += 1
        self._specdec_stats = {**stats, "wall_s": time.perf_counter() - t0, "policy_step": self._specdec_steps}

    def specdec_take_drafter(self) -> dict | None:
        """The replica made since the last take, or None: every rank returns its fingerprint and
        stats; rank 0 also puts the tensors in Ray's object store (`refs`: [ref]; [] for drafter 0,
        the checkpoint, which each engine verifies against the drafter it loaded)."""
        if self._specdec_distiller is None or self._specdec_seq == self._specdec_taken:
            return None
        import ray
        import torch

        from nemo_rl_specdec.engine.weights import fingerprint

        self._specdec_taken = self._specdec_seq
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        out = {"seq": self._specdec_seq, "rank": rank, "fingerprint": fingerprint(self._specdec_distiller.module),
               "stats": dict(self._specdec_stats)}
        if rank == 0:  # drafter 0 is the checkpoint every engine loaded: it travels as a claim, not tensors
            state = self._specdec_distiller.state_dict() if self._specdec_seq else {}
            out["refs"] = [ray.put({k: v.to("cpu") for k, v in state.items()})] if state else []
        return out


    def specdec_distill_state(self) -> dict | None:
        """Rank 0's part of NeMo-RL's checkpoint (adapter/checkpoint.py): the distiller's state and this
        worker's counters; other ranks hold the same replica and return only its fingerprint."""
        import torch

        from nemo_rl_specdec.engine.weights import fingerprint

        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        out: dict = {"rank": rank, "fingerprint": fingerprint(self._specdec_distiller.module)}
        if rank == 0:
            out.update(seq=self._specdec_seq, steps=self._specdec_steps, stats=dict(self._specdec_stats),
                       distiller=self._specdec_distiller.checkpoint_state())
        return out

    def specdec_distill_restore(self, saved: dict) -> dict:
        """At a resume, before the first drafter is published: the distiller as saved, and the counters
        (the next publication is the saved drafter, which the first refit pushes to the engines)."""
        from nemo_rl_specdec.drafter_state import digest
        from nemo_rl_specdec.engine.weights import fingerprint
        from nemo_rl_specdec.lockstep import DrafterRefreshError
        from nemo_rl_specdec.train.distill import DistillInputError

        try:
            self._specdec_distiller.load_checkpoint_state(saved["distiller"])
        except DistillInputError as e:
            raise DrafterRefreshError(f"the online drafter saved in the checkpoint does not restore: {e}") from None
        self._specdec_seq, self._specdec_steps = int(saved["seq"]), int(saved["steps"])
        self._specdec_stats, self._specdec_taken = dict(saved["stats"]), -1
        d = self._specdec_distiller
        return {"fingerprint": fingerprint(d.module), "seq": self._specdec_seq,
                "module": digest(d.module.state_dict()), "optimizer": digest(d.opt.state_dict())}


def combine_takes(takes: list) -> dict | None:
    """One publication from every rank's `specdec_take_drafter` result; raises when the replicas differ."""
    from nemo_rl_specdec.lockstep import DrafterRefreshError

    takes = [t for t in takes if t]
    if not takes:
        return None
    first = next((t for t in takes if "refs" in t), None)
    if first is None:
        raise DrafterRefreshError("no policy worker rank returned the distilled drafter's tensors (rank 0 must)")
    seqs = {t["seq"] for t in takes}
    if len(seqs) != 1:
        raise DrafterRefreshError(f"policy worker ranks hold different drafter versions: {sorted(seqs)}")
    for t in takes:  # the content fingerprint the engines use (engine/weights.py): replicas are bit-identical
        if t["fingerprint"] != first["fingerprint"]:
            raise DrafterRefreshError(f"the drafter replica on policy rank {t['rank']} differs from rank 0's: "
                                      "data-parallel distillation must keep them identical")
    stats = dict(first["stats"])
    walls = [t["stats"].get("wall_s") for t in takes if t["stats"].get("wall_s") is not None]
    if walls:
        stats["drafter_train_s"] = max(walls)
    return {"seq": first["seq"], "refs": first["refs"], "stats": stats}


def wrap_policy(policy_cls: Any, spec: Any, temperature: float, seed: int = 0) -> dict:
    """Replacement `__init__` and `train` for NeMo-RL's `Policy` (returned; `install` sets them)."""
    orig_init, orig_train = policy_cls.__init__, policy_cls.train
    spec_json = spec.model_dump(mode="json")

    def _publish(self, period: float | None = None) -> dict | None:
        """Collect the replica the workers made since the last call and put it on the board."""
        import ray

        pub = combine_takes(ray.get(self.worker_group.run_all_workers_single_data("specdec_take_drafter")))
        if pub is None:
            return None
        if period:
            pub["stats"]["drafter_train_share"] = pub["stats"].get("drafter_train_s", 0.0) / period
        ray.get(self._specdec_board.publish.remote(pub["seq"], pub["refs"], pub["stats"]))
        return pub

    def __init__(self, *args, **kwargs):
        if kwargs.get("worker_extension_cls_fqn"):
            raise api.UnsupportedNeMoRL(
                f"Policy(worker_extension_cls_fqn={kwargs['worker_extension_cls_fqn']!r}) replaces the policy "
                "worker that distils the drafter online (refresh.mode=online); the two cannot be combined")
        orig_init(self, *args, **kwargs)
        import ray

        from nemo_rl_specdec.adapter.exchange import drafter_board

        self._specdec_board = drafter_board(create=True)
        setup = ray.get(self.worker_group.run_all_workers_single_data(
            "specdec_distill_setup", spec=spec_json, temperature=temperature, seed=seed))
        logger.info("[specdec] online %s distillation in %d policy workers: %s", spec.drafter, len(setup), setup[0])
        self._specdec_train_started = None
        from nemo_rl_specdec.adapter import checkpoint

        session = checkpoint.session()
        if session is not None:
            session.attach_policy(self)
            saved = session.distiller_state()
            if saved is not None:
                ref = ray.put(saved)
                done = ray.get(self.worker_group.run_all_workers_single_data("specdec_distill_restore", saved=ref))
                if len({d["fingerprint"] for d in done}) != 1:
                    raise DrafterRefreshError("the policy workers restored different online drafters from the "
                                              "checkpoint")
                self.specdec_restored = done[0]
        _publish(self)  # drafter 0: the checkpoint as loaded; a refit before any policy step confirms it

    def train(self, *args, **kwargs):
        if kwargs.get("eval_mode", args[2] if len(args) > 2 else False):
            return orig_train(self, *args, **kwargs)  # an eval pass: no policy step, nothing distilled
        now = time.perf_counter()
        period = None if self._specdec_train_started is None else now - self._specdec_train_started
        self._specdec_train_started = now  # step period: from one policy step to the next
        out = orig_train(self, *args, **kwargs)
        _publish(self, period)
        return out

    def specdec_export_state(self) -> dict:
        """The online drafter's part of NeMo-RL's checkpoint (rank 0's; every rank's replica checked equal)."""
        import ray

        states = ray.get(self.worker_group.run_all_workers_single_data("specdec_distill_state"))
        first = next(s for s in states if "distiller" in s)
        if any(s["fingerprint"] != first["fingerprint"] for s in states):
            raise DrafterRefreshError("the policy workers' drafter replicas differ: there is no one drafter to save")
        return {k: v for k, v in first.items() if k not in ("rank", "fingerprint")}

    return {"__init__": __init__, "train": train, "specdec_export_state": specdec_export_state}


def _build_worker(name: str) -> type:
    import ray

    impl_fqn, env_name = BASES[name]
    impl = api.resolve(impl_fqn)
    runtime_env = api.resolve(api.POLICY_RUNTIME_ENV)(env_name)
    cls = type(name, (SpecDecDistillMixin, impl), {
        "__module__": __name__, "__qualname__": name,
        "__doc__": f"NeMo-RL's {impl.__name__} that also distils the drafter online (built at runtime)."})
    return ray.remote(runtime_env=runtime_env)(cls)


def __getattr__(name: str) -> Any:
    if name in BASES:
        cls = _build_worker(name)
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
