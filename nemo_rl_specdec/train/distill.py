"""Online drafter training: gradient-isolated distillation of a parametric drafter on rollouts.

Three drafters, one loop (:class:`Distiller`): an external draft model (:class:`DraftModelDistiller`),
an Eagle3 head (:class:`Eagle3Distiller`, the plain-torch mirror of vLLM's ``llama_eagle3`` in
:mod:`nemo_rl_specdec.train.train_eagle3`) and MiMo-style MTP layers (:class:`MTPDistiller`, the
mirror in :mod:`nemo_rl_specdec.train.train_tiny_mtp`).

After every policy update (or every ``refresh.every_n_steps``), the drafter is trained to imitate
the NEW policy on the step's rollouts, then pushed into the engines in the same lockstep update
as the policy weights:

- targets come from the policy: a no-grad forward of the HF policy (the trainer's copy) over
  prompt + response recomputes its logits at every response position;
- the drafter is a separate module (its own HF checkpoint, its own optimizer); the distiller
  refuses a teacher that shares any parameter object with it, and the teacher's forward runs
  under ``torch.no_grad``, so no gradient ever reaches the policy;
- loss: forward KL(p_policy || q_drafter) at the sampling temperature, averaged over response
  tokens (soft cross-entropy minus the teacher entropy, which is constant for the drafter);
- optimizer: AdamW with gradient-norm clipping, one step per micro-batch, a few epochs over the
  step's rollouts (``kl_first``/``kl_last`` are the token-weighted epoch means as trained);
- Eagle3 and MTP heads predict the token after next: at position t they read the policy's hidden
  state(s) at t (aux layers for Eagle3, the last layer before the final norm for MTP) and the token
  x_{t+1}, and are trained towards the policy's distribution at t+1; the policy's hidden states,
  embeddings and (MTP) lm_head are computed/copied under no_grad, so they are constants;
- ``state_dict()`` returns the drafter's tensors in the names the live vLLM drafter loads (draft
  model: its checkpoint names; Eagle3: ``midlayer.*``, ``fc``, ``norm``, ``lm_head``; MTP:
  ``model.mtp_layers.0.*``), which the worker extension loads in place (layerwise reload):

      distiller = DraftModelDistiller(cfg.spec.draft_model.model, lr=1e-3)
      stats = distiller.step(grpo_trainer.model, rollouts)          # after the GRPO step
      engine.update(v, grpo_trainer.state_dict(), drafter_weights=distiller.state_dict(),
                    drafter_version=v)

No Megatron, no GPU: plain torch + transformers.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence


class DistillInputError(ValueError):
    """Rollouts or the teacher cannot be used for distillation (names what is wrong)."""


def refresh_due(policy_version: int, every_n_steps: int) -> bool:
    """Whether the drafter is trained and pushed with the update to `policy_version` (1-based)."""
    if every_n_steps < 1:
        raise ValueError(f"every_n_steps: got {every_n_steps!r}; allowed: an integer >= 1")
    return policy_version % every_n_steps == 0


def _field(r: Any, name: str, default: Any = None) -> Any:
    return r.get(name, default) if isinstance(r, dict) else getattr(r, name, default)


@dataclass
class _Seq:
    prompt: list
    response: list


def rollout_sequences(rollouts: Sequence[Any], vocab_size: int) -> list:
    """(prompt ids, response ids) per rollout; rollouts with an empty response carry no target."""
    out = []
    for i, r in enumerate(rollouts):
        prompt, resp = _field(r, "prompt_token_ids"), _field(r, "token_ids")
        if prompt is None or resp is None:
            raise DistillInputError(f"rollouts[{i}]: needs prompt_token_ids and token_ids")
        prompt, resp = [int(t) for t in prompt], [int(t) for t in resp]
        if not prompt:
            raise DistillInputError(f"rollouts[{i}]: empty prompt (the first response token needs a context)")
        bad = [t for t in prompt + resp if t < 0 or t >= vocab_size]
        if bad:
            raise DistillInputError(f"rollouts[{i}]: token id {bad[0]} outside the vocabulary [0, {vocab_size})")
        if resp:
            out.append(_Seq(prompt, resp))
    return out


def micro_batches(lengths: Sequence[int], max_tokens: int) -> list:
    """Index groups (longest first) whose padded size stays under `max_tokens` (>= 1 item each)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches, cur, cur_max = [], [], 0
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
    """ids [B, T] right-padded; mask [B, T-1] True where logits at t predict a response token t+1."""
    import torch

    T = max(len(s.prompt) + len(s.response) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), T - 1), dtype=torch.bool)
    for b, s in enumerate(seqs):
        n = len(s.prompt) + len(s.response)
        ids[b, :n] = torch.tensor(s.prompt + s.response)
        mask[b, len(s.prompt) - 1: n - 1] = True
    return ids, mask


def forward_kl(teacher_logp, student_logits, temperature: float):
    """Mean over rows of KL(p_teacher || q_student); teacher given as log-probs at `temperature`."""
    import torch.nn.functional as F

    s_logp = F.log_softmax(student_logits.float() / temperature, dim=-1)
    return (teacher_logp.exp() * (teacher_logp - s_logp)).sum(-1).mean()


def cap_tokens(seqs: list, max_tokens: Optional[int]) -> list:
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
            out.append(_Seq(s.prompt, s.response[: left - len(s.prompt)]))
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

    Subclasses call :meth:`_begin` (argument checks, threads, seed), set ``self.module`` (the
    trainable drafter), then call :meth:`_setup`, and implement ``_prepare(teacher, ids, mask)`` (no-grad teacher side of one
    padded batch -> a dict with at least ``n``, the number of trained positions) and
    ``_loss(item)`` -> (loss, student logits at trained positions, teacher log-probs there)."""

    kind = "base"

    def _setup(self, *, lr: float, epochs: int, temperature: float, micro_batch_tokens: int,
               max_grad_norm: float, weight_decay: float, vocab_size: int, max_tokens: Optional[int] = None,
               device: Any = "cpu") -> None:
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.module.to(self.device)
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
               num_threads: Optional[int], max_tokens: Optional[int] = None) -> None:
        """Before a subclass loads its drafter: check the arguments, threads, seed."""
        import torch

        from nemo_rl_specdec.engine.openmp import request_torch_threads

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

    def _pad_id(self, teacher) -> int:
        return int(getattr(teacher.config, "pad_token_id", None) or 0)

    # ------------------------------------------------------------------ training
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
                for idx in batches:
                    if idx:
                        ids, mask = pad_batch([seqs[i] for i in idx], self._pad_id(teacher))
                    else:
                        ids = torch.full((1, 2), self._pad_id(teacher), dtype=torch.long)
                        mask = torch.zeros((1, 1), dtype=torch.bool)
                    item = self._prepare(teacher, ids.to(self.device), mask.to(self.device))
                    item.setdefault("response_tokens", int(mask.sum()))
                    out.append(item)
        finally:
            teacher.train(was_training)
        return out

    def _teacher_logp(self, logits):
        import torch.nn.functional as F

        if hasattr(logits, "full_tensor"):  # a DTensor from a sharded policy
            logits = logits.full_tensor()
        return F.log_softmax(logits.float() / self.temperature, dim=-1)

    def step(self, teacher, rollouts: Sequence[Any], dp: Optional["DataParallel"] = None) -> dict:
        """Distil the drafter towards `teacher` (the updated policy) on `rollouts`; returns stats.

        With `dp`, this rank's `rollouts` are its shard of the step and the replicas of the drafter
        on the group's ranks take identical optimizer steps (gradients summed over ranks, weighted
        by trained positions), so they stay equal; the loss stats are the group's."""
        torch = self.torch
        self._check_teacher(teacher)
        seqs = cap_tokens(rollout_sequences(rollouts, self.vocab_size), self.max_tokens)
        if not seqs and dp is None:
            raise DistillInputError("no rollout has response tokens: nothing to distil on")
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
                    loss, _, _ = self._loss(item)
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

    def _agreement(self, targets: list) -> float:
        """Fraction of trained positions where the drafter's argmax is the policy's argmax."""
        torch = self.torch
        hit = tot = 0
        with torch.no_grad():
            for item in targets:
                if item["n"] == 0:
                    continue
                _, s_logits, t_logp = self._loss(item)
                hit += int((s_logits.argmax(-1) == t_logp.argmax(-1)).sum())
                tot += int(s_logits.shape[0])
        return hit / max(1, tot)


class DraftModelDistiller(Distiller):
    """Online trainer of an external draft model (any HF causal LM sharing the policy's vocab)."""

    kind = "draft_model"

    def __init__(self, drafter_dir: str | Path, *, lr: float = 1e-3, seed: int = 0, epochs: int = 2,
                 temperature: float = 1.0, micro_batch_tokens: int = 4096, max_grad_norm: float = 1.0,
                 weight_decay: float = 0.0, num_threads: Optional[int] = None,
                 max_tokens: Optional[int] = None, device: Any = "cpu"):
        import torch
        from transformers import AutoModelForCausalLM

        if not Path(drafter_dir).is_dir():
            raise FileNotFoundError(f"drafter_dir: {drafter_dir} is not a checkpoint directory")
        self._begin(lr=lr, epochs=epochs, micro_batch_tokens=micro_batch_tokens, max_grad_norm=max_grad_norm,
                    seed=seed, num_threads=num_threads, max_tokens=max_tokens)
        self.drafter_dir = str(drafter_dir)
        self.model = self.module = AutoModelForCausalLM.from_pretrained(self.drafter_dir, dtype=torch.float32)
        self.pad_id = int(self.model.config.pad_token_id or 0)
        self._setup(lr=lr, epochs=epochs, temperature=temperature, micro_batch_tokens=micro_batch_tokens,
                    max_grad_norm=max_grad_norm, weight_decay=weight_decay,
                    vocab_size=self.model.config.vocab_size, max_tokens=max_tokens, device=device)

    def _pad_id(self, teacher) -> int:
        return self.pad_id

    def _prepare(self, teacher, ids, mask) -> dict:
        logits = teacher(input_ids=ids).logits[:, :-1]
        return {"ids": ids, "mask": mask, "t_logp": self._teacher_logp(logits[mask]), "n": int(mask.sum())}

    def _loss(self, item):
        logits = self.model(input_ids=item["ids"]).logits[:, :-1][item["mask"]]
        return forward_kl(item["t_logp"], logits, self.temperature), logits, item["t_logp"]

    # ------------------------------------------------------------------ export
    def state_dict(self) -> dict:
        """Drafter tensors in its own checkpoint names (detached copies), for `drafter_weights=`."""
        return {k: v.detach().clone().contiguous() for k, v in self.model.state_dict().items()}

    def save(self, path: str | Path) -> None:
        """A checkpoint directory of the current drafter (weights, config, the drafter's tokenizer files)."""
        import shutil

        self.model.save_pretrained(path, safe_serialization=True)
        for f in Path(self.drafter_dir).glob("tokenizer*"):
            shutil.copy(f, Path(path) / f.name)


class Eagle3Distiller(Distiller):
    """Online trainer of an Eagle3 head (EAGLE/HF layout, one ``llama_eagle3`` layer) on rollouts.

    Teacher side (no grad): one forward of the policy with ``output_hidden_states`` gives the aux
    hidden states at the head's ``eagle_aux_hidden_state_layer_ids`` and the logits (targets at the
    sampling temperature); the head reads the policy's embeddings (vLLM shares them), computed here
    as constants. Trained: ``fc``, ``midlayer.*``, ``norm``, ``lm_head`` (the head's own)."""

    kind = "eagle3"

    def __init__(self, head_dir: str | Path, *, lr: float = 1e-3, seed: int = 0, epochs: int = 2,
                 temperature: float = 1.0, micro_batch_tokens: int = 4096, max_grad_norm: float = 1.0,
                 weight_decay: float = 0.0, ttt: bool = True, num_threads: Optional[int] = None,
                 max_tokens: Optional[int] = None, device: Any = "cpu"):
        from nemo_rl_specdec.train.train_eagle3 import load_head

        if not (Path(head_dir) / "config.json").is_file():
            raise FileNotFoundError(f"head_dir: {head_dir} is not an Eagle3 checkpoint directory (no config.json)")
        self._begin(lr=lr, epochs=epochs, micro_batch_tokens=micro_batch_tokens, max_grad_norm=max_grad_norm,
                    seed=seed, num_threads=num_threads, max_tokens=max_tokens)
        self.head_dir = str(head_dir)
        self.head, self.config = load_head(head_dir)
        self.module = self.head
        self.layer_ids = [int(i) for i in self.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
        self.ttt = bool(ttt)
        self._setup(lr=lr, epochs=epochs, temperature=temperature, micro_batch_tokens=micro_batch_tokens,
                    max_grad_norm=max_grad_norm, weight_decay=weight_decay,
                    vocab_size=int(self.config.get("draft_vocab_size") or self.config["vocab_size"]),
                    max_tokens=max_tokens, device=device)

    def _check_teacher(self, teacher) -> None:
        super()._check_teacher(teacher)
        c = teacher.config
        H = int(self.config.get("target_hidden_size") or self.config["hidden_size"])
        if c.hidden_size != H:
            raise DistillInputError(f"the policy's hidden_size {c.hidden_size} is not the head's target_hidden_size {H}")
        if max(self.layer_ids) >= c.num_hidden_layers:
            raise DistillInputError(f"eagle_aux_hidden_state_layer_ids {self.layer_ids} need a policy with more than "
                                    f"{max(self.layer_ids)} layers; it has {c.num_hidden_layers}")

    def _prepare(self, teacher, ids, mask) -> dict:
        from nemo_rl_specdec.train.train_eagle3 import aux_hidden_and_logits

        # the embeddings are the forward's hidden_states[0]: a separate call of a sharded (FSDP)
        # policy's embedding module would see its weight still sharded
        aux, logits, emb = aux_hidden_and_logits(teacher, ids, self.layer_ids, embeddings=True)
        return {"mask": mask, "aux": self.torch.cat(aux, -1).detach(), "emb": emb.detach(),
                "t_logp": self._teacher_logp(logits), "n": int(mask[:, 1:].sum())}

    def _loss(self, item):
        from nemo_rl_specdec.train.train_eagle3 import eagle3_loss

        return eagle3_loss(self.head, item["mask"], item["aux"], item["t_logp"], item["emb"], ttt=self.ttt,
                           temperature=self.temperature)

    # ------------------------------------------------------------------ export
    def state_dict(self) -> dict:
        """The head's tensors in the EAGLE/HF names vLLM's eagle3 drafter loads (detached copies)."""
        return self.head.checkpoint_tensors()

    def save(self, path: str | Path) -> None:
        """A head checkpoint directory (the original config.json, the current tensors)."""
        import shutil

        from safetensors.torch import save_file

        Path(path).mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(self.head_dir) / "config.json", Path(path) / "config.json")
        save_file(self.state_dict(), str(Path(path) / "model.safetensors"), metadata={"format": "pt"})


class MTPDistiller(Distiller):
    """Online trainer of a MiMo-style MTP layer (``model.mtp_layers.0.*``) on rollouts.

    The layer's tensors are read from the policy checkpoint's safetensors (transformers'
    Qwen2ForCausalLM drops them on load). Teacher side (no grad): the policy's last decoder layer
    output before the final norm h_t, its embeddings of x_{t+1}, its RoPE tables and a detached
    copy of its (tied) lm_head; target at t = the policy's distribution at t+1. vLLM shares the
    embedding and lm_head with the target, so only the MTP layer is trained and pushed."""

    kind = "mtp"

    def __init__(self, model_dir: str | Path, *, lr: float = 1e-3, seed: int = 0, epochs: int = 2,
                 temperature: float = 1.0, micro_batch_tokens: int = 4096, max_grad_norm: float = 1.0,
                 weight_decay: float = 0.0, num_threads: Optional[int] = None,
                 max_tokens: Optional[int] = None, device: Any = "cpu"):
        from nemo_rl_specdec.train.train_tiny_mtp import load_mtp_layer

        if not Path(model_dir).is_dir():
            raise FileNotFoundError(f"model_dir: {model_dir} is not a checkpoint directory")
        self._begin(lr=lr, epochs=epochs, micro_batch_tokens=micro_batch_tokens, max_grad_norm=max_grad_norm,
                    seed=seed, num_threads=num_threads, max_tokens=max_tokens)
        self.model_dir = str(model_dir)
        try:
            self.mtp, self.config = load_mtp_layer(model_dir)
        except ValueError as e:
            raise DistillInputError(str(e)) from None
        self.module = self.mtp
        self._setup(lr=lr, epochs=epochs, temperature=temperature, micro_batch_tokens=micro_batch_tokens,
                    max_grad_norm=max_grad_norm, weight_decay=weight_decay,
                    vocab_size=self.config.vocab_size, max_tokens=max_tokens, device=device)

    def _check_teacher(self, teacher) -> None:
        super()._check_teacher(teacher)
        if teacher.config.hidden_size != self.config.hidden_size:
            raise DistillInputError(f"the policy's hidden_size {teacher.config.hidden_size} is not the MTP layer's "
                                    f"{self.config.hidden_size}")
        for attr in ("model", "lm_head"):
            if not hasattr(teacher, attr):
                raise DistillInputError(f"the teacher has no .{attr}: expected an HF causal LM (Qwen2ForCausalLM)")

    def _prepare(self, teacher, ids, mask) -> dict:
        from nemo_rl_specdec.train.train_tiny_mtp import mtp_inputs, pre_norm_hidden

        logits, hidden = pre_norm_hidden(teacher, ids)
        h, emb, pos = mtp_inputs(teacher, ids, hidden)
        cos, sin = teacher.model.rotary_emb(h, pos)
        return {"mask": mask, "h": h.detach(), "emb": emb.detach(), "pos": pos, "rope": (cos.detach(), sin.detach()),
                "lm_head": teacher.lm_head.weight.detach(), "t_logp": self._teacher_logp(logits),
                "n": int(mask[:, 1:].sum())}

    def _loss(self, item):
        import torch.nn.functional as F

        rope = item["rope"]
        out = self.mtp(item["h"], item["emb"], item["pos"], lambda x, p: rope)
        logits = F.linear(out, item["lm_head"])[:, :-1]  # position t predicts x_{t+2}
        T1 = logits.shape[1]
        m = item["mask"][:, 1:T1 + 1]
        tgt = item["t_logp"][:, 1:T1 + 1][m]
        return forward_kl(tgt, logits[m], self.temperature), logits[m], tgt

    # ------------------------------------------------------------------ export
    def state_dict(self) -> dict:
        """The MTP layer's tensors as ``model.mtp_layers.0.*`` (what vLLM's MiMo MTP drafter loads)."""
        return self.mtp.checkpoint_tensors()

    def save(self, path: str | Path, policy_state_dict: Optional[dict] = None) -> None:
        """A full MiMo checkpoint directory: the policy (`policy_state_dict`, else the original one's
        non-MTP tensors) plus the current MTP layer, config and tokenizer files copied."""
        import shutil

        from safetensors.torch import load_file, save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        for f in Path(self.model_dir).iterdir():
            if f.is_file() and f.suffix != ".safetensors":
                shutil.copy(f, path / f.name)
        if policy_state_dict is None:
            policy_state_dict = {}
            for f in sorted(Path(self.model_dir).glob("*.safetensors")):
                policy_state_dict.update(load_file(str(f)))
        tensors = {k: v.detach().contiguous() for k, v in policy_state_dict.items()
                   if not k.startswith("model.mtp_layers.")}
        if self.config.tie_word_embeddings:
            tensors.pop("lm_head.weight", None)
        tensors.update(self.state_dict())
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def make_distiller(spec, *, temperature: float, seed: int = 0, model_path: Optional[str] = None, **kw):
    """The online trainer for the configured drafter (`SpecDecConfig`), with the hyper-parameters of
    `refresh.distill` (keyword arguments override them); `model_path` is the policy checkpoint (MTP
    layers live in it). Raises for drafters that have none."""
    d = spec.refresh.distill
    kw = {"lr": d.lr, "epochs": d.epochs, "micro_batch_tokens": d.micro_batch_tokens, "max_tokens": d.max_tokens,
          **kw}
    if spec.drafter == "draft_model":
        if not spec.draft_model.model:
            raise DistillInputError("draft_model.model is not set: no drafter checkpoint to train")
        return DraftModelDistiller(spec.draft_model.model, temperature=temperature, seed=seed, **kw)
    if spec.drafter == "eagle3":
        if not spec.eagle3.model:
            raise DistillInputError("eagle3.model is not set: no Eagle3 head checkpoint to train")
        return Eagle3Distiller(spec.eagle3.model, temperature=temperature, seed=seed, **kw)
    if spec.drafter == "mtp":
        if not model_path:
            raise DistillInputError("drafter 'mtp' trains the MTP layers of the policy checkpoint: pass model_path")
        return MTPDistiller(model_path, temperature=temperature, seed=seed, **kw)
    raise DistillInputError(f"online training is implemented for drafters 'draft_model', 'eagle3' and 'mtp'; "
                            f"got {spec.drafter!r}")
