"""The `draft_model` drafter: an external small causal LM that shares the policy's tokenizer;
vLLM's `draft_model` method runs it k times per step.

Owns its `draft_model:` sub-block, its vLLM mapping and its online distiller (the drafter is a
plain HF model, so no module of its own). In NeMo-RL it is distilled online in the policy workers
or kept frozen; NeMo-RL has no trainer that streams it.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from nemo_rl_specdec.drafters.base import CheckpointDrafter
from nemo_rl_specdec.drafters.roles import Block, DrafterSettings
from nemo_rl_specdec.train.distill import TRAINABLE_DTYPES, Distiller, DistillInputError, estimating, final_hidden
from nemo_rl_specdec.train.kl import KL, linear_forward_kl

if TYPE_CHECKING:
    import numpy as np
    import torch


class DraftModelConfig(DrafterSettings):
    model: str | None = Field(None, description="path of an HF checkpoint sharing the policy's tokenizer")


class DraftModel(CheckpointDrafter):
    name = "draft_model"
    config = DraftModelConfig
    refresh_modes = ("online", "refit", "frozen")
    variants = (("draft_model", ("num_speculative_tokens=4", "refresh.mode=frozen")),)
    refit_hint = "NeMo-RL trains no external draft model; use 'online' (distilled in the policy workers) or 'frozen'"

    def distiller_class(self) -> type[DraftModelDistiller]:
        return DraftModelDistiller

    def teacher_forced(self, spec: Block, policy: Any) -> Callable[[Sequence[int], int, int], np.ndarray]:
        """`roles.TeacherForced`: (ids, first, k) -> the draft model's greedy k-token drafts at every
        position of a recorded sequence (`greedy_drafts`); `policy` is not read (the draft sees tokens only)."""
        import torch
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(self.checkpoint(spec)), dtype=torch.float32).eval()
        return lambda ids, first, k: greedy_drafts(model, torch.tensor(ids), k, first).numpy()


def greedy_drafts(model: Any, ids: torch.Tensor, k: int, first: int) -> torch.Tensor:
    """The draft model's greedy k-token drafts at every decode position of one recorded sequence `ids` [T],
    as vLLM's draft_model proposer makes them with greedy drafts: row r of the returned [T - first, k]
    tensor is the draft for text indices m, ..., m + k - 1 made when tokens 0 .. m - 1 are verified
    (m = first + r, 1 <= first < T): its first token is the draft's argmax after x_0 .. x_{m-1}, each next
    one its argmax after those and its own draft so far.

    One forward per draft position for every row at once: the text, then the rows' draft tokens so far,
    each at its own position (m - 1 + j), under a mask that lets it see the text up to x_{m-1} and its own
    row's earlier draft tokens (the draft's KV cache in vLLM: the verified tokens, then the draft's)."""
    import torch

    T = int(ids.shape[0])
    if not 1 <= first < T or k < 1:
        raise ValueError(f"greedy_drafts: first={first}, k={k} for a sequence of {T} tokens; allowed: 1 <= first < T "
                         "and k >= 1")
    R = T - first
    m = torch.arange(first, T)
    dtype = next(model.parameters()).dtype
    with torch.no_grad():
        tok = model(input_ids=ids[None], use_cache=False).logits[0, m - 1].argmax(-1)
        out, chain = [tok], []
        for j in range(1, k):
            chain.append(tok)
            Q, idx = T + j * R, torch.arange(T + j * R)
            pos = torch.cat([torch.arange(T), *[m - 1 + i for i in range(1, j + 1)]])
            row = torch.cat([torch.full((T,), -1), torch.arange(R).repeat(j)])          # a draft token's row
            step = torch.cat([torch.zeros(T, dtype=torch.long), torch.arange(1, j + 1).repeat_interleave(R)])
            text = step == 0
            seen = torch.where(text, idx + 1, m[row.clamp(min=0)])   # text keys a query sees: 0 .. seen - 1
            allow = text[None, :] & (idx[None, :] < seen[:, None])
            allow |= ~text[:, None] & ~text[None, :] & (row[:, None] == row[None, :]) & (step[None, :] <= step[:, None])
            mask = torch.zeros(Q, Q, dtype=dtype).masked_fill(~allow, torch.finfo(dtype).min)
            logits = model(input_ids=torch.cat([ids, *chain])[None], position_ids=pos[None],
                           attention_mask=mask[None, None], use_cache=False).logits[0]
            tok = logits[T + (j - 1) * R:].argmax(-1)
            out.append(tok)
        return torch.stack(out, -1)


class DraftModelDistiller(Distiller):
    """Online trainer of an external draft model (any HF causal LM sharing the policy's vocab).

    The drafter's layers run with activation checkpointing where transformers supports it for the
    model (the same gradients; one more forward of the drafter instead of keeping every layer's
    activations), and its logits are made chunk by chunk from its last hidden states (train/kl.py)."""

    kind = "draft_model"

    def _load(self, drafter_dir: str | Path) -> tuple:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        if not Path(drafter_dir).is_dir():
            raise FileNotFoundError(f"drafter_dir: {drafter_dir} is not a checkpoint directory")
        self.drafter_dir = str(drafter_dir)
        saved = str(getattr(AutoConfig.from_pretrained(self.drafter_dir), "dtype", None) or "float32")
        if saved.removeprefix("torch.") not in TRAINABLE_DTYPES:
            raise DistillInputError(f"draft_model: the drafter checkpoint {self.drafter_dir} is {saved}; allowed: "
                                    f"{list(TRAINABLE_DTYPES)} (it is trained in float32)")
        if estimating():  # shapes only (train/estimate.py): built from the config, no values to load
            self.model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(self.drafter_dir),
                                                          dtype=torch.float32)
        else:
            self.model = AutoModelForCausalLM.from_pretrained(self.drafter_dir, dtype=torch.float32)
        if self.model.supports_gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.pad_id = int(self.model.config.pad_token_id or 0)
        return self.model, self.model.config.vocab_size

    def _pad_id(self, teacher: Any) -> int:
        return self.pad_id

    def _prepare(self, teacher: Any, ids: torch.Tensor, mask: torch.Tensor) -> dict:
        _, h = self._teacher_forward(teacher, ids)
        return {"ids": ids, "mask": mask, "t_hidden": h[:, :-1][mask], "n": int(mask.sum())}

    def _loss(self, item: dict) -> KL:
        proj = self.model.get_output_embeddings().weight
        out = self.model(input_ids=item["ids"], output_hidden_states=True, logits_to_keep=1, use_cache=False)
        h = final_hidden(out, proj, "the drafter")[:, :-1][item["mask"]]
        return linear_forward_kl(h, proj, item["t_hidden"], self.t_out, temperature=self.temperature)

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
