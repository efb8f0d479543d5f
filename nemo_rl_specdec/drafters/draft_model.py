"""The `draft_model` drafter: an external small causal LM that shares the policy's tokenizer;
vLLM's `draft_model` method runs it k times per step.

Owns its `draft_model:` sub-block, its vLLM mapping and its online distiller (the drafter is a
plain HF model, so no module of its own). In NeMo-RL it is distilled online in the policy workers
or kept frozen; NeMo-RL has no trainer that streams it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from pydantic import Field

from nemo_rl_specdec.drafters.base import CheckpointDrafter
from nemo_rl_specdec.schema import Strict
from nemo_rl_specdec.train.distill import Distiller, forward_kl


class DraftModelConfig(Strict):
    model: Optional[str] = Field(None, description="path of an HF checkpoint sharing the policy's tokenizer")


class DraftModel(CheckpointDrafter):
    name = "draft_model"
    config = DraftModelConfig
    refresh_modes = ("online", "refit", "frozen")
    bench_rows = (("draft_model", ("num_speculative_tokens=4", "refresh.mode=frozen")),)
    refit_hint = "NeMo-RL trains no external draft model; use 'online' (distilled in the policy workers) or 'frozen'"

    def distiller_class(self):
        return DraftModelDistiller


class DraftModelDistiller(Distiller):
    """Online trainer of an external draft model (any HF causal LM sharing the policy's vocab)."""

    kind = "draft_model"

    def _load(self, drafter_dir: str | Path) -> tuple:
        import torch
        from transformers import AutoModelForCausalLM

        if not Path(drafter_dir).is_dir():
            raise FileNotFoundError(f"drafter_dir: {drafter_dir} is not a checkpoint directory")
        self.drafter_dir = str(drafter_dir)
        self.model = AutoModelForCausalLM.from_pretrained(self.drafter_dir, dtype=torch.float32)
        self.pad_id = int(self.model.config.pad_token_id or 0)
        return self.model, self.model.config.vocab_size

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
