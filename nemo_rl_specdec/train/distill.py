"""Online drafter training: the gradient-isolated distillation loop every model drafter's
online trainer runs (:class:`Distiller`), its data parallelism (:class:`DataParallel`) and losses.

Each model drafter subclasses :class:`Distiller` (or :class:`HiddenStateDistiller`, for a draft
with its own checkpoint that reads the policy's hidden states) in its own file under `drafters/`
with how the teacher side is prepared, its loss and its export; `ModelWeights.distiller(spec, ...)`
builds it with the `refresh.distill` settings.

After every policy update (or every ``refresh.every_n_steps``), the drafter is trained to imitate
the NEW policy on the step's rollouts, then pushed into the engines in the same lockstep update
as the policy weights:

- targets come from the policy: a no-grad forward of the HF policy (the trainer's copy) over
  prompt + response recomputes its logits at every response position;
- the drafter is a separate module (its own HF checkpoint, its own optimizer); the distiller
  refuses a teacher that shares any parameter object with it, and the teacher's forward runs
  under ``torch.no_grad``, so no gradient ever reaches the policy;
- loss: forward KL(p_policy || q_drafter) at the sampling temperature, averaged over response
  tokens (soft cross-entropy minus the teacher entropy, which is constant for the drafter),
  computed from the two models' last hidden states and output projections in chunks of positions
  (train/kl.py), so no vocabulary-wide tensor outlives a chunk: the teacher side keeps its final
  hidden states per position, not its log-probs;
- devices and dtypes: every tensor is made on the device of the data it meets (a NeMo-RL rank's
  GPU); the teacher may compute in fp32, bf16 or fp16, and what the drafter reads of it is cast
  to the drafter's (fp32) parameters;
- optimizer: AdamW with gradient-norm clipping, one step per micro-batch, a few epochs over the
  step's rollouts (``kl_first``/``kl_last`` are the token-weighted epoch means as trained);
- Eagle3 and MTP heads predict the token after next: at position t they read the policy's hidden
  state(s) at t (aux layers for Eagle3, the last layer before the final norm for MTP) and the token
  x_{t+1}, and are trained towards the policy's distribution at t+1; the policy's hidden states,
  embeddings and (MTP) lm_head are computed/copied under no_grad, so they are constants;
- ``state_dict()`` returns the drafter's tensors in the names the live vLLM drafter loads (draft
  model: its checkpoint names; Eagle3: ``midlayer.*``, ``fc``, ``norm``, ``lm_head``; MTP:
  ``model.mtp_layers.0.*``), which the worker extension loads in place (layerwise reload):

      distiller = drafter_of(cfg.spec, ModelWeights).distiller(cfg.spec, temperature=1.0)
      stats = distiller.step(grpo_trainer.model, rollouts)          # after the GRPO step
      engine.update(PolicyUpdate(v, grpo_trainer.state_dict(), drafter_weights=distiller.state_dict(),
                    drafter_version=v))

Plain torch + transformers, on any device.
"""
from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nemo_rl_specdec.rollouts import TokenSequence, token_sequences

TRAINABLE_DTYPES = ("float32", "bfloat16", "float16")


class DistillInputError(ValueError):
    """Rollouts or the teacher cannot be used for distillation (names what is wrong)."""


def refresh_due(policy_version: int, every_n_steps: int) -> bool:
    """Whether the drafter is trained and pushed with the update to `policy_version` (1-based)."""
    if every_n_steps < 1:
        raise ValueError(f"every_n_steps: got {every_n_steps!r}; allowed: an integer >= 1")
    return policy_version % every_n_steps == 0


def rollout_sequences(rollouts: Sequence[Any], vocab_size: int) -> list[TokenSequence]:
    """(prompt ids, response ids) per rollout (`rollouts.token_sequences`); rollouts with an empty
    response carry no target and are left out."""
    return [s for s in token_sequences(rollouts, vocab_size, error=DistillInputError) if s.response]


def micro_batches(lengths: Sequence[int], max_tokens: int) -> list:
    """Index groups (longest first) whose padded size stays under `max_tokens` (>= 1 item each)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    cur: list[int] = []
    cur_max = 0
    for i in order:
        m = max(cur_max, lengths[i])
        if cur and m * (len(cur) + 1) > max_tokens:
            batches.append(cur)
            cur, m = [], lengths[i]
        cur.append(i)
        cur_max = m
    if cur:
        batches.append(cur)
    return batches


def pad_batch(seqs: list, pad_id: int):
    """ids [B, T] right-padded; mask [B, T-1] True where logits at t predict a response token t+1.
    Built on the host (the caller moves them to its device in one copy)."""
    import torch

    T = max(len(s.prompt) + len(s.response) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long, device="cpu")
    mask = torch.zeros((len(seqs), T - 1), dtype=torch.bool, device="cpu")
    for b, s in enumerate(seqs):
        n = len(s.prompt) + len(s.response)
        ids[b, :n] = torch.tensor(s.prompt + s.response, device="cpu")
        mask[b, len(s.prompt) - 1: n - 1] = True
    return ids, mask


def estimating() -> bool:
    """Whether this runs under torch's fake-tensor mode (the memory estimate, train/estimate.py):
    tensors have shapes but no values, so checkpoint tensors are not read (a module keeps the shapes
    it was built with) and checks of values are skipped."""
    from torch._guards import active_fake_mode

    return active_fake_mode() is not None


def settle(module, device: Any = None, dtype: Any = None):
    """`module` moved to `device` and cast to `dtype` where a tensor of it is elsewhere or in another
    floating dtype (a module already there is left alone: torch cannot swap a fake parameter with
    itself); returns the module."""
    import torch

    device = None if device is None else torch.device(device)
    for t in list(module.parameters()) + list(module.buffers()):
        moved = device is not None and t.device != device
        cast = dtype is not None and t.is_floating_point() and t.dtype != dtype
        if moved or cast:
            return module.to(device=device, dtype=dtype)
    return module


def check_trainable(tensors: dict, where: Any) -> None:
    """A drafter checkpoint's tensors must be in a dtype the loss can train (they are loaded into fp32
    parameters); anything else (int8, fp8) is refused, naming the first such tensor."""
    for name, t in tensors.items():
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in TRAINABLE_DTYPES:
            raise DistillInputError(f"{where}: tensor {name!r} is {dtype}; a drafter trained online needs "
                                    f"{list(TRAINABLE_DTYPES)} weights (it is trained in float32)")


@contextlib.contextmanager
def last_layer_output(policy):
    """Within the block, ``box["last"]`` is the output of the policy's last decoder layer before the
    final norm (transformers' last hidden state is after it), taken by a forward hook."""
    box: dict = {}
    hook = policy.model.layers[policy.config.num_hidden_layers - 1].register_forward_hook(
        lambda m, i, o: box.__setitem__("last", o[0] if isinstance(o, tuple) else o))
    try:
        yield box
    finally:
        hook.remove()


def whole(t):
    """A tensor of a sharded (FSDP / tensor-parallel) policy as a whole local tensor (every rank calls
    this together for a parameter); any other tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


FINAL = "final"  # kept_hidden_states: the final norm's output, what the output projection reads


@contextlib.contextmanager
def kept_hidden_states(policy, wanted):
    """Within the block, a forward of `policy` (an HF causal LM with ``.model.layers`` and
    ``.model.norm``) fills the yielded dict with the hidden states in `wanted` and no others: an
    integer i is the residual stream after i decoder layers (0: the embeddings, the input of layer 0;
    the last layer's output is before the final norm), `FINAL` the final norm's output. Hooks take
    them, so the forward runs without ``output_hidden_states`` and the layers' outputs that are not
    wanted are freed as it goes (at Qwen3-8B shapes every layer's output of a 4,096-token micro-batch
    is 1.2 GB in bf16)."""
    layers = policy.model.layers
    box: dict = {}

    def keep(key):
        return lambda m, i, o: box.__setitem__(key, o[0] if isinstance(o, tuple) else o)

    hooks = []
    try:
        for key in wanted:
            if key == FINAL:
                hooks.append(policy.model.norm.register_forward_hook(keep(FINAL)))
            elif int(key) == 0:
                hooks.append(layers[0].register_forward_pre_hook(
                    lambda m, args, kw: box.__setitem__(0, args[0] if args else kw["hidden_states"]),
                    with_kwargs=True))
            elif 0 < int(key) <= len(layers):
                hooks.append(layers[int(key) - 1].register_forward_hook(keep(int(key))))
            else:
                raise ValueError(f"kept_hidden_states: {key!r} is not a hidden state of a {len(layers)}-layer policy "
                                 f"(allowed: 0 .. {len(layers)} or {FINAL!r})")
        yield box
    finally:
        for h in hooks:
            h.remove()


def final_hidden(out, projection, who: str = "the policy", hidden=None):
    """The teacher's last hidden states (after its final norm, what its output projection reads:
    `hidden`, or the last of ``out.hidden_states``) from a forward run with ``logits_to_keep=1``,
    checked against that forward's logits: the last position's logits must be ``hidden @
    projection^T``. A policy that does more to its logits (a soft cap, a scale) is refused, since the
    loss recomputes them this way."""
    import torch

    h = whole(out.hidden_states[-1] if hidden is None else hidden)
    if estimating():
        return h
    got = whole(out.logits)[:, -1].detach().float()
    want = (h[:, -1].detach() @ projection.detach().t()).float()
    err = float((got - want).abs().max())
    if not torch.isfinite(got).all() or err > 1e-2 * (float(got.abs().max()) + 1.0):
        raise DistillInputError(f"{who}'s logits are not its last hidden state times its output embeddings "
                                f"(max |diff| {err:.3g}): a soft cap or scale on the logits is not supported")
    return h


def cap_tokens(seqs: list, max_tokens: int | None) -> list:
    """The first `max_tokens` tokens of the step's rollouts, in order (the last one kept is cut to fit;
    a cut that would leave it no response token drops it)."""
    if max_tokens is None:
        return seqs
    out, left = [], int(max_tokens)
    for s in seqs:
        n = len(s.prompt) + len(s.response)
        if n <= left:
            out.append(s)
            left -= n
            continue
        if left > len(s.prompt):
            out.append(TokenSequence(s.prompt, s.response[: left - len(s.prompt)]))
        break
    return out


class DataParallel:
    """The replicas of one drafter on the ranks of a `torch.distributed` group, kept identical:
    every rank runs as many micro-batches as the busiest one (FSDP's sharded teacher needs every
    rank in each forward), and each optimizer step uses the gradient summed over ranks, weighted by
    the positions each rank trained. Tensors for the collectives live on `device` (NCCL: cuda)."""

    def __init__(self, group: Any = None, device: Any = "cpu"):
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("DataParallel needs an initialised torch.distributed process group")
        self.torch, self.dist, self.group, self.device = torch, dist, group, torch.device(device)

    def _all_reduce(self, t, op):
        self.dist.all_reduce(t, op=op, group=self.group)
        return t

    def max(self, n: int) -> int:
        t = self.torch.tensor([int(n)], dtype=self.torch.long, device=self.device)
        return int(self._all_reduce(t, self.dist.ReduceOp.MAX).item())

    def sum(self, x: float) -> float:
        t = self.torch.tensor([float(x)], dtype=self.torch.float64, device=self.device)
        return float(self._all_reduce(t, self.dist.ReduceOp.SUM).item())

    def sum_tensor(self, t):
        """`t` summed over the group's ranks (a new tensor, on `t`'s device)."""
        buf = t.to(self.device, copy=True)
        return self._all_reduce(buf, self.dist.ReduceOp.SUM).to(t.device)

    def reduce_grads(self, params: list, n_local: int) -> int:
        """Replace each gradient (the local loss was scaled by `n_local`) by the group's sum over
        the group's positions; returns that position count (0: no rank trained, skip the step)."""
        torch = self.torch
        flat = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float() for p in params]
        buf = torch.cat(flat + [torch.tensor([float(n_local)], device=flat[0].device)])
        self._all_reduce(buf, self.dist.ReduceOp.SUM)
        total = int(round(buf[-1].item()))
        if total == 0:
            return 0
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = (buf[offset: offset + n] / total).view_as(p).to(p.dtype)
            offset += n
        return total


class Distiller:
    """The shared loop: checks, no-grad teacher pass, KL at the sampling temperature, AdamW with
    gradient clipping over a few epochs, kl_first/kl_last and top-1 agreement stats.

    Subclasses implement ``_load(source)`` (load the trainable drafter from `source`, its
    checkpoint directory or the policy's; return (module, vocabulary size)), ``_prepare(teacher,
    ids, mask)`` (no-grad teacher side of one padded batch -> a dict with at least ``n``, the
    number of trained positions) and ``_loss(item)`` -> a `KL` (train/kl.py: the loss, and the
    top-1 agreement at the first-draft positions)."""

    kind = "base"
    _made_with: tuple[tuple, dict]

    def __new__(cls, *args: Any, **kwargs: Any):
        obj = super().__new__(cls)
        obj._made_with = (args, dict(kwargs))  # what `twin` builds another from
        return obj

    def __init__(self, source: Any, *, lr: float = 1e-3, seed: int = 0, epochs: int = 2, temperature: float = 1.0,
                 micro_batch_tokens: int = 4096, max_grad_norm: float = 1.0, weight_decay: float = 0.0,
                 num_threads: int | None = None, max_tokens: int | None = None, device: Any = "cpu",
                 max_transient_gb: float | None = None):
        if max_transient_gb is not None and not max_transient_gb > 0:
            raise ValueError(f"refresh.distill.max_transient_gb: got {max_transient_gb!r}; allowed: a number > 0 or "
                             "null (no budget)")
        self.max_transient_gb = max_transient_gb
        self.budget_checked: dict | None = None
        self._begin(lr=lr, epochs=epochs, micro_batch_tokens=micro_batch_tokens, max_grad_norm=max_grad_norm,
                    seed=seed, num_threads=num_threads, max_tokens=max_tokens)
        self.module, vocab_size = self._load(source)
        self._setup(lr=lr, epochs=epochs, temperature=temperature, micro_batch_tokens=micro_batch_tokens,
                    max_grad_norm=max_grad_norm, weight_decay=weight_decay, vocab_size=vocab_size,
                    max_tokens=max_tokens, device=device)

    def _load(self, source: Any) -> tuple:
        raise NotImplementedError

    def _prepare(self, teacher, ids, mask) -> dict:
        raise NotImplementedError

    def _loss(self, item):
        raise NotImplementedError

    def state_dict(self) -> dict:
        """The drafter's tensors, as its checkpoint names them."""
        raise NotImplementedError

    def checkpoint_state(self) -> dict:
        """What NeMo-RL's checkpoint carries of this trainer (CPU copies): the drafter's parameters and
        buffers, the AdamW state, the step counter and per-step stats. The loop has no LR schedule and
        keeps no data between steps (each step trains on that step's rollouts), so nothing else is."""
        copies: dict = {}  # one copy per tensor, so tied weights (a draft model's embedding and lm_head) stay tied

        def cpu(x):
            if isinstance(x, dict):
                return {k: cpu(v) for k, v in x.items()}
            if isinstance(x, list):
                return [cpu(v) for v in x]
            if not hasattr(x, "detach"):
                return x
            key = (x.untyped_storage().data_ptr(), x.storage_offset(), tuple(x.shape), tuple(x.stride()), x.dtype)
            if key not in copies:
                copies[key] = x.detach().to("cpu", copy=True)
            return copies[key]

        return {"kind": self.kind, "vocab_size": self.vocab_size, "draft_vocab_size": self._draft_vocab(),
                "module": cpu(dict(self.module.state_dict())), "optimizer": cpu(self.opt.state_dict()),
                "steps": self.steps, "history": [dict(h) for h in self.history]}

    def _draft_vocab(self) -> int | None:
        """The vocabulary the drafter drafts from, when it is not the policy's (Eagle3's draft vocabulary)."""
        return None

    def load_checkpoint_state(self, state: dict) -> None:
        """Restore `checkpoint_state` of a trainer of the same kind and vocabularies: the drafter's
        tensors (strictly, by name and shape), then the AdamW state over them. Raises
        DistillInputError naming what differs, before anything changes."""
        if state.get("kind") != self.kind or int(state.get("vocab_size", -1)) != self.vocab_size:
            raise DistillInputError(f"the saved drafter state is a {state.get('kind')} over a vocabulary of "
                                    f"{state.get('vocab_size')}; this one is a {self.kind} over {self.vocab_size}")
        self._before_load(state)
        mine = self.module.state_dict()
        saved = state["module"]
        if set(saved) != set(mine) or any(tuple(saved[k].shape) != tuple(mine[k].shape) for k in mine):
            diff = sorted(set(saved) ^ set(mine)) or [k for k in mine if tuple(saved[k].shape) != tuple(mine[k].shape)]
            raise DistillInputError(f"the saved {self.kind} drafter's tensors do not match this one's "
                                    f"(e.g. {diff[0]!r})")
        self.module.load_state_dict(saved, strict=True)
        self.opt.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])
        self.history[:] = [dict(h) for h in state["history"]]

    def _before_load(self, state: dict) -> None:
        """Shape the drafter as the saved one before its tensors load (Eagle3: the draft vocabulary)."""

    def twin(self) -> Distiller:
        """Another distiller made as this one was (same checkpoint and settings, no memory budget)."""
        args, kwargs = self._made_with
        return type(self)(*args, **{**kwargs, "max_transient_gb": None})

    def check_budget(self, teacher, rollouts: Sequence[Any]) -> dict | None:
        """With ``max_transient_gb``: a step's memory on `rollouts` estimated at the policy's shapes
        without allocating it (train/estimate.py), and a refusal naming the setting where its transient
        is above the budget. Returns the estimate in bytes (None without a budget)."""
        if self.max_transient_gb is None:
            return None
        from nemo_rl_specdec.train.estimate import step_memory

        est = step_memory(self, teacher, rollouts)
        if est["transient"] > self.max_transient_gb * 1e9:
            raise DistillInputError(
                f"refresh.distill.max_transient_gb: got {self.max_transient_gb:g}, but a {self.kind} step with "
                f"micro_batch_tokens {self.micro_batch_tokens} and max_tokens {self.max_tokens} is estimated at "
                f"{est['transient'] / 1e9:.2f} GB transient (state {est['state'] / 1e9:.2f} GB) for this policy; "
                f"allowed: >= {est['transient'] / 1e9:.2f}, or a smaller refresh.distill.micro_batch_tokens")
        return est

    def _setup(self, *, lr: float, epochs: int, temperature: float, micro_batch_tokens: int,
               max_grad_norm: float, weight_decay: float, vocab_size: int, max_tokens: int | None = None,
               device: Any = "cpu") -> None:
        import torch

        self.torch = torch
        self.device = torch.device(device)
        settle(self.module, self.device, torch.float32)
        self.dtype = torch.float32
        self.module.train()
        self.opt = torch.optim.AdamW(self.module.parameters(), lr=lr, weight_decay=weight_decay)
        # T = 0 (greedy) keeps the argmax of any temperature; distil at T = 1 then
        self.temperature = float(temperature) if temperature and temperature > 0 else 1.0
        self.epochs, self.micro_batch_tokens = int(epochs), int(micro_batch_tokens)
        self.max_grad_norm = float(max_grad_norm)
        self.vocab_size = int(vocab_size)
        self.max_tokens = None if max_tokens is None else int(max_tokens)
        self.steps = 0
        self.history: list = []

    @staticmethod
    def _begin(*, lr: float, epochs: int, micro_batch_tokens: int, max_grad_norm: float, seed: int,
               num_threads: int | None, max_tokens: int | None = None) -> None:
        """Before the drafter is loaded: check the arguments, threads, seed."""
        import torch

        from nemo_rl_specdec.openmp import request_torch_threads

        if lr <= 0 or not math.isfinite(lr):
            raise ValueError(f"lr: got {lr!r}; allowed: a finite number > 0")
        if epochs < 1:
            raise ValueError(f"epochs: got {epochs!r}; allowed: an integer >= 1")
        if micro_batch_tokens < 1:
            raise ValueError(f"micro_batch_tokens: got {micro_batch_tokens!r}; allowed: >= 1")
        if max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm: got {max_grad_norm!r}; allowed: > 0")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens: got {max_tokens!r}; allowed: an integer >= 1 or None (all)")
        request_torch_threads(num_threads)
        torch.manual_seed(seed)

    # ------------------------------------------------------------------ checks
    def _check_teacher(self, teacher) -> None:
        if teacher is self.module:
            raise DistillInputError("the teacher is the drafter itself")
        mine = {id(p) for p in self.module.parameters()}
        shared = [n for n, p in teacher.named_parameters() if id(p) in mine]
        if shared:
            raise DistillInputError(f"the teacher shares {len(shared)} parameter(s) with the drafter (e.g. "
                                    f"{shared[0]!r}); gradients would leak into the policy")
        tv = getattr(getattr(teacher, "config", None), "vocab_size", None)
        if tv != self.vocab_size:
            raise DistillInputError(f"vocabularies differ: policy {tv} vs drafter {self.vocab_size}")
        param = next(teacher.parameters(), None)
        dtype = str(param.dtype).removeprefix("torch.") if param is not None else None
        if dtype not in TRAINABLE_DTYPES:
            raise DistillInputError(f"the policy's parameters are {dtype}; allowed: {list(TRAINABLE_DTYPES)}")

    def _pad_id(self, teacher) -> int:
        return int(getattr(teacher.config, "pad_token_id", None) or 0)

    # ------------------------------------------------------------------ training
    def _teacher_side(self, teacher) -> None:
        """Once per step, before the teacher's forwards: what every micro-batch shares of the policy,
        here its output projection (whole and detached; cast once to the dtype the policy computes in
        at the first forward). With a sharded policy every rank calls this together."""
        self.t_out = whole(teacher.get_output_embeddings().weight).detach()

    def _hidden_wanted(self, teacher) -> set:
        """The policy's hidden states `_prepare` reads besides the final ones (`kept_hidden_states` keys)."""
        return set()

    def _teacher_forward(self, teacher, ids):
        """One no-grad forward of the policy: (the hidden states `_hidden_wanted` names, by
        `kept_hidden_states` key, and its final hidden states), logits only at the last position (the
        loss recomputes the others chunk by chunk)."""
        if self.t_out.device.type != self.device.type:  # checked before a forward that would mix the two
            raise DistillInputError(f"the policy computes on {self.t_out.device}, the drafter is on {self.device}: "
                                    "build the distiller with device= the policy's device")
        with kept_hidden_states(teacher, self._hidden_wanted(teacher) | {FINAL}) as box:
            out = teacher(input_ids=ids, logits_to_keep=1)
        computes_in = whole(box[FINAL]).dtype
        if self.t_out.dtype != computes_in:  # mixed precision (FSDP's param_dtype): fp32 stored, bf16 computed
            self.t_out = self.t_out.to(computes_in)
        return box, final_hidden(out, self.t_out, hidden=box.pop(FINAL))

    def teacher_targets(self, teacher, seqs: list, batches: list) -> list:
        """Per micro-batch, the no-grad teacher side (`_prepare`), teacher mode restored after. An
        empty index group runs a dummy forward that trains nothing (a data-parallel rank short of
        batches still joins its sharded teacher's collective forwards)."""
        torch = self.torch
        was_training = teacher.training
        teacher.eval()
        out = []
        try:
            with torch.no_grad():
                self._teacher_side(teacher)
                for idx in batches:
                    if idx:
                        ids, mask = pad_batch([seqs[i] for i in idx], self._pad_id(teacher))
                    else:
                        ids = torch.full((1, 2), self._pad_id(teacher), dtype=torch.long, device="cpu")
                        mask = torch.zeros((1, 1), dtype=torch.bool, device="cpu")
                    item = self._prepare(teacher, ids.to(self.device), mask.to(self.device))
                    item.setdefault("response_tokens", int(mask.sum()))
                    out.append(item)
        finally:
            teacher.train(was_training)
        return out

    def _cast(self, t):
        """A teacher-side tensor as the drafter reads it: detached, in the drafter's dtype."""
        return whole(t).detach().to(self.dtype)

    def step(self, teacher, rollouts: Sequence[Any], dp: DataParallel | None = None) -> dict:
        """Distil the drafter towards `teacher` (the updated policy) on `rollouts`; returns stats.

        With `dp`, this rank's `rollouts` are its shard of the step and the replicas of the drafter
        on the group's ranks take identical optimizer steps (gradients summed over ranks, weighted
        by trained positions), so they stay equal; the loss stats are the group's."""
        torch = self.torch
        self._check_teacher(teacher)
        if self.budget_checked is None and self.max_transient_gb is not None and not estimating():
            self.budget_checked = self.check_budget(teacher, rollouts)  # before the first step computes anything
        seqs = cap_tokens(rollout_sequences(rollouts, self.vocab_size), self.max_tokens)
        if not seqs and dp is None:
            raise DistillInputError("no rollout has response tokens: nothing to distil on")
        self._before_step(seqs, dp)
        t0 = time.perf_counter()
        batches = micro_batches([len(s.prompt) + len(s.response) for s in seqs], self.micro_batch_tokens)
        if dp is not None:
            batches += [[] for _ in range(dp.max(len(batches)) - len(batches))]
        targets = self.teacher_targets(teacher, seqs, batches)
        teacher_s = time.perf_counter() - t0
        n_local = sum(t["n"] for t in targets)
        n_tok = n_local if dp is None else int(dp.sum(n_local))
        if n_tok == 0:
            raise DistillInputError(f"{self.kind}: the rollouts leave no position to train on "
                                    "(responses too short for this drafter's target)")
        agree_before = self._agreement(targets)
        losses, grad_norm = [], float("nan")
        params = [p for p in self.module.parameters() if p.requires_grad]
        self.module.train()
        for _ in range(self.epochs):
            total = 0.0
            for item in targets:  # one AdamW step per micro-batch (per round of micro-batches with dp)
                if dp is None and item["n"] == 0:
                    continue
                self.opt.zero_grad(set_to_none=True)
                if item["n"]:
                    loss = self._loss(item).loss
                    (loss if dp is None else loss * item["n"]).backward()
                    total += loss.item() * item["n"] / n_tok
                if dp is not None and dp.reduce_grads(params, item["n"]) == 0:
                    continue
                grad_norm = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
                self.opt.step()
            losses.append(total if dp is None else dp.sum(total))
        agree_after = self._agreement(targets)
        self.steps += 1
        stats = {"distill_step": self.steps, "kind": self.kind, "tokens": sum(t["response_tokens"] for t in targets),
                 "trained_positions": n_local, "sequences": len(seqs), "epochs": self.epochs,
                 "kl_first": losses[0], "kl_last": losses[-1], "grad_norm": float(grad_norm),
                 "top1_agreement_before": agree_before, "top1_agreement_after": agree_after,
                 "teacher_s": teacher_s, "train_s": time.perf_counter() - t0 - teacher_s,
                 "seconds": time.perf_counter() - t0}
        self.history.append(stats)
        return stats

    def _before_step(self, seqs: list, dp: DataParallel | None = None) -> None:
        """Called with the step's sequences before anything is computed (with `dp`, every rank calls it
        together); the drafters that derive something from the rollouts (Eagle3's draft vocabulary)
        do it here."""

    def _agreement(self, targets: list) -> float:
        """Fraction of first-draft positions where the drafter's argmax is the policy's argmax."""
        hit = tot = 0
        with self.torch.no_grad():
            for item in targets:
                if item["n"] == 0:
                    continue
                kl = self._loss(item)
                hit, tot = hit + kl.hits, tot + kl.counted
        return hit / max(1, tot)


class HiddenStateDistiller(Distiller):
    """A drafter kept in its own checkpoint directory (``config.json`` + ``model.safetensors``) that
    reads the policy's hidden states after the layers ``layer_ids`` (Eagle3's aux layers, for one):
    the directory and teacher checks and the export such drafters share.

    Subclasses implement ``_read(path) -> (module, config dict, layer_ids, vocabulary size)`` and
    name ``what`` (in messages) and ``layers_key`` (the config key that lists the layers); the
    module's ``checkpoint_tensors()`` are the names the live vLLM drafter loads."""

    what = "a drafter"
    layers_key = "layer_ids"
    source_arg = "checkpoint_dir"

    def _load(self, path: Any) -> tuple:
        if not (Path(path) / "config.json").is_file():
            raise FileNotFoundError(f"{self.source_arg}: {path} is not {self.what} checkpoint directory "
                                    "(no config.json)")
        self.checkpoint_dir = str(path)
        module, self.config, self.layer_ids, vocab_size = self._read(path)
        return module, vocab_size

    def _read(self, path: Any) -> tuple:
        raise NotImplementedError

    def _check_teacher(self, teacher) -> None:
        super()._check_teacher(teacher)
        c = teacher.config
        H = int(self.config.get("target_hidden_size") or self.config["hidden_size"])
        if c.hidden_size != H:
            raise DistillInputError(f"the policy's hidden_size {c.hidden_size} is not the drafter's "
                                    f"target_hidden_size {H}")
        if max(self.layer_ids) >= c.num_hidden_layers:
            raise DistillInputError(f"{self.layers_key} {self.layer_ids} need a policy with more than "
                                    f"{max(self.layer_ids)} layers; it has {c.num_hidden_layers}")

    def state_dict(self) -> dict:
        """The drafter's tensors in the names the live vLLM drafter loads (detached copies)."""
        return self.module.checkpoint_tensors()

    def save(self, path: Any) -> None:
        """A checkpoint directory: the original config.json, the current tensors."""
        import shutil

        from safetensors.torch import save_file

        Path(path).mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(self.checkpoint_dir) / "config.json", Path(path) / "config.json")
        save_file(self.state_dict(), str(Path(path) / "model.safetensors"), metadata={"format": "pt"})
