"""cli.py: every subcommand and its flags in one parser; `generate`'s input is checked, naming the
line, before any engine starts. (validate: test_config.py; simulate: sim/; the engine run of
generate: tests/engine/test_cli_generate.py.)"""
from __future__ import annotations

import json

import pytest

from nemo_rl_specdec import cli
from nemo_rl_specdec.resources import config_path

FLAGS = {
    "validate": set(),
    "generate": {"--prompts", "--out", "--n", "--seed", "--no-spec"},
    "demo": {"--out"},
    "bench": {"--json", "--suite"},
    "simulate": {"--json", "--plots", "--all", "--crosscheck"},
    "price": {"--hardware", "--baseline", "--drafter", "--rows", "--fit-proposer", "--json"},
}


def test_every_subcommand_and_flag_is_in_the_one_parser():
    ap = cli.build_parser()
    (sub,) = [a for a in ap._actions if a.dest == "command"]
    assert set(sub.choices) == set(FLAGS)
    for name, flags in FLAGS.items():
        got = {o for a in sub.choices[name]._actions for o in a.option_strings} - {"-h", "--help"}
        assert got == flags, name


@pytest.mark.parametrize("lines,fragment", [
    (['{"prompt": "a"}', "not json"], r":2: not JSON"),
    (['{"prompt": "a", "prompt_token_ids": [1]}'], r":1: need exactly one of 'prompt'"),
    (['{"prompt_token_ids": []}'], r":1: 'prompt_token_ids' must be a non-empty list of token ids"),
    (["", "  "], r": no prompts"),
])
def test_generate_names_the_bad_prompt_line(tmp_path, lines, fragment):
    p = tmp_path / "p.jsonl"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(cli.ConfigError, match=fragment):
        cli.read_prompts(str(p))


def test_generate_rejects_bad_input_before_any_engine(tmp_path, capsys):
    p = tmp_path / "p.jsonl"
    p.write_text(json.dumps({"prompt": "add mod 100: a 1 b 2\n", "problem_id": "x"}) + "\n")
    assert cli.read_prompts(str(p)) == [{"prompt": "add mod 100: a 1 b 2\n", "problem_id": "x"}]
    out = str(tmp_path / "o.jsonl")
    assert cli.main(["generate", str(config_path("tiny_cpu.yaml")), "--prompts", str(p), "--out", out, "--n", "0"]) == 2
    assert "--n: got 0; allowed: an integer >= 1" in capsys.readouterr().err
    assert cli.main(["generate", "tiny_cpu.yaml", "--prompts", str(tmp_path / "none.jsonl"), "--out", out]) == 2
    assert "--prompts: file" in capsys.readouterr().err
