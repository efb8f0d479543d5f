"""A small, real GRPO update for the embedded CPU demo (no NeMo-RL).

The trainer holds the HF transformers copy of the policy and applies one GRPO step per call:

- group-relative advantages: for every group (the samples of one prompt),
  ``A_i = (r_i - mean(r_group)) / (std(r_group) + eps)``; a group whose rewards are all equal
  carries no signal (A = 0);
- token-level clipped policy-gradient loss over the rollouts' response tokens,
  ``-sum_t min(rho_t A, clip(rho_t, 1-eps_clip, 1+eps_clip) A) / (total response tokens)``, with
  ``rho_t = exp(logp_new - logp_behaviour)``, dual-clipped at ``c |A|`` for negative advantages; the behaviour
  log-probs are the rollouts' own (vLLM's ``processed_logprobs``, i.e. at the sampling temperature) when
  present, else the current policy's (rho = 1: plain on-policy policy gradient);
- AdamW, gradient-norm clipping; optional KL penalty to the initial policy (k3 estimator).

Then :meth:`GRPOTrainer.state_dict` gives the tensors to push to the engines with
``Engine.update(PolicyUpdate(version, trainer.state_dict(), rollouts=...))``.

    trainer = GRPOTrainer(policy_dir, lr=1e-4, seed=0)
    stats = trainer.step(rollouts, rewards, group_ids)     # {"loss", "grad_norm", ...}
    engine.update(PolicyUpdate(v + 1, trainer.state_dict(), rollouts=rollouts))
"""
from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

from nemo_rl_specdec.rollouts import token_sequences
from nemo_rl_specdec.train.distill import micro_batches


class GRPOInputError(ValueError):
    """Rollouts, rewards and group ids do not line up or hold unusable values."""


def group_advantages(rewards: Sequence[float], group_ids: Sequence[Hashable], eps: float = 1e-6) -> list:
    """GRPO advantages: reward minus its group's mean, over the group's (population) std + eps."""
    if len(rewards) != len(group_ids):
        raise GRPOInputError(f"rewards ({len(rewards)}) and group_ids ({len(group_ids)}) differ in length")
    groups: dict = {}
    for r, g in zip(rewards, group_ids, strict=True):
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(float(r)):
            raise GRPOInputError(f"rewards must be finite numbers, got {r!r}")
        groups.setdefault(g, []).append(float(r))
    stats = {}
    for g, rs in groups.items():
        mu = sum(rs) / len(rs)
        sd = math.sqrt(sum((x - mu) ** 2 for x in rs) / len(rs))
        stats[g] = (mu, sd)
    return [(float(r) - stats[g][0]) / (stats[g][1] + eps) for r, g in zip(rewards, group_ids, strict=True)]


class GRPOTrainer:
    """The HF copy of the policy plus its optimizer; one GRPO update per :meth:`step`."""

    def __init__(
        self,
        policy_dir: str | Path,
        lr: float = 1e-4,
        seed: int = 0,
        *,
        temperature: float = 1.0,
        max_grad_norm: float = 1.0,
        clip_eps: float = 0.2,
        weight_decay: float = 0.0,
        kl_coef: float = 0.0,
        dual_clip_c: float = 3.0,
        micro_batch_tokens: int = 2048,
        use_rollout_logprobs: bool = True,
        num_threads: int | None = None,
    ):
        import torch
        from transformers import AutoModelForCausalLM

        if lr <= 0 or not math.isfinite(lr):
            raise ValueError(f"lr: got {lr!r}; allowed: a finite number > 0")
        if temperature <= 0:
            raise ValueError(f"temperature: got {temperature!r}; allowed: > 0 (the sampling temperature)")
        if max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm: got {max_grad_norm!r}; allowed: > 0")
        if not Path(policy_dir).is_dir():
            raise FileNotFoundError(f"policy_dir: {policy_dir} is not a checkpoint directory")
        from nemo_rl_specdec.openmp import request_torch_threads

        request_torch_threads(num_threads)
        torch.manual_seed(seed)
        self.torch = torch
        self.policy_dir = str(policy_dir)
        self.model = AutoModelForCausalLM.from_pretrained(self.policy_dir, dtype=torch.float32)
        self.model.train()
        self.ref = None
        if kl_coef > 0:
            self.ref = AutoModelForCausalLM.from_pretrained(self.policy_dir, dtype=torch.float32).eval()
            for p in self.ref.parameters():
                p.requires_grad_(False)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=weight_decay)
        self.lr, self.temperature, self.max_grad_norm = lr, float(temperature), float(max_grad_norm)
        self.clip_eps, self.kl_coef = float(clip_eps), float(kl_coef)
        if dual_clip_c <= 1:
            raise ValueError(f"dual_clip_c: got {dual_clip_c!r}; allowed: > 1")
        self.dual_clip_c = float(dual_clip_c)
        self.micro_batch_tokens = int(micro_batch_tokens)
        self.use_rollout_logprobs = use_rollout_logprobs
        self.pad_id = int(self.model.config.pad_token_id or 0)
        self.steps = 0

    # ------------------------------------------------------------------ data
    def _response_logprobs(self, model, batch: list):
        """Log-probs (at the sampling temperature) of each response token; [B, T] plus mask."""
        torch = self.torch
        lens = [len(p) + len(r) for p, r, _ in batch]
        T = max(lens)
        ids = torch.full((len(batch), T), self.pad_id, dtype=torch.long)
        att = torch.zeros((len(batch), T), dtype=torch.long)
        for b, (p, r, _) in enumerate(batch):
            ids[b, :len(p) + len(r)] = torch.tensor(p + r)
            att[b, :len(p) + len(r)] = 1
        logits = model(input_ids=ids, attention_mask=att).logits.float() / self.temperature
        logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        mask = torch.zeros_like(logp)
        for b, (p, r, _) in enumerate(batch):
            mask[b, len(p) - 1:len(p) - 1 + len(r)] = 1.0
        return logp, mask

    # ------------------------------------------------------------------ update
    def step(self, rollouts: Sequence[Any], rewards: Sequence[float], group_ids: Sequence[Hashable]) -> dict:
        """One GRPO update on a batch of rollouts (dicts or objects with prompt_token_ids, token_ids
        and optionally logprobs), their rewards, and the group (prompt) each belongs to."""
        torch = self.torch
        if not (len(rollouts) == len(rewards) == len(group_ids)):
            raise GRPOInputError(f"rollouts ({len(rollouts)}), rewards ({len(rewards)}) and group_ids "
                                 f"({len(group_ids)}) must have the same length")
        if not rollouts:
            raise GRPOInputError("an empty batch has nothing to learn from")
        adv = group_advantages(rewards, group_ids)
        seqs = token_sequences(rollouts, self.model.config.vocab_size, logprobs=self.use_rollout_logprobs,
                               error=GRPOInputError)
        total_tokens = sum(len(r) for _, r, _ in seqs)
        self.opt.zero_grad(set_to_none=True)
        sums = {"loss": 0.0, "clipped": 0.0, "kl": 0.0, "logprob_gap": 0.0, "gap_tokens": 0, "pg": 0.0}
        for idx in micro_batches([len(p) + len(r) for p, r, _ in seqs], self.micro_batch_tokens):
            batch = [seqs[i] for i in idx]
            a = torch.tensor([adv[i] for i in idx], dtype=torch.float32).unsqueeze(1)
            logp, mask = self._response_logprobs(self.model, batch)
            old = logp.detach().clone()
            for b, (p, r, lps) in enumerate(batch):
                if lps is not None:
                    seg = torch.tensor(lps, dtype=torch.float32)
                    sl = slice(len(p) - 1, len(p) - 1 + len(r))
                    sums["logprob_gap"] += float((old[b, sl] - seg).abs().sum())
                    sums["gap_tokens"] += len(r)
                    old[b, sl] = seg
            ratio = torch.exp(logp - old)
            unclipped = ratio * a
            clipped = torch.clamp(ratio, 1 - self.clip_eps, 1 + self.clip_eps) * a
            pg = -torch.minimum(unclipped, clipped)
            # dual clip: with A < 0 a huge ratio would give an unbounded loss; cap it at c * |A|
            pg = torch.where(a < 0, torch.minimum(pg, -self.dual_clip_c * a), pg)
            loss_tok = pg
            if self.ref is not None:
                with torch.no_grad():
                    ref_lp, _ = self._response_logprobs(self.ref, batch)
                d = ref_lp - logp
                kl = torch.exp(d) - d - 1  # k3: unbiased, >= 0
                loss_tok = pg + self.kl_coef * kl
                sums["kl"] += float((kl.detach() * mask).sum())
            loss = (loss_tok * mask).sum() / total_tokens
            loss.backward()
            sums["loss"] += float(loss.detach())
            sums["pg"] += float((pg.detach() * mask).sum()) / total_tokens
            sums["clipped"] += float((((ratio - 1).abs() > self.clip_eps).float() * mask).sum())
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm))
        if not math.isfinite(grad_norm):
            self.opt.zero_grad(set_to_none=True)
            raise FloatingPointError(f"GRPO step {self.steps}: non-finite gradient norm ({grad_norm}); update skipped")
        self.opt.step()
        self.steps += 1
        n_groups = len(set(group_ids))
        informative = len({g for g, x in zip(group_ids, adv, strict=True) if abs(x) > 0})
        return {"step": self.steps, "loss": sums["loss"], "pg_loss": sums["pg"], "grad_norm": grad_norm,
                "mean_reward": sum(float(r) for r in rewards) / len(rewards),
                "num_sequences": len(rollouts), "num_tokens": total_tokens, "groups": n_groups,
                "groups_with_signal": informative, "clip_fraction": sums["clipped"] / total_tokens,
                "kl": sums["kl"] / total_tokens if self.ref is not None else 0.0,
                "behaviour_logprob_gap": (sums["logprob_gap"] / sums["gap_tokens"]) if sums["gap_tokens"] else None,
                "lr": self.lr}

    # ------------------------------------------------------------------ export
    def state_dict(self) -> dict:
        """Detached CPU copies of the policy's tensors under HF names (what Engine.update takes)."""
        return {k: v.detach().clone().cpu() for k, v in self.model.state_dict().items()}

    def save(self, path: str | Path) -> None:
        self.model.save_pretrained(str(path))
