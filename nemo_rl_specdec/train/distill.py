"""Online drafter training: gradient-isolated distillation of a parametric drafter on rollouts.

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
- :meth:`DraftModelDistiller.state_dict` returns the drafter's tensors in its own checkpoint
  names, which the worker extension loads into the live drafter (layerwise reload):

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


class DraftModelDistiller:
    """Online trainer of an external draft model (any HF causal LM sharing the policy's vocab)."""

    kind = "draft_model"

    def __init__(self, drafter_dir: str | Path, *, lr: float = 1e-3, seed: int = 0, epochs: int = 2,
                 temperature: float = 1.0, micro_batch_tokens: int = 4096, max_grad_norm: float = 1.0,
                 weight_decay: float = 0.0, num_threads: Optional[int] = None):
        import torch
        from transformers import AutoModelForCausalLM

        if not Path(drafter_dir).is_dir():
            raise FileNotFoundError(f"drafter_dir: {drafter_dir} is not a checkpoint directory")
        if lr <= 0 or not math.isfinite(lr):
            raise ValueError(f"lr: got {lr!r}; allowed: a finite number > 0")
        if epochs < 1:
            raise ValueError(f"epochs: got {epochs!r}; allowed: an integer >= 1")
        if micro_batch_tokens < 1:
            raise ValueError(f"micro_batch_tokens: got {micro_batch_tokens!r}; allowed: >= 1")
        if num_threads:
            torch.set_num_threads(int(num_threads))
        torch.manual_seed(seed)
        self.torch = torch
        self.drafter_dir = str(drafter_dir)
        self.model = AutoModelForCausalLM.from_pretrained(self.drafter_dir, dtype=torch.float32)
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)
        # T = 0 (greedy) keeps the argmax of any temperature; distil at T = 1 then
        self.temperature = float(temperature) if temperature and temperature > 0 else 1.0
        self.epochs, self.micro_batch_tokens = int(epochs), int(micro_batch_tokens)
        self.max_grad_norm = float(max_grad_norm)
        self.pad_id = int(self.model.config.pad_token_id or 0)
        self.steps = 0
        self.history: list = []

    # ------------------------------------------------------------------ checks
    def _check_teacher(self, teacher) -> None:
        if teacher is self.model:
            raise DistillInputError("the teacher is the drafter itself")
        mine = {id(p) for p in self.model.parameters()}
        shared = [n for n, p in teacher.named_parameters() if id(p) in mine]
        if shared:
            raise DistillInputError(f"the teacher shares {len(shared)} parameter(s) with the drafter (e.g. "
                                    f"{shared[0]!r}); gradients would leak into the policy")
        tv = getattr(teacher.config, "vocab_size", None)
        if tv != self.model.config.vocab_size:
            raise DistillInputError(f"vocabularies differ: policy {tv} vs drafter {self.model.config.vocab_size}")

    # ------------------------------------------------------------------ training
    def teacher_targets(self, teacher, seqs: list, batches: list) -> list:
        """Per micro-batch: (ids, mask, teacher log-probs at response positions [n, V])."""
        import torch
        import torch.nn.functional as F

        was_training = teacher.training
        teacher.eval()
        out = []
        try:
            with torch.no_grad():
                for idx in batches:
                    ids, mask = pad_batch([seqs[i] for i in idx], self.pad_id)
                    logits = teacher(input_ids=ids).logits[:, :-1]
                    out.append((ids, mask, F.log_softmax(logits[mask].float() / self.temperature, dim=-1)))
        finally:
            teacher.train(was_training)
        return out

    def step(self, teacher, rollouts: Sequence[Any]) -> dict:
        """Distil the drafter towards `teacher` (the updated policy) on `rollouts`; returns stats."""
        torch = self.torch
        self._check_teacher(teacher)
        seqs = rollout_sequences(rollouts, self.model.config.vocab_size)
        if not seqs:
            raise DistillInputError("no rollout has response tokens: nothing to distil on")
        t0 = time.perf_counter()
        batches = micro_batches([len(s.prompt) + len(s.response) for s in seqs], self.micro_batch_tokens)
        targets = self.teacher_targets(teacher, seqs, batches)
        teacher_s = time.perf_counter() - t0
        n_tok = sum(int(m.sum()) for _, m, _ in targets)
        agree_before = self._agreement(targets)
        losses = []
        self.model.train()
        for _ in range(self.epochs):
            total = 0.0
            for ids, mask, t_logp in targets:  # one AdamW step per micro-batch
                logits = self.model(input_ids=ids).logits[:, :-1]
                loss = forward_kl(t_logp, logits[mask], self.temperature)
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
                self.opt.step()
                total += loss.item() * int(mask.sum()) / n_tok
            losses.append(total)
        agree_after = self._agreement(targets)
        self.steps += 1
        stats = {"distill_step": self.steps, "tokens": n_tok, "sequences": len(seqs), "epochs": self.epochs,
                 "kl_first": losses[0], "kl_last": losses[-1], "grad_norm": float(grad_norm),
                 "top1_agreement_before": agree_before, "top1_agreement_after": agree_after,
                 "teacher_s": teacher_s, "train_s": time.perf_counter() - t0 - teacher_s,
                 "seconds": time.perf_counter() - t0}
        self.history.append(stats)
        return stats

    def _agreement(self, targets: list) -> float:
        """Fraction of response positions where the drafter's argmax is the policy's argmax."""
        torch = self.torch
        hit = tot = 0
        with torch.no_grad():
            for ids, mask, t_logp in targets:
                pred = self.model(input_ids=ids).logits[:, :-1][mask].argmax(-1)
                hit += int((pred == t_logp.argmax(-1)).sum())
                tot += int(mask.sum())
        return hit / max(1, tot)

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


def make_distiller(spec, *, temperature: float, seed: int = 0, **kw):
    """The online trainer for the configured drafter (`SpecDecConfig`); raises for drafters that have none."""
    if spec.drafter == "draft_model":
        if not spec.draft_model.model:
            raise DistillInputError("draft_model.model is not set: no drafter checkpoint to train")
        return DraftModelDistiller(spec.draft_model.model, temperature=temperature, seed=seed, **kw)
    raise DistillInputError(f"online training is implemented for drafter 'draft_model'; got {spec.drafter!r} "
                            "(mtp heads refresh by refit from the policy stream)")
