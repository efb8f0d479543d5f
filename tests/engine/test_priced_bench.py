"""The priced figures of a bench are deterministic: the same seeded greedy `bench --suite das` run twice
gives identical priced figures (its texts, replays and the profile's costs are all fixed), and at
T=1 (engines seeded alike) within 2%. The wall clock of the same runs is not compared."""
import json

import pytest

from nemo_rl_specdec import cli

pytest.importorskip("arctic_inference.suffix_decoding._C")

SMALL = ["bench.das.engines=false", "bench.das.steps=5", "bench.das.windows=[4]", "bench.das.scopes=[both]",
         "bench.das.baselines=[vllm_suffix]", "grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=2",
         "policy.generation.max_new_tokens=64"]
PRICED = ("priced_speedup", "priced_speedup_after_3", "priced_rollout_s", "priced_baseline_s", "priced_proposer_s",
          "priced_per_step", "replay_tokens_per_target_forward")


def _priced(tmp_path, name, *extra):
    out = tmp_path / f"{name}.json"
    assert cli.main(["bench", "configs/tiny_cpu.yaml", "--suite", "das", "--json", str(out), *SMALL, *extra]) == 0
    return {r["name"]: {k: r[k] for k in PRICED} for r in json.loads(out.read_text())["results"]}


def test_priced_figures_repeat_exactly_when_greedy_and_within_2_percent_at_t1(tmp_path):
    a = _priced(tmp_path, "greedy", "policy.generation.temperature=0")
    b = _priced(tmp_path, "greedy", "policy.generation.temperature=0")  # a rerun: --json overwrites the first result
    assert a == b and set(a) == {"das_w4_both", "vllm_suffix"}
    assert all(r["priced_speedup"] > 1.0 for r in a.values())
    c = _priced(tmp_path, "t1_a")
    d = _priced(tmp_path, "t1_b")
    for name in c:
        assert d[name]["priced_speedup"] == pytest.approx(c[name]["priced_speedup"], rel=0.02)
        assert d[name]["priced_rollout_s"] == pytest.approx(c[name]["priced_rollout_s"], rel=0.02)
