"""The `policy.generation.speculative_decoding` block: schema, defaults, validation, and its
translation to vLLM's `speculative_config`.

A run file is a NeMo-RL-style YAML. Only our block is validated strictly (unknown keys are
errors); the rest of the run file is NeMo-RL's business, except the few generation keys we
read (`model_name`, `temperature`, `top_p`, `top_k`, `max_new_tokens`, `vllm_cfg`).
Every error is a `ConfigError` naming the full dotted key path, the bad value and what is
allowed, raised before any engine starts.
"""
from __future__ import annotations

import copy
import difflib
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from nemo_rl_specdec.config import loader as config_loader
from nemo_rl_specdec.config.schema import (
    ConfigError,
    KByBatchSize,
    PathError as _PathError,
    Strict as _Strict,
    dotted_get,
    float_setting,
    format_errors,
    int_setting,
)
from nemo_rl_specdec.drafters.base import MODEL
from nemo_rl_specdec.drafters.registry import DRAFTERS, drafter as drafter_of, registered
from nemo_rl_specdec.drafters.roles import Declared, ModelWeights, PricedDrafter, Refreshable, RefreshMode, VllmMapping

BLOCK_PATH = "policy.generation.speculative_decoding"


class DistillConfig(_Strict):
    """Online distillation of a model drafter (`refresh.mode: online`; train/distill.py)."""

    lr: float = Field(1e-3, gt=0, description="AdamW learning rate of the drafter")
    epochs: int = Field(2, ge=1, description="passes over the step's rollouts per refresh")
    micro_batch_tokens: int = Field(4096, ge=1, description="padded tokens per teacher/drafter forward")
    max_tokens: int | None = Field(
        8192, ge=1, description="rollout tokens distilled per step and trainer rank (the first ones, in "
                                "order); the teacher's final hidden states of these are held per step; null: all")
    max_transient_gb: float | None = Field(
        None, gt=0, description="memory budget of a distillation step beyond the teacher's weights and the "
                                "drafter's state, in GB: estimated at the policy's shapes before the first step "
                                "(fake tensors, nothing allocated) and refused if above; null: no budget")


class RefreshConfig(_Strict):
    mode: RefreshMode | None = None  # None: drafter default
    every_n_steps: int = Field(1, ge=1)
    max_policy_lag: int = Field(0, ge=0, description="async: policy_version - drafter_version allowed")
    distill: DistillConfig = DistillConfig()


class SchedulingConfig(_Strict):
    placement: Literal["contiguous", "round_robin", "length_aware"] = "contiguous"
    # unset: adaptive where our proposer judges each step and auto_disable is on (DAS, n-gram with
    # ngram.backend: specdec), else uniform
    budget: Literal["uniform", "length_aware", "das", "adaptive"] | None = None
    # [[batch_lo, batch_hi, k], ...] -> vLLM num_speculative_tokens_per_batch_size
    k_by_batch_size: KByBatchSize = None
    # auto: a model drafter's k by batch size, chosen and re-checked from the engine's steps
    # (scheduling/k_auto.py), up to num_speculative_tokens
    k: Literal["auto"] | None = None
    long_fraction: float = Field(0.25, gt=0, le=1, description="share of requests counted as long")
    short_fraction: float = Field(0.25, ge=0, lt=1, description="share of requests that never speculate")

    @model_validator(mode="after")
    def _fractions(self):
        if self.long_fraction + self.short_fraction > 1:
            raise _PathError(
                "short_fraction",
                self.short_fraction,
                f"a value <= 1 - long_fraction ({1 - self.long_fraction:g}); "
                "long_fraction + short_fraction must be <= 1",
            )
        return self


class _SpecDecBlock(_Strict):
    """The block's common settings; `SpecDecConfig` adds one sub-block per registered drafter."""

    enabled: bool = False
    drafter: Literal[tuple(DRAFTERS)] = "suffix"  # type: ignore[valid-type]
    # unset: the drafter's default (`default_k`: 24 for suffix, vLLM's own default there, else 8)
    num_speculative_tokens: int = Field(8, ge=1, le=64)
    # auto: probabilistic for model drafters at T>0 (lossless and far better accepted), else greedy
    draft_sample_method: Literal["auto", "greedy", "probabilistic"] = "auto"
    refresh: RefreshConfig = RefreshConfig()
    scheduling: SchedulingConfig = SchedulingConfig()
    on_refresh_error: Literal["raise", "disable"] = "raise"
    # per step, draft nothing where the drafts are predicted to lose (drafters/machinery/step_judge.py); unset: on
    # for drafters that judge each step themselves (DAS), off for the others
    auto_disable: bool | None = None
    # at a resume from NeMo-RL's checkpoint: carry: restore the drafter's state saved with it (versions, DAS
    # window, online drafter and its optimizer); fresh: start the drafter over on purpose (adapter/checkpoint.py)
    resume: Literal["carry", "fresh"] = "carry"

    @model_validator(mode="after")
    def _coherent(self):
        declared = drafter_of(self, Declared)  # the block's backend, or a hybrid of its parts
        if "num_speculative_tokens" not in self.model_fields_set:
            self.num_speculative_tokens = declared.config.default_k
        allowed = drafter_of(self, Refreshable).refresh_modes
        if self.refresh.mode is None:
            self.refresh.mode = allowed[0]
        elif self.refresh.mode not in allowed:
            raise _PathError("refresh.mode", self.refresh.mode, f"one of {list(allowed)} for {declared.described}")
        changed = [k for k, v in self.refresh.distill if v != DistillConfig.model_fields[k].default]
        if changed and self.refresh.mode != "online":
            raise _PathError(f"refresh.distill.{changed[0]}", getattr(self.refresh.distill, changed[0]),
                             f"its default: refresh.distill applies to refresh.mode 'online' only (mode is "
                             f"{self.refresh.mode!r})")
        lag_needed = self.refresh.every_n_steps - 1
        if self.refresh.mode != "frozen" and lag_needed > self.refresh.max_policy_lag:
            raise _PathError(
                "refresh.max_policy_lag", self.refresh.max_policy_lag,
                f">= {lag_needed}: refresh.every_n_steps={self.refresh.every_n_steps} lets the drafter fall "
                f"{lag_needed} version(s) behind between refreshes",
            )
        per_step = declared.judges_steps  # our proposer cuts each step's drafts
        k_auto = self.scheduling.k == "auto"
        if self.auto_disable is None:
            self.auto_disable = per_step or k_auto
        if self.scheduling.budget is None:
            self.scheduling.budget = "adaptive" if per_step and self.auto_disable else "uniform"
        if k_auto:
            self._check_k_auto()
        if self.enabled:
            declared.check(cast("SpecDecConfig", self))  # the block is only ever built as a SpecDecConfig
            if self.scheduling.budget == "adaptive" and not per_step:
                raise _PathError(
                    "scheduling.budget", "adaptive",
                    f"uniform | length_aware | das for drafter {self.drafter!r}: 'adaptive' cuts each request's "
                    "draft at every step, which only our proposers do: the DAS suffix drafter (suffix.backend: "
                    "das) and n-gram with ngram.backend: specdec")
            if self.auto_disable and not (per_step or k_auto):
                raise _PathError(
                    "auto_disable", True,
                    f"false or unset for drafter {self.drafter!r}: turning speculation off step by step needs "
                    "our proposer, which measures each step: the DAS suffix drafter (suffix.backend: das) or "
                    f"n-gram with ngram.backend: specdec. For {self.drafter!r} as configured, vLLM fixes k per "
                    "batch size at engine start: set scheduling.k_by_batch_size with k=0 for the batch sizes "
                    "where speculation loses, or scheduling.k: auto (model drafters) to have it chosen")
            if self.auto_disable is False and self.scheduling.budget == "adaptive":
                raise _PathError(
                    "auto_disable", False,
                    "true or unset with scheduling.budget: adaptive, which drafts nothing at every step where no "
                    "draft token pays (it includes auto_disable)")
        if self.scheduling.k_by_batch_size:
            top = max(k for _, _, k in self.scheduling.k_by_batch_size)
            if top > self.num_speculative_tokens:
                raise _PathError(
                    "scheduling.k_by_batch_size", self.scheduling.k_by_batch_size,
                    f"k values <= num_speculative_tokens ({self.num_speculative_tokens})",
                )
        return self

    def _check_k_auto(self) -> None:
        if drafter_of(self, Declared).kind != MODEL:
            raise _PathError(
                "scheduling.k", "auto",
                f"null for drafter {self.drafter!r}: k: auto chooses a model drafter's k by batch size "
                "(draft_model, eagle3, mtp, dflash); a list drafter's drafts are cut per request and step by "
                "scheduling.budget: adaptive (DAS, n-gram with ngram.backend: specdec)")
        if self.scheduling.k_by_batch_size:
            raise _PathError("scheduling.k_by_batch_size", self.scheduling.k_by_batch_size,
                             "null with scheduling.k: auto, which chooses the schedule itself")
        if self.scheduling.budget != "uniform":
            raise _PathError("scheduling.budget", self.scheduling.budget,
                             "uniform with scheduling.k: auto (a model drafter's per-request budgets become a "
                             "k-by-batch-size schedule, which k: auto chooses itself)")


if TYPE_CHECKING:
    class SpecDecConfig(_SpecDecBlock):
        """What a type checker sees: the common settings, and each drafter's sub-block as an attribute."""

        def __getattr__(self, name: str) -> Any: ...
else:
    SpecDecConfig = create_model(
        "SpecDecConfig", __base__=_SpecDecBlock, __module__=__name__,
        __doc__="The whole `policy.generation.speculative_decoding` block: common settings and one sub-block per "
                "drafter.",
        **{name: (d.config, d.config()) for name, d in registered(Declared).items()})


class VllmCfg(BaseModel):
    """The part of NeMo-RL's `policy.generation.vllm_cfg` we read; other keys pass through."""

    model_config = ConfigDict(extra="allow", strict=True)
    max_model_len: int = Field(2048, ge=16, le=1 << 24)
    precision: Literal["float32", "bfloat16", "float16", "fp8"] = "float32"  # fp8: GPU (NeMo-RL) only
    enforce_eager: bool = True
    kv_cache_space_gb: float = Field(1.0, gt=0, le=4096, allow_inf_nan=False,
                                     description="VLLM_CPU_KVCACHE_SPACE on CPU")


class GenerationConfig(BaseModel):
    """`policy.generation`: the sampling settings rollouts use (NeMo-RL names)."""

    model_config = ConfigDict(extra="allow", strict=True)
    backend: Literal["vllm"] = "vllm"
    temperature: float = Field(1.0, ge=0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = None
    max_new_tokens: int = Field(512, ge=1, le=1 << 24)
    vllm_cfg: VllmCfg = VllmCfg()
    speculative_decoding: SpecDecConfig = SpecDecConfig()

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v):
        if v is not None and v != -1 and v < 1:
            raise ValueError("top_k must be null, -1 (off) or >= 1")
        return v

    @model_validator(mode="after")
    def _fits_the_context(self):
        if "max_model_len" in self.vllm_cfg.model_fields_set and self.max_new_tokens > self.vllm_cfg.max_model_len:
            raise _PathError("max_new_tokens", self.max_new_tokens,
                             f"at most vllm_cfg.max_model_len ({self.vllm_cfg.max_model_len}): the prompt and the "
                             "response share the context")
        return self


class RunConfig:
    """A resolved run file: the whole dict, plus the validated generation block."""

    def __init__(self, raw: dict, generation: GenerationConfig, source: str | None = None):
        self.raw = raw
        self.generation = generation
        self.source = source
        self.nemo_rl_parent = False  # composed over a NeMo-RL parent (load_run_config)
        self.not_checked: list[str] = []  # what loading could not check here (load_run_config)

    @property
    def spec(self) -> SpecDecConfig:
        return self.generation.speculative_decoding

    @property
    def model_path(self) -> str:
        """The policy checkpoint, ready to load: a `${specdec_model:NAME}` checkpoint is made here on
        first use (models.ensure), never when the run file is loaded or validated."""
        from nemo_rl_specdec.models import ensure

        return ensure(str(self.raw["policy"]["model_name"]))

    def check_paths(self) -> list[str]:
        """Check the checkpoints the run will load before any engine starts: the policy and, with
        speculation on, the drafter's checkpoint. A local path must be a checkpoint directory (with
        config.json); an id that is not a local path (a Hugging Face id) is not checked here, and a
        named model (`${specdec_model:...}`) is made on first use. Returns what was not checked."""
        from nemo_rl_specdec.models import is_named

        paths = [("policy.model_name", str(self.raw["policy"]["model_name"]))]
        ckpt = drafter_of(self.spec, Declared).checkpoint(self.spec) if self.spec.enabled else None
        if ckpt:
            paths.append((f"{BLOCK_PATH}.{self.spec.drafter}.model", str(ckpt)))
        not_checked = []
        self._check_policy(paths[0][1])
        for key, value in paths:
            p = Path(value).expanduser()
            if is_named(value):
                not_checked.append(f"{key}: {value} is made on first use (docs/smollm2.md)")
            elif p.exists() or value.startswith(("/", "./", "../", "~")) or value.count("/") > 1:
                if not (p / "config.json").is_file():
                    why = "does not exist" if not p.exists() else "has no config.json"
                    raise ConfigError(f"{key}: got {value!r}, which {why}; allowed: a checkpoint directory (with "
                                      "config.json), a Hugging Face id, or ${specdec_model:NAME}")
            else:
                not_checked.append(f"{key}: {value!r} is not a local path (a Hugging Face id?): not downloaded here")
        return not_checked

    def _check_policy(self, policy: str) -> None:
        """The drafter's rules against a local policy checkpoint (`Drafter.check_policy`)."""
        p = Path(policy).expanduser()
        if not self.spec.enabled or not (p / "config.json").is_file():
            return
        try:
            drafter_of(self.spec, Declared).check_policy(self.spec, p)
        except _PathError as e:
            raise ConfigError(f"{BLOCK_PATH}.{e.rel_path}: got {e.value!r}; allowed: {e.allowed}") from None

    def setting(self, dotted: str, default: Any, lo: Any, hi: Any, kind: type = int, lo_open: bool = False) -> Any:
        """The number at `dotted` (or `default` where the run file does not set it), checked: an integer
        (kind int) or a finite number in [lo, hi]; a key above it that holds no mapping is an error."""
        node: Any = self.raw
        parts = dotted.split(".")
        for i, part in enumerate(parts[:-1]):
            node = node.get(part)
            if node is None:
                node = {}
                break
            if not isinstance(node, dict):
                raise ConfigError(f"{'.'.join(parts[:i + 1])}: got {node!r}; allowed: a mapping of settings")
        value = node.get(parts[-1], default)
        if kind is int:
            return int_setting(value, dotted, lo, hi)
        return float_setting(value, dotted, lo, hi, lo_open=lo_open)

    def get(self, dotted: str, default: Any = None) -> Any:
        return dotted_get(self.raw, dotted, default)

    def with_spec(self, **changes) -> RunConfig:
        """A copy with fields of the speculative block replaced (validated again).

        Starts from the block as written, so keys it leaves unset (e.g. `refresh.mode`) take the
        defaults of the new drafter rather than the old one's filled-in values.
        """
        raw = copy.deepcopy(self.raw)
        gen = raw["policy"].get("generation") or {}
        raw["policy"]["generation"] = gen
        gen["speculative_decoding"] = {**(gen.get("speculative_decoding") or {}), **changes}
        return validate_run_dict(raw, self.source)


# --------------------------------------------------------------------------- loading

def _format_pydantic(err: ValidationError) -> str:
    lines = format_errors(err, GenerationConfig, "policy.generation", "docs/configuration.md")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def _reject_misspelt(node: dict, expected: str | list[str], path: str, defined: set | None = None) -> None:
    """The mappings our keys sit in are NeMo-RL's too (extra keys allowed), so a misspelt
    `generation` / `speculative_decoding`, or a misspelt setting we read there (`temperture`), would be
    silently ignored: reject near misses of the keys we read, except keys a NeMo-RL run file defines
    (`defined`: NeMo-RL's `val_temperature` is no typo of `temperature`)."""
    ours = [expected] if isinstance(expected, str) else expected
    for key in node:
        close = difflib.get_close_matches(key, ours, n=1, cutoff=0.85) if isinstance(key, str) else []
        if close and key not in ours and key not in (defined or ()):
            raise ConfigError(
                f"{path}.{key}: unknown key; allowed: '{close[0]}' (did you mean {path}.{close[0]}?) "
                "— a misspelt key would be silently ignored"
            )


def validate_run_dict(raw: dict, source: str | None = None) -> RunConfig:
    """Validate a resolved run dict; raises ConfigError naming the dotted key path."""
    if not isinstance(raw, dict) or not isinstance(raw.get("policy"), dict):
        raise ConfigError("policy: missing; a run file needs a `policy:` mapping")
    policy = raw["policy"]
    _reject_misspelt(policy, "generation", "policy")
    if not policy.get("model_name"):
        raise ConfigError("policy.model_name: missing; allowed: a model path or ${specdec_asset:...}")
    gen = policy.get("generation") or {}
    if not isinstance(gen, dict):
        raise ConfigError(f"policy.generation: got {gen!r}; allowed: a mapping")
    _reject_misspelt(gen, "speculative_decoding", "policy.generation")
    block = gen.get("speculative_decoding")
    if "speculative_decoding" in gen and not isinstance(block, dict):
        raise ConfigError(f"{BLOCK_PATH}: got {block!r}; allowed: a mapping of speculative-decoding settings")
    try:
        generation = GenerationConfig.model_validate(gen)
    except ValidationError as e:
        raise ConfigError(_format_pydantic(e)) from None
    return RunConfig(raw, generation, source)


def validate_spec_block(block: dict | None) -> dict:
    """The speculative block as plain data, validated and with the schema's defaults applied (what the
    driver hands every engine worker); raises ConfigError naming the dotted key path."""
    if block is not None and not isinstance(block, dict):
        raise ConfigError(f"{BLOCK_PATH}: got {block!r}; allowed: a mapping of speculative-decoding settings")
    try:
        generation = GenerationConfig.model_validate({"speculative_decoding": block or {}})
    except ValidationError as e:
        raise ConfigError(_format_pydantic(e)) from None
    return generation.speculative_decoding.model_dump(mode="json")


# The sections of a self-contained run file that `generate`, `demo` and `bench` read besides `policy`,
# and the keys they read there (NeMo-RL's names, except grpo.mode); `bench` holds one mapping per
# suite, each checked by its suite (bench/__init__.py).
RUN_SECTIONS: dict[str, tuple[str, ...]] = {
    "grpo": ("mode", "max_num_steps", "num_prompts_per_step", "num_generations_per_prompt", "learning_rate", "seed"),
    "demo": ("problem_pool", "task_families", "compare_frozen_drafter", "prompt_format", "reward", "hardware"),
    "cluster": ("num_engines",),
}
# `name` becomes a folder (`demo` writes to runs/<name>/): one plain path part
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_run_sections(raw: dict, file_keys: dict[str, set] | None = None) -> None:
    """What our commands read outside the block, checked as strictly as the block. `name` is a plain
    name (no path separators, no `..`). A key of a section in RUN_SECTIONS that the commands do not
    read is an error naming the nearest key they read, as is a near miss of a key we read in
    `policy.generation` or its `vllm_cfg`, or of a section's name (a misspelt section would be ignored
    whole). In a NeMo-RL run file (`file_keys`: what its files define, before overrides) the keys its
    files define are NeMo-RL's and pass; what an override adds is checked all the same."""
    file_keys = file_keys or {}
    name = raw.get("name")
    if name is not None and (not isinstance(name, str) or not RUN_NAME.fullmatch(name)):
        raise ConfigError(f"name: got {name!r}; allowed: a plain name of letters, digits, '.', '_' and '-' (at most "
                          "128, starting with a letter or digit): the demo writes to runs/<name>/, so a path "
                          "separator or '..' would write elsewhere")
    known_top = ["name", "policy", "bench", *RUN_SECTIONS]
    for key in raw:
        close = difflib.get_close_matches(str(key), known_top, n=1, cutoff=0.8)
        if close and key != close[0] and key not in file_keys.get("", ()):
            raise ConfigError(f"{key}: unknown section; did you mean '{close[0]}'? — a misspelt section would be "
                              "silently ignored")
    for section, keys in RUN_SECTIONS.items():
        sec = raw.get(section)
        if sec is None:
            continue
        if not isinstance(sec, dict):
            raise ConfigError(f"{section}: got {sec!r}; allowed: a mapping of settings")
        for key in sec:
            if key not in keys and key not in file_keys.get(section, ()):
                close = difflib.get_close_matches(str(key), keys, n=1, cutoff=0.5)
                hint = f"did you mean '{close[0]}'? " if close else ""
                raise ConfigError(f"{section}.{key}: unknown key; {hint}allowed keys: {list(keys)} — our commands "
                                  "read no other key here, and unknown keys are not ignored")
    gen = (raw.get("policy") or {}).get("generation") if isinstance(raw.get("policy"), dict) else None
    if isinstance(gen, dict):
        _reject_misspelt(gen, list(GenerationConfig.model_fields), "policy.generation",
                         file_keys.get("policy.generation"))
        if isinstance(gen.get("vllm_cfg"), dict):
            _reject_misspelt(gen["vllm_cfg"], list(VllmCfg.model_fields), "policy.generation.vllm_cfg",
                             file_keys.get("policy.generation.vllm_cfg"))


def load_run_config(path: str | None = None, overrides: tuple[str, ...] | list[str] = (), *,
                    nemo_rl_parents_optional: bool = False) -> RunConfig:
    """The one loader of a run file, for every command: compose it with its `defaults:` parents
    (config/loader.py; a `nemo_rl:` parent from the NeMo-RL checkout), apply `key=value` overrides,
    resolve (config/yaml_loader.py), validate the block and the sections our commands read
    (`check_run_sections`), and check the checkpoint paths it names (`RunConfig.check_paths`). A parent
    that is not found is an error; with `nemo_rl_parents_optional` (`validate`) a `nemo_rl:` parent
    without a NeMo-RL checkout is listed in `not_checked` instead."""
    composed = config_loader.compose(path, overrides, config_loader.find_nemo_rl_root())
    unreachable = [m for m in composed.missing_parents if m.startswith(config_loader.NEMO_RL_PREFIX)]
    absent = [m for m in composed.missing_parents if m not in unreachable]
    if absent:
        raise ConfigError(f"{composed.source}: defaults: parent run file(s) not found: {absent}")
    if unreachable and not nemo_rl_parents_optional:
        raise ConfigError(f"{composed.source}: defaults: {unreachable}: no NeMo-RL checkout found; allowed: a NeMo-RL "
                          "checkout named by NEMO_RL_ROOT (or an installed nemo_rl) to compose the run file from")
    raw = composed.resolved()
    raw.pop("defaults", None)
    check_run_sections(raw, composed.file_keys)
    cfg = validate_run_dict(raw, str(composed.source))
    cfg.nemo_rl_parent = composed.uses_nemo_rl_parent and not unreachable
    cfg.not_checked = [f"defaults: {unreachable}: no NeMo-RL checkout found (set NEMO_RL_ROOT); the keys they "
                       "would add were not checked"] if unreachable else []
    cfg.not_checked += cfg.check_paths()
    return cfg


# --------------------------------------------------------------------------- vLLM mapping

# how a drafter's drafting is priced (cost/trace.py kinds): host lookups, k sequential forwards, one block forward
TRACE_KIND = {"host": "list", "sequential": "model", "parallel": "block"}


def cost_entry(spec: SpecDecConfig) -> tuple[str, str | None]:
    """(trace kind, hardware-profile entry) of the block's drafter: ``("none", None)`` without
    speculation; a history drafter's entry names its proposer (``das``, ``vllm_suffix``, ``ngram``,
    ``ngram_specdec``), a model drafter's its name; a drafter made of parts is of kind ``hybrid``
    (its entries: `cost_parts`)."""
    from nemo_rl_specdec.cost.trace import HYBRID

    if not spec.enabled:
        return "none", None
    d = drafter_of(spec, PricedDrafter)
    return (HYBRID if d.cost_parts else TRACE_KIND[d.draft_cost]), d.cost_entry


def cost_parts(spec: SpecDecConfig) -> dict | None:
    """The profile entries of the block's drafter's parts (a hybrid trace's `parts`), or None."""
    return drafter_of(spec, PricedDrafter).cost_parts if spec.enabled else None


def draft_sample_method(spec: SpecDecConfig, temperature: float) -> str:
    return drafter_of(spec, VllmMapping).draft_sample_method(spec, temperature)


def to_vllm_speculative_config(spec: SpecDecConfig, temperature: float = 1.0) -> dict | None:
    """The `speculative_config` dict handed to `vllm.LLM`, or None when speculation is off."""
    if not spec.enabled:
        return None
    out = drafter_of(spec, VllmMapping).vllm_config(spec, temperature)
    if spec.scheduling.k_by_batch_size:
        out["num_speculative_tokens_per_batch_size"] = [list(t) for t in spec.scheduling.k_by_batch_size]
    elif spec.scheduling.k == "auto":  # vLLM's per-batch-size mode, at k everywhere until k_auto.py chooses
        out["num_speculative_tokens_per_batch_size"] = [[1, 1, spec.num_speculative_tokens]]
    return out


# --------------------------------------------------------------------------- colocated sleep

# NeMo-RL's key for the level its colocated engines sleep at, where its vLLM worker reads one; the
# releases we support read none and sleep at level 1 (vLLM offloads the weights pool, drafter included,
# to host memory and brings it back); level 2 discards it, and our wake-up restore reloads the drafter
SLEEP_LEVEL_PATH = "policy.generation.vllm_cfg.sleep_level"


def drafter_weights_key(owner: Any) -> str:
    """The key path of the checkpoint a model drafter's weights come from (`owner`: the drafter as
    `ModelWeights`, a hybrid's model part): MTP layers ride in the policy's."""
    return "policy.model_name" if owner.weights_in_policy_checkpoint else f"{BLOCK_PATH}.{owner.name}.model"


def check_sleep_restorable(level: int, key: str, source: str | None) -> None:
    """A drafter must come back from a sleep at `level`. At level 2 the wake-up restore reloads it from
    its last pushed tensors or, before the first push, from `source` (the checkpoint at `key`), which
    must then be a local path: a hub id is not reloadable inside the engine. ConfigError otherwise."""
    if level < 2 or source is None or Path(source).exists():
        return
    raise ConfigError(
        f"{SLEEP_LEVEL_PATH}: got {level} with {key}={source!r}: a level-2 sleep discards the drafter's weights, "
        f"and the wake-up restore reloads them from {key}, which is not a local path (a hub id cannot be reloaded "
        f"inside the engine); allowed: 1 (the drafter is offloaded to host memory and kept), or {key} as a local "
        "checkpoint directory")


def check_colocated_sleep(gen_cfg: dict, spec: SpecDecConfig) -> None:
    """Refuse, before any engine starts, a colocated run whose sleep level discards a drafter that the
    wake-up restore cannot reload (`check_sleep_restorable`)."""
    level = (gen_cfg.get("vllm_cfg") or {}).get("sleep_level", 1)
    if level not in (1, 2) or isinstance(level, bool):
        raise ConfigError(f"{SLEEP_LEVEL_PATH}: got {level!r}; allowed: 1 or 2")
    if not spec.enabled or not (gen_cfg.get("colocated") or {}).get("enabled"):
        return
    declared = drafter_of(spec, Declared)
    if declared.kind != MODEL:
        return
    owner = drafter_of(spec, ModelWeights)
    source = gen_cfg.get("model_name") if owner.weights_in_policy_checkpoint else declared.checkpoint(spec)
    check_sleep_restorable(level, drafter_weights_key(owner), source)
