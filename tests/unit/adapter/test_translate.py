"""translate.py: validating the block inside a NeMo-RL run, the drafter's weight source, the
refresh modes NeMo-RL can honour, the speculative_config written into the generation config, and
the worker / extension classes chosen."""
from __future__ import annotations

import pytest
from fakes import (  # noqa: E402
    REPO,
    gen_cfg,
    run_dict,
    spec,
)

from nemo_rl_specdec.adapter import api, translate
from nemo_rl_specdec.config.run import ConfigError, to_vllm_speculative_config


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


def test_nemo_rl_refuses_settings_it_cannot_honour():
    """A model drafter cannot be dropped from NeMo-RL's running engine (no silent 'disable');
    vLLM needs the k-by-batch-size schedule to start at batch size 1."""
    with pytest.raises(ConfigError,
                       match=r"on_refresh_error: got 'disable' with drafter='eagle3'.*allowed here: 'raise'"):
        translate.check_run(run_dict(gen_cfg(drafter="eagle3", eagle3={"model": "e"}, refresh={"mode": "frozen"},
                                             on_refresh_error="disable")))
    assert translate.check_run(run_dict(gen_cfg(drafter="suffix", on_refresh_error="disable"))) is not None
    with pytest.raises(ConfigError, match=r"k_by_batch_size.*first range must start at batch size 1"):
        translate.check_run(run_dict(gen_cfg(drafter="ngram", scheduling={"k_by_batch_size": [[2, 8, 3]]})))


def test_async_engine_takes_only_budgets_chosen_inside_the_engine():
    """NeMo-RL's async engine gets one request at a time: a budget computed over the driver's batch
    cannot reach it, the per-step adaptive choice (made inside the engine) can."""
    def async_gen(budget):
        g = gen_cfg(drafter="suffix", scheduling={"budget": budget})
        g["vllm_cfg"]["async_engine"] = True
        return run_dict(g)

    with pytest.raises(ConfigError, match=r"scheduling\.budget: got 'das' with .*async_engine=true.*'adaptive'"):
        translate.check_run(async_gen("das"))
    assert translate.check_run(async_gen("adaptive")) is not None


def test_k_auto_is_refused_with_the_async_engine_whose_scheduler_runs_in_another_process():
    g = gen_cfg(drafter="draft_model", draft_model={"model": "d"}, refresh={"mode": "frozen"}, scheduling={"k": "auto"})
    assert translate.check_run(run_dict(g)).scheduling.k == "auto"
    g["vllm_cfg"]["async_engine"] = True
    with pytest.raises(ConfigError, match=r"scheduling\.k: got 'auto' with .*async_engine=true.*allowed here: null"):
        translate.check_run(run_dict(g))


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
    ({"drafter": "eagle3", "eagle3": {"model": "e"}, "refresh": {"mode": "refit"}}, False, False,
     "policy.draft.enabled=true"),
    ({"drafter": "draft_model", "draft_model": {"model": "d"}, "refresh": {"mode": "refit"}}, False, False,
     "trains no external draft model"),
    ({"drafter": "eagle3", "eagle3": {"model": "e"}, "refresh": {"mode": "frozen"}}, True, False,
     "stream new drafter weights"),
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
    sc = to_vllm_speculative_config(spec(drafter="ngram", num_speculative_tokens=4), 1.0)
    g["vllm_kwargs"] = {"speculative_config": sc}
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
def test_apply_to_generation_config_writes_speculative_config_and_the_load_decision(block, exports, trains_mtp, method,
                                                                                    has_refit):
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
    assert (translate.select_worker_fqn(api.ASYNC_WORKER, gen_cfg(drafter="ngram"), original)
            == translate.OUR_ASYNC_WORKER)
    assert (translate.select_worker_fqn(api.SYNC_WORKER, {"speculative_decoding": {"enabled": False}}, original)
            == "ORIGINAL:" + api.SYNC_WORKER)
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
    assert (translate.worker_python_env(uv, api.SYNC_WORKER, "/venvs", have.__contains__)
            == "/venvs/" + api.SYNC_WORKER + "/bin/python")
    assert translate.worker_python_env(uv, api.ASYNC_WORKER, "/venvs", have.__contains__) == uv
    assert (translate.worker_python_env("/usr/bin/python3", api.SYNC_WORKER, "/venvs", have.__contains__)
            == "/usr/bin/python3")
    monkeypatch.setenv("NEMO_RL_SPECDEC_WORKER_PYTHON", "/opt/py")
    assert translate.worker_python_env(uv, api.SYNC_WORKER, "/venvs") == "/opt/py"
    monkeypatch.delenv("NEMO_RL_SPECDEC_WORKER_PYTHON")
    reg = {api.SYNC_WORKER: "/py", api.ASYNC_WORKER: "/py2"}
    want = {translate.OUR_SYNC_WORKER: "/py", translate.OUR_ASYNC_WORKER: "/py2"}
    assert translate.registry_entries(reg, None) == want
    with pytest.raises(RuntimeError, match="no entry"):
        translate.registry_entries({api.SYNC_WORKER: "/py"}, None)
