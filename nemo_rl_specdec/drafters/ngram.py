"""n-gram prompt lookup (vLLM's `ngram`): the baseline list drafter, nothing to refresh."""
from __future__ import annotations

from pydantic import Field, model_validator

from nemo_rl_specdec.drafters.base import HOST, LIST, Drafter
from nemo_rl_specdec.schema import PathError, Strict


class NgramConfig(Strict):
    prompt_lookup_min: int = Field(2, ge=1)
    prompt_lookup_max: int = Field(4, ge=1)

    @model_validator(mode="after")
    def _order(self):
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise PathError(
                "prompt_lookup_min", self.prompt_lookup_min,
                f"a value <= prompt_lookup_max ({self.prompt_lookup_max})",
            )
        return self


class Ngram(Drafter):
    name = "ngram"
    kind = LIST
    draft_cost = HOST
    config = NgramConfig
    refresh_modes = ("frozen",)
    bench_rows = (("ngram", ()),)

    def vllm_config(self, spec, temperature):
        c = spec.ngram
        return {"method": "ngram", "num_speculative_tokens": spec.num_speculative_tokens,
                "prompt_lookup_min": c.prompt_lookup_min, "prompt_lookup_max": c.prompt_lookup_max}
