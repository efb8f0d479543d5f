"""Pure tests of the demo task (no engine): problems, worked solutions, verifier, lengths."""
import json
import random

import pytest

from nemo_rl_specdec.demo import task
from nemo_rl_specdec.demo.task import (
    Problem,
    extract_answer,
    length_stats,
    make_problem,
    make_problems,
    reference_solution,
    verify,
)
from nemo_rl_specdec.resources import asset_path, config_path

POLICY_DIR = asset_path("tiny", "policy")


@pytest.fixture(scope="module")
def bundled_tokenizer():
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(POLICY_DIR))


def test_known_problem_solution_and_answer():
    p = make_problem([37, 45, 12, 91], "x")
    assert p.prompt == "add mod 100: a37 b45 c12 d91\n"
    assert p.answer == "85"  # 37+45+12+91 = 185
    assert reference_solution(p) == "00+a37=37\n37+b45=82\n82+c12=94\n94+d91=85\nanswer: 85"
    assert p.meta == {"numbers": [37, 45, 12, 91], "n": 4, "modulus": 100}


def test_sums_wrapping_below_ten_are_zero_padded():
    p = make_problem([50, 53], "x")
    assert p.answer == "03"
    assert reference_solution(p) == "00+a50=50\n50+b53=03\nanswer: 03"
    assert verify(p, "answer: 3") == 1.0  # leading zeros do not matter
    assert verify(p, "answer: 003") == 1.0


def test_make_problems_is_deterministic_and_prefix_stable():
    a = make_problems(50, seed=3)
    b = make_problems(50, seed=3)
    assert [(p.problem_id, p.prompt, p.answer) for p in a] == [(p.problem_id, p.prompt, p.answer) for p in b]
    assert [p.problem_id for p in a[:3]] == ["p3-0", "p3-1", "p3-2"]
    short = make_problems(10, seed=3)
    assert [p.prompt for p in short] == [p.prompt for p in a[:10]]
    other = make_problems(50, seed=4)
    assert [p.prompt for p in other] != [p.prompt for p in a]
    assert len({p.problem_id for p in a}) == 50


def test_problems_are_well_formed():
    for p in make_problems(500, seed=1):
        nums = p.meta["numbers"]
        assert task.MIN_N <= p.meta["n"] == len(nums) <= task.MAX_N
        assert all(10 <= x <= 99 for x in nums)
        assert int(p.answer) == sum(nums) % 100
        assert p.prompt.startswith(task.PROMPT_HEADER) and p.prompt.endswith("\n")
        labels = [tok[0] for tok in p.prompt[len(task.PROMPT_HEADER):].split()]
        assert "".join(labels) == task.LABELS[: len(nums)]


def test_reference_solutions_verify():
    for p in make_problems(500, seed=2):
        sol = reference_solution(p)
        assert verify(p, sol) == 1.0
        lines = sol.split("\n")
        assert len(lines) == p.meta["n"] + 1  # one step per number + the answer line
        assert lines[-1] == f"answer: {p.answer}"


def test_verifier_rejects_wrong_answers():
    p = make_problem([37, 45, 12, 91], "x")
    good = reference_solution(p)
    assert verify(p, good.replace("answer: 85", "answer: 84")) == 0.0
    assert verify(p, "00+a37=37\n37+b45=82\nanswer: 82") == 0.0
    # the answer line must be the last non-empty line
    assert verify(p, good + "\n94+d91=85") == 0.0
    assert verify(p, good + "\n\n  \n") == 1.0
    # the last answer line counts, not an earlier one
    assert verify(p, "answer: 85\nanswer: 11") == 0.0
    assert verify(p, "answer: 11\nanswer: 85") == 1.0


@pytest.mark.parametrize(
    "garbage",
    ["", "\n\n", "answer:", "answer: ", "answer: x85", "answer: 85x", "answer: -85",
     "answer: 8 5", "answer: 1234567", "ANSWER 85", "\x00\xff<eos>", "🙂" * 50, None, 85, b"answer: 85",
     "answer: ٨٥"],
)
def test_verifier_garbage_scores_zero(garbage):
    p = make_problem([37, 45, 12, 91], "x")
    assert verify(p, garbage) == 0.0


def test_verifier_random_text_never_raises():
    p = make_problems(1, seed=0)[0]
    rng = random.Random(0)
    alphabet = "0123456789+=:\n answer<>\t\x00é"
    for _ in range(2000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        assert verify(p, s) in (0.0, 1.0)


def test_extract_answer():
    assert extract_answer("12+b34=46\nanswer: 46") == "46"
    assert extract_answer("12+b34=46") is None
    assert extract_answer("answer:7 ") == "7"


def test_bad_problem_input_is_rejected():
    with pytest.raises(ValueError):
        make_problem([37], "x")
    with pytest.raises(ValueError):
        make_problem([37, 100], "x")
    with pytest.raises(ValueError):
        make_problem([37] * (len(task.LABELS) + 1), "x")
    with pytest.raises(ValueError):
        make_problems(-1, seed=0)


def test_problem_is_a_dataclass_with_expected_fields():
    p = Problem(problem_id="a", prompt="b", answer="c", meta={})
    assert (p.problem_id, p.prompt, p.answer, p.meta) == ("a", "b", "c", {})


def test_length_distribution_is_long_tailed_with_bundled_tokenizer(bundled_tokenizer):
    problems = make_problems(2000, seed=0)
    st = length_stats(problems, bundled_tokenizer)
    assert st["ratio"] >= 4.0, st
    assert st["p99"] / st["p50"] == pytest.approx(st["ratio"])
    # fits max_new_tokens 512 (with EOS) and max_model_len 1024 together with the prompt
    assert st["max"] + 1 <= 480
    assert st["prompt_max"] + 512 <= 1024
    # the generator's hard cap: n = MAX_N gives the longest possible response
    longest = make_problem([99] * task.MAX_N, "x")
    n_tok = len(bundled_tokenizer.encode(reference_solution(longest), add_special_tokens=False))
    assert n_tok + 1 <= 480


def test_bundled_tokenizer_is_character_level_and_round_trips(bundled_tokenizer):
    for p in make_problems(20, seed=5):
        text = p.prompt + reference_solution(p)
        ids = bundled_tokenizer.encode(text, add_special_tokens=False)
        assert len(ids) == len(text)
        assert bundled_tokenizer.decode(ids) == text
    assert bundled_tokenizer.eos_token == "<eos>" and bundled_tokenizer.pad_token == "<pad>"
    assert bundled_tokenizer.bos_token == "<bos>"
    cfg = json.loads((POLICY_DIR / "config.json").read_text())
    assert len(bundled_tokenizer) <= cfg["vocab_size"] and cfg["vocab_size"] % 64 == 0


def test_run_prompt_format_names_the_key_of_a_bad_value():
    from nemo_rl_specdec.config.run import ConfigError, load_run_config
    from nemo_rl_specdec.demo.task import run_prompt_format

    run_file = str(config_path("tiny_cpu.yaml"))
    assert run_prompt_format(load_run_config(run_file)) == "plain"
    assert run_prompt_format(load_run_config(run_file, ["demo.prompt_format=chat"])) == "chat"
    with pytest.raises(ConfigError, match=r"demo\.prompt_format: got 'html'; allowed: \['plain', 'chat'\]"):
        run_prompt_format(load_run_config(run_file, ["demo.prompt_format=html"]))


def test_demo_and_benches_refuse_a_bad_prompt_format_before_any_engine(capsys):
    from nemo_rl_specdec.cli import main
    from nemo_rl_specdec.config.run import ConfigError, load_run_config
    from nemo_rl_specdec.demo.run import DemoSettings

    run_file = str(config_path("tiny_cpu.yaml"))
    with pytest.raises(ConfigError, match=r"demo\.prompt_format: got 'html'"):
        DemoSettings(load_run_config(run_file, ["demo.prompt_format=html"]))
    for suite in ("drafters", "lockstep", "scheduling"):
        assert main(["bench", run_file, "--suite", suite, "demo.prompt_format=html"]) == 2
        assert "demo.prompt_format: got 'html'" in capsys.readouterr().err


# ----------------------------------------------------------------------------- task families
MIX = ("sum", "sort", "base")


def test_sort_problem_trace_and_answer():
    p = task.make_sort_problem([37, 45, 12, 37], "s")
    assert (p.family, p.prompt, p.answer) == ("sort", "sort: a37 b45 c12 d37\n", "cadb")  # stable: a37 before d37
    assert reference_solution(p) == "a37\na37 b45\nc12 a37 b45\nc12 a37 d37 b45\nanswer: cadb"
    assert verify(p, reference_solution(p)) == 1.0
    assert verify(p, "answer: cabd") == 0.0 and verify(p, "answer: CADB") == 0.0
    with pytest.raises(ValueError):
        task.make_sort_problem([37] * (task.SORT_MAX_N + 1), "s")


def test_base_problem_trace_and_answer():
    p = task.make_base_problem(11, "b")
    assert (p.family, p.prompt, p.answer) == ("base", "base 2: 11\n", "1011")
    assert reference_solution(p) == "11=2*5+1\n5=2*2+1\n2=2*1+0\n1=2*0+1\nanswer: 1011"
    assert verify(p, "junk\nanswer: 1011") == 1.0
    assert verify(p, "answer: 01011") == 0.0 and verify(p, "answer: 11") == 0.0
    for bad in (1, 2 ** task.BASE_MAX_BITS, "11"):
        with pytest.raises(ValueError):
            task.make_base_problem(bad, "b")


def test_a_mixed_pool_draws_every_family_deterministically():
    a = make_problems(300, seed=7, families=MIX)
    assert [(p.problem_id, p.prompt) for p in a] == [(p.problem_id, p.prompt) for p in make_problems(300, 7, list(MIX))]
    assert [p.prompt for p in make_problems(40, 7, MIX)] == [p.prompt for p in a[:40]]
    counts = {f: sum(p.family == f for p in a) for f in MIX}
    assert all(60 <= c <= 140 for c in counts.values()), counts
    for p in a:
        assert verify(p, reference_solution(p)) == 1.0
        assert verify(p, reference_solution(p).rsplit("\n", 1)[0]) == 0.0  # no answer line
        assert p.prompt.startswith(
            {"sum": task.PROMPT_HEADER, "sort": task.SORT_HEADER, "base": task.BASE_HEADER}[p.family]
        )
    # the default pool is the sum family alone, drawn as before families existed
    assert [p.prompt for p in make_problems(50, 3)] == [p.prompt for p in make_problems(50, 3, ["sum"])]
    assert {p.family for p in make_problems(50, 3)} == {"sum"}


@pytest.mark.parametrize("bad", [[], ["sum", "sum"], ["sums"], "sum", None])
def test_bad_families_are_rejected_with_the_allowed_values(bad):
    with pytest.raises(
        ValueError, match=r"allowed: a non-empty list of distinct values from \['sum', 'sort', 'base'\]"
    ):
        make_problems(3, 0, bad)


def test_mixed_families_fit_the_bundled_tokenizer_and_lengths(bundled_tokenizer):
    problems = make_problems(2000, seed=0, families=MIX)
    st = length_stats(problems, bundled_tokenizer)
    assert st["max"] + 1 <= 480 and st["prompt_max"] + 512 <= 1024
    assert st["ratio"] >= 4.0, st
    for p in problems[:60]:
        text = p.prompt + reference_solution(p)
        assert bundled_tokenizer.decode(bundled_tokenizer.encode(text, add_special_tokens=False)) == text


def test_step_credit_and_chat_are_sum_only():
    p = task.make_sort_problem([37, 45], "s")
    with pytest.raises(ValueError, match="sum family only"):
        task.step_credit(p, "a37\nanswer: ab")
    with pytest.raises(ValueError, match="sum family only"):
        task.chat_prompt_text(p)


def test_run_task_families_names_the_key():
    from nemo_rl_specdec.config.run import ConfigError, load_run_config
    from nemo_rl_specdec.demo.task import run_problems, run_task_families

    run_file = str(config_path("tiny_cpu.yaml"))
    assert run_task_families(load_run_config(run_file)) == MIX  # the embedded default mixes all three
    assert run_task_families(load_run_config(str(config_path("smollm2_cpu.yaml")))) == ("sum",)  # the key's default
    mixed = load_run_config(run_file, ["demo.task_families=[sum,sort,base]"])
    assert run_task_families(mixed) == MIX
    assert [p.prompt for p in run_problems(mixed, 20, 1)] == [p.prompt for p in make_problems(20, 1, MIX)]
    with pytest.raises(ConfigError, match=r"demo\.task_families: got \['sum', 'sorting'\]; allowed"):
        run_task_families(load_run_config(run_file, ["demo.task_families=[sum,sorting]"]))
    with pytest.raises(ConfigError, match=r"demo\.task_families: .*demo\.prompt_format 'chat'"):
        run_task_families(load_run_config(run_file, ["demo.task_families=[sum,sort]", "demo.prompt_format=chat"]))
    with pytest.raises(ConfigError, match=r"demo\.task_families: .*demo\.reward 'steps'"):
        run_task_families(load_run_config(run_file, ["demo.task_families=[sum,base]", "demo.reward=steps"]))
    with pytest.raises(ConfigError, match=r"demo\.reward: got 'partial'; allowed: \['exact', 'steps'\]"):
        run_task_families(load_run_config(run_file, ["demo.reward=partial"]))


def test_demo_and_benches_refuse_bad_families_before_any_engine(capsys):
    from nemo_rl_specdec.cli import main
    from nemo_rl_specdec.config.run import ConfigError, load_run_config
    from nemo_rl_specdec.demo.run import DemoSettings

    run_file = str(config_path("tiny_cpu.yaml"))
    with pytest.raises(ConfigError, match=r"demo\.task_families: got \['maths'\]"):
        DemoSettings(load_run_config(run_file, ["demo.task_families=[maths]"]))
    for suite in ("das", "adaptive"):
        assert main(["bench", run_file, "--suite", suite, "demo.task_families=[maths]"]) == 2
        assert "demo.task_families: got ['maths']" in capsys.readouterr().err
