"""Bad input to every command, through the real command line: one clear error (exit 2, `error: `
and the file or key named), no traceback, nothing written, and no engine started (each case is
refused before one would start). The simulator's table is tests/unit/sim/test_bad_scenarios.py."""
from __future__ import annotations

import json

import pytest

from nemo_rl_specdec import cli
from nemo_rl_specdec.resources import config_path

TINY = str(config_path("tiny_cpu.yaml"))
B = "policy.generation.speculative_decoding"

TRACE = {"format": "nemo-rl-specdec/trace", "version": 1, "drafter": "das", "kind": "list", "k": 3,
         "source": "replay", "steps": [{"rids": ["a"], "ctx": [10], "drafts": [3], "accepted": [1],
                                        "proposer_s": 1e-4}]}
DEEP = "a: ${k0}\n" + "".join(f"k{i}: ${{k{i + 1}}}\n" for i in range(3000)) + "k3000: 1\n"
FILES = {  # name -> bytes, written into the case's working directory
    "binary.yaml": b"\x00\x01\xff\xfe policy:",
    "nul.yaml": b"policy:\n  model_name: x\x00\n",
    "list.yaml": b"- 1\n- 2\n",
    "broken.yaml": b"policy: [1, 2\n",
    "deep.yaml": DEEP.encode(),
    "cycle.yaml": b"a: ${b}\nb: ${a}\n",
    "hole.yaml": b"policy:\n  model_name: ${nowhere}\n",
    "orphan.yaml": b"defaults: parent.yaml\npolicy:\n  model_name: org/model\n",
    "policy5.yaml": b"policy: 5\n",
    "gen5.yaml": b"policy:\n  model_name: org/model\n  generation: 5\n",
    "afile": b"",
    "prompts_bin.jsonl": b"\xff\xfe\x00",
    "prompts_json.jsonl": b'{"prompt": "1+1="}\n{not json\n',
    "prompts_empty.jsonl": b"\n\n",
    "prompts_vocab.jsonl": b'{"prompt_token_ids": [3, 100000]}\n',
    "prompts_negative.jsonl": b'{"prompt_token_ids": [-1]}\n',
    "prompts_bool.jsonl": b'{"prompt_token_ids": [true]}\n',
    "prompts_blank.jsonl": b'{"prompt": "   "}\n',
    "prompts_both.jsonl": b'{"prompt": "x", "prompt_token_ids": [3]}\n',
    "prompts_pid.jsonl": b'{"prompt": "x", "problem_id": {"a": 1}}\n',
    "prompts_ok.jsonl": b'{"prompt": "1+1="}\n',
    "trace_v0.json": json.dumps({**TRACE, "version": 0}).encode(),
    "trace_ok.json": json.dumps(TRACE).encode(),
    "trace_noproposer.json": json.dumps({**TRACE, "steps": [{**TRACE["steps"][0], "proposer_s": None}]}).encode(),
    "trace_model.json": json.dumps({**TRACE, "kind": "model", "drafter": "medusa"}).encode(),
    "bench_noreplay.json": json.dumps({"suite": "drafters", "results": [{"name": "x"}]}).encode(),
}
(DIR,) = ("adir",)

CASES = [
    # validate: files that are not run files
    (["validate", "missing.yaml"], "missing.yaml"),
    (["validate", "binary.yaml"], "binary.yaml: not a text file"),
    (["validate", "nul.yaml"], "nul.yaml"),
    (["validate", "list.yaml"], "list.yaml: a run file must be a mapping"),
    (["validate", "broken.yaml"], "broken.yaml"),
    (["validate", DIR], "adir: is a directory"),
    (["validate", "deep.yaml"], "deep.yaml: interpolations"),
    (["validate", "cycle.yaml"], "cycle.yaml"),
    (["validate", "hole.yaml"], "policy.model_name"),
    (["validate", "orphan.yaml"], "defaults: parent run file(s) not found"),
    (["validate", "policy5.yaml"], "policy"),
    (["validate", "gen5.yaml"], "policy.generation"),
    # validate: overrides and values
    (["validate", TINY, "a==b"], "a==b"),
    (["validate", TINY, "=b"], "'=b'"),
    (["validate", TINY, "~nope"], "nope does not exist"),
    (["validate", TINY, "policy.generation.temperature=inf"], "policy.generation.temperature"),
    (["validate", TINY, "policy.generation.temperature=-1"], "policy.generation.temperature"),
    (["validate", TINY, "policy.generation.temperature=true"], "policy.generation.temperature"),
    (["validate", TINY, "policy.generation.top_p=nan"], "policy.generation.top_p"),
    (["validate", TINY, "policy.generation.max_new_tokens=100000"], "policy.generation.max_new_tokens"),
    (["validate", TINY, "policy.generation.max_new_tokens=2.5"], "policy.generation.max_new_tokens"),
    (["validate", TINY, "policy.generation.vllm_cfg.max_model_len=1e30"], "policy.generation.vllm_cfg.max_model_len"),
    (["validate", TINY, "policy.model_name=/nonexistent/model"], "policy.model_name"),
    (["validate", TINY, "policy.model_name=./adir"], "policy.model_name"),
    (["validate", TINY, f"{B}.drafter=draft_model", f"{B}.draft_model.model=/nope"], f"{B}.draft_model.model"),
    (["validate", TINY, f"{B}.drafter=medusa"], f"{B}.drafter"),
    (["validate", TINY, f"{B}.num_speculative_tokens=0"], f"{B}.num_speculative_tokens"),
    (["validate", TINY, f"{B}.num_speculative_tokens=true"], f"{B}.num_speculative_tokens"),
    (["validate", TINY, f"{B}.refresh.every_n_steps=-2"], f"{B}.refresh.every_n_steps"),
    (["validate", TINY, f"{B}.drafter=hybrid", f"{B}.hybrid.tail_requests=0"], f"{B}.hybrid.tail_requests"),
    (["bench", TINY, "--suite", "hybrid", "+bench.hybrid.tail_requests=0"], "bench.hybrid.tail_requests"),
    (["validate", TINY, f"{B}.nonsense=1"], f"{B}.nonsense"),
    (["validate", TINY, "policy.generation.speculative_decodng.enabled=true"], "speculative_decodng"),
    # an override that indexes into a value: a plain string, and one an interpolation makes (a path)
    (["validate", TINY, "policy.generation.backend.x=1"], "policy.generation.backend is a value"),
    (["validate", TINY, "policy.model_name.x=1"], "policy.model_name is a value"),
    (["validate", TINY, "+policy.model_name.x=1"], "policy.model_name is a value"),
    (["validate", TINY, f"{B}.eagle3.model.path=x"], f"{B}.eagle3.model is a value"),
    (["demo", TINY, "++policy.model_name.x=1", "--out", "d"], "policy.model_name is a value"),
    # a key our commands do not read, in a section they read: refused with the nearest known key
    (["validate", TINY, "+grpo.moed=async"], "grpo.moed: unknown key; did you mean 'mode'?"),
    (["demo", TINY, "+grpo.moed=async", "--out", "d"], "grpo.moed: unknown key; did you mean 'mode'?"),
    (["demo", TINY, "+demo.problem_poll=40", "--out", "d"], "did you mean 'problem_pool'?"),
    (["bench", TINY, "--suite", "das", "+cluster.num_engine=2"], "did you mean 'num_engines'?"),
    (["bench", TINY, "--suite", "das", "+grpoo.mode=async"], "grpoo: unknown section; did you mean 'grpo'?"),
    (["bench", TINY, "--suite", "das", "+bench.dass.steps=3"], "bench.dass: unknown suite; did you mean 'das'?"),
    (["bench", TINY, "--suite", "refresh", "+bench.refresh.rolouts=3"], "did you mean 'rollouts'?"),
    (["generate", TINY, "+grpo.seeed=1", "--prompts", "prompts_ok.jsonl", "--out", "o.jsonl"], "grpo.seeed"),
    (["validate", TINY, "+policy.generation.temperture=0"], "policy.generation.temperture: unknown key; allowed: "
                                                              "'temperature'"),
    (["generate", TINY, "+policy.generation.vllm_cfg.max_model_length=64", "--prompts", "prompts_ok.jsonl", "--out",
      "o.jsonl"], "did you mean policy.generation.vllm_cfg.max_model_len?"),
    # the run's name is a folder: one plain path part
    (["demo", TINY, "name=../../../somewhere"], "name: got '../../../somewhere'"),
    (["demo", TINY, "name=a/b"], "name: got 'a/b'"),
    (["demo", TINY, "name=.."], "name: got '..'"),
    (["validate", TINY, "name=/abs"], "name: got '/abs'"),
    (["bench", TINY, "--suite", "das", "name=a\\b"], "name: got"),
    # generate
    (["generate", TINY, "--prompts", "missing.jsonl", "--out", "o.jsonl"], "--prompts"),
    (["generate", TINY, "--prompts", DIR, "--out", "o.jsonl"], "--prompts"),
    (["generate", TINY, "--prompts", "prompts_bin.jsonl", "--out", "o.jsonl"], "prompts_bin.jsonl: not a text file"),
    (["generate", TINY, "--prompts", "prompts_json.jsonl", "--out", "o.jsonl"], "prompts_json.jsonl:2"),
    (["generate", TINY, "--prompts", "prompts_empty.jsonl", "--out", "o.jsonl"], "no prompts"),
    (["generate", TINY, "--prompts", "prompts_vocab.jsonl", "--out", "o.jsonl"], "prompts_vocab.jsonl:1"),
    (["generate", TINY, "--prompts", "prompts_negative.jsonl", "--out", "o.jsonl"], "prompts_negative.jsonl:1"),
    (["generate", TINY, "--prompts", "prompts_bool.jsonl", "--out", "o.jsonl"], "prompts_bool.jsonl:1"),
    (["generate", TINY, "--prompts", "prompts_blank.jsonl", "--out", "o.jsonl"], "prompts_blank.jsonl:1"),
    (["generate", TINY, "--prompts", "prompts_both.jsonl", "--out", "o.jsonl"], "prompts_both.jsonl:1"),
    (["generate", TINY, "--prompts", "prompts_pid.jsonl", "--out", "o.jsonl"], "problem_id"),
    (["generate", TINY, "--prompts", "prompts_ok.jsonl", "--out", "o.jsonl", "--n", "0"], "--n"),
    (["generate", TINY, "--prompts", "prompts_ok.jsonl", "--out", "o.jsonl", "--n", "1000000"], "--n"),
    (["generate", TINY, "--prompts", "prompts_ok.jsonl", "--out", DIR], "--out"),
    (["generate", TINY, "--prompts", "prompts_ok.jsonl", "--out", "afile/o.jsonl"], "--out"),
    (["generate", "binary.yaml", "--prompts", "prompts_ok.jsonl", "--out", "o.jsonl"], "binary.yaml"),
    (["generate", "orphan.yaml", "--prompts", "prompts_ok.jsonl", "--out", "o.jsonl"], "defaults"),
    # demo
    (["demo", TINY, "grpo.max_num_steps=abc", "--out", "d"], "grpo.max_num_steps"),
    (["demo", TINY, "grpo.max_num_steps=2.7", "--out", "d"], "grpo.max_num_steps"),
    (["demo", TINY, "grpo.max_num_steps=0", "--out", "d"], "grpo.max_num_steps"),
    (["demo", TINY, "grpo.max_num_steps=1e9", "--out", "d"], "grpo.max_num_steps"),
    (["demo", TINY, "grpo.learning_rate=nan", "--out", "d"], "grpo.learning_rate"),
    (["demo", TINY, "grpo.learning_rate=0", "--out", "d"], "grpo.learning_rate"),
    (["demo", TINY, "grpo.num_generations_per_prompt=1", "--out", "d"], "grpo.num_generations_per_prompt"),
    (["demo", TINY, "grpo.num_generations_per_prompt=true", "--out", "d"], "grpo.num_generations_per_prompt"),
    (["demo", TINY, "grpo.num_prompts_per_step=1024", "grpo.num_generations_per_prompt=64", "--out", "d"],
     "grpo.num_prompts_per_step x grpo.num_generations_per_prompt"),
    (["demo", TINY, "grpo.mode=fast", "--out", "d"], "grpo.mode"),
    (["demo", TINY, "++grpo=5", "--out", "d"], "grpo"),
    (["demo", TINY, "demo.compare_frozen_drafter=maybe", "--out", "d"], "demo.compare_frozen_drafter"),
    (["demo", TINY, "demo.problem_pool=1", "--out", "d"], "demo.problem_pool"),
    (["demo", TINY, f"{B}.enabled=false", "--out", "d"], f"{B}.enabled"),
    (["demo", TINY, "--out", "afile"], "--out"),
    (["demo", TINY, "--out", "afile/d"], "--out"),
    # bench
    (["bench", TINY, "--suite", "nosuch"], "--suite"),
    (["bench", TINY, "--suite", "das", "bench.das.steps=abc"], "bench.das.steps"),
    (["bench", TINY, "--suite", "das", "bench.das.steps=1e9"], "bench.das.steps"),
    (["bench", TINY, "--suite", "das", "bench.das.stepz=5"], "bench.das.stepz"),
    (["bench", TINY, "--suite", "das", "bench.das.windows=[0]"], "bench.das.windows"),
    (["bench", TINY, "--suite", "das", "bench.das=5"], "bench.das"),
    (["bench", TINY, "--suite", "das", "grpo.seed=-1"], "grpo.seed"),
    (["bench", TINY, "--suite", "das", "++grpo=5"], "grpo: got 5"),
    (["bench", TINY, "--suite", "scheduling", "bench.scheduling.engines=1"], "bench.scheduling.engines"),
    (["bench", TINY, "--suite", "scheduling", "grpo.num_prompts_per_step=abc"], "grpo.num_prompts_per_step"),
    (["bench", TINY, "--suite", "drafters", "bench.drafters.repeats=abc"], "bench.drafters.repeats"),
    (["bench", TINY, "--suite", "adaptive", "bench.adaptive.problems=100000"], "bench.adaptive.problems"),
    (["bench", TINY, "--suite", "lockstep", "bench.lockstep.steps=3"], "bench.lockstep.steps"),
    (["bench", TINY, "--suite", "costmodel", "bench.costmodel.batch_sizes=[1]"], "bench.costmodel.batch_sizes"),
    (["bench", TINY, "--suite", "parametric", "bench.parametric.steps=true"], "bench.parametric.steps"),
    (["bench", TINY, "--suite", "das", "bench.das.hardware=a100"], "bench.das.hardware"),
    (["bench", TINY, "--suite", "das", "bench.das.engines=maybe"], "bench.das.engines"),
    (["bench", TINY, "--suite", "adaptive", "bench.adaptive.priced_ks=[0]"], "bench.adaptive.priced_ks"),
    (["bench", TINY, "--suite", "scheduling", "bench.scheduling.priced_draws=0"], "bench.scheduling.priced_draws"),
    (["bench", TINY, "--json", DIR], "--json"),
    (["bench", TINY, "--json", "afile/r.json"], "--json"),
    # price
    (["price", "trace_v0.json"], "version"),
    (["price", "missing.json"], "missing.json"),
    (["price", "afile"], "afile: not JSON"),
    (["price", "trace_noproposer.json"], "steps[0].proposer_s"),
    (["price", "trace_model.json"], "drafters.medusa"),
    (["price", "bench_noreplay.json"], "without replay traces"),
    (["price", "trace_ok.json", "--hardware", "a100"], "--hardware"),
    (["price", "trace_ok.json", "--baseline", "trace_v0.json"], "version"),
    (["price", "trace_ok.json", "--json", DIR], "--json"),
]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    for name, data in FILES.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / DIR).mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("argv, named", CASES, ids=[" ".join(a[:1] + a[2:] if a[1] == TINY else a)[:80]
                                                    for a, _ in CASES])
def test_bad_input_is_one_clear_error_and_leaves_nothing(workdir, capsys, argv, named):
    before = _tree(workdir)
    assert cli.main(list(argv)) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: ") and named in err, err
    assert "Traceback" not in out + err
    assert _tree(workdir) == before


def test_every_subcommand_has_a_table():
    assert {a[0] for a, _ in CASES} | {"simulate"} == set(cli.OUTPUTS) | {"validate"}


def test_validate_says_what_it_could_not_check(workdir, capsys):
    assert cli.main(["validate", str(config_path("qwen3_8b_suffix.yaml"))]) == 0
    not_checked = json.loads(capsys.readouterr().out)["not_checked"]
    assert any("nemo_rl:" in x and "NEMO_RL_ROOT" in x for x in not_checked)
    assert any("policy.model_name" in x and "Qwen/Qwen3-8B" in x for x in not_checked)
    assert cli.main(["validate", TINY]) == 0
    assert json.loads(capsys.readouterr().out)["not_checked"] == []


@pytest.mark.parametrize("argv, named", [
    ([], "the following arguments are required: command"),
    (["simulate"], "nemo-rl-specdec simulate: the following arguments are required: scenario"),
    (["validate"], "required: run_yaml"),
    (["generate", TINY], "required: --prompts, --out"),
    (["nosuch"], "invalid choice: 'nosuch'"),
])
def test_missing_or_unknown_arguments_are_one_error_line(capsys, argv, named):
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and named in err and err.count("\n") == 1, err
