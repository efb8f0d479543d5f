"""Hostile inputs to `nemo-rl-specdec simulate`, through the real command line in-process: each is
refused before any work with exit code 2 and one `error: ...` line that names the key or the file,
no traceback, and nothing left behind (each case runs in its own empty folder)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from nemo_rl_specdec.cli import main
from nemo_rl_specdec.resources import config_path

SIM = config_path("sim")
NV = "nvidia_qwen3_8b_rlzero"
TINY = "cpu_tiny"
SMALL = "name: small\nhardware: {c_base_s: 0.01, c_tok_s: 1.0e-4}\nacceptance: {alpha: 0.6}\n" \
        "workload: {num_prompts: 2, generations_per_prompt: 2, lengths: {median: 100, max_len: 400}}\n" \
        "rl: {num_steps: 2}\n"
BENCH_ROW = {"name": "ngram", "drafter": "ngram", "k": 4, "accepted_per_position": [0.5, 0.3, 0.2, 0.1],
             "wall_clock_ratio": 1.2, "lengths": [100, 120]}


def _deep_chain(n: int) -> str:
    """A scenario whose name goes through `n` nested interpolations."""
    inner = "x"
    for _ in range(n):
        inner = "${oc.select:nothing," + inner + "}"
    return SMALL.replace("name: small", f"name: '{inner}'")


def _bench(*rows, **top) -> str:
    return json.dumps({"results": list(rows), **top})


# (id, files to write in the case's folder, arguments after `simulate`, what the error must name)
CASES = [
    # a section of the wrong type, over what it extends or beside a hardware profile
    ("hardware_list_over_mapping", {"s.yaml": f"extends: {TINY}.yaml\nhardware: [1, 2]\n"}, ["s.yaml"],
     ["hardware", "a list", "a mapping"]),
    ("nested_list_over_mapping", {"s.yaml": f"extends: {TINY}.yaml\nworkload: {{lengths: [1]}}\n"}, ["s.yaml"],
     ["workload.lengths", "a list"]),
    ("hardware_scalar_with_profile", {"s.yaml": "extends: predictions/s7_qwen3_8b_dapo_h100_hybrid.yaml\n"
                                                "hardware: 3\n"}, ["s.yaml"], ["hardware: got 3", "a mapping"]),
    ("drafter_list_with_profile", {"s.yaml": "extends: predictions/s7_qwen3_8b_dapo_h100_hybrid.yaml\n"
                                             "drafter: [eagle3]\n"}, ["s.yaml"], ["drafter", "a list"]),
    # numbers: domain, NaN / inf, booleans and strings are not numbers, fractions are not ints
    ("tiny_bandwidth", {}, [NV, "hardware.roofline.mem_bw_Bps=1e-300"],
     ["hardware.roofline.mem_bw_Bps", "1e+06", "1e+15"]),
    ("huge_flops", {}, [NV, "hardware.roofline.flops_per_s=1e30"], ["hardware.roofline.flops_per_s", "1e+18"]),
    ("zero_allreduce", {}, [NV, "hardware.roofline.allreduce_bw_Bps=0"], ["hardware.roofline.allreduce_bw_Bps"]),
    ("k_bool", {}, [TINY, "speculation.num_speculative_tokens=true"],
     ["speculation.num_speculative_tokens", "boolean", "1 to 64"]),
    ("k_fraction", {}, [TINY, "speculation.num_speculative_tokens=3.5"],
     ["speculation.num_speculative_tokens", "an integer"]),
    ("k_string", {}, [TINY, 'speculation.num_speculative_tokens="3"'],
     ["speculation.num_speculative_tokens", "string"]),
    ("k_list", {}, [TINY, "speculation.num_speculative_tokens=[1,2]"], ["speculation.num_speculative_tokens"]),
    ("k_huge", {}, [TINY, "speculation.num_speculative_tokens=1000"], ["speculation.num_speculative_tokens", "64"]),
    ("k_zero", {}, [TINY, "speculation.num_speculative_tokens=0"], ["speculation.num_speculative_tokens"]),
    ("c_base_nan", {}, [TINY, "hardware.c_base_s=.nan"], ["hardware.c_base_s"]),
    ("c_tok_inf", {}, [TINY, "hardware.c_tok_s=.inf"], ["hardware.c_tok_s"]),
    ("c_base_zero", {}, [TINY, "hardware.c_base_s=0"], ["hardware.c_base_s", "1e-09"]),
    ("c_base_negative", {}, [TINY, "hardware.c_base_s=-1"], ["hardware.c_base_s"]),
    ("alpha_above_1", {}, [NV, "acceptance.mean_accepted_length=null", "acceptance.measured_at_k=null",
                           "acceptance.alpha=1.5"], ["acceptance.alpha"]),
    ("trained_depth_below_measured", {}, [NV, "acceptance.trained_depth=2"], ["acceptance.trained_depth", ">= the k"]),
    ("trained_depth_zero", {}, [NV, "acceptance.trained_depth=0"], ["acceptance.trained_depth"]),
    ("trained_depth_with_spread", {}, [NV, "acceptance.trained_depth=3", "acceptance.spread=0.1"],
     ["acceptance.trained_depth", "spread"]),
    ("seed_negative", {}, [TINY, "seed=-1"], ["seed"]),
    ("seed_bool", {}, [TINY, "seed=false"], ["seed", "boolean"]),
    ("memory_tiny", {}, [NV, "hardware.memory_bytes=1"], ["hardware.memory_bytes"]),
    ("memory_below_weights", {}, [NV, "hardware.memory_bytes=1e10"], ["hardware.memory_bytes", "KV cache"]),
    ("weights_zero", {}, [NV, "model.weight_bytes=0"], ["model.weight_bytes"]),
    ("kv_capacity_zero", {}, [TINY, "hardware.kv_capacity_tokens=0"], ["hardware.kv_capacity_tokens"]),
    ("kv_capacity_too_small", {}, [TINY, "hardware.kv_capacity_tokens=10"], ["hardware.kv_capacity_tokens"]),
    ("utilization_zero", {}, [TINY, "hardware.memory_utilization=0"], ["hardware.memory_utilization"]),
    ("training_rate_tiny", {}, [TINY, "rl.training_flops_per_s=0.5"], ["rl.training_flops_per_s"]),
    ("spread_tiny", {}, [TINY, "acceptance.spread=1e-300"], ["acceptance.spread"]),
    ("coverage_zero", {}, [TINY, "drafter.coverage=0"], ["drafter.coverage"]),
    ("sigma_huge", {}, [NV, "workload.lengths.sigma_between=1000"], ["workload.lengths.sigma_between"]),
    ("lag_huge", {}, [NV, "rl.mode=async", "rl.max_policy_lag=1000000"], ["rl.max_policy_lag"]),
    # sizes: a stated maximum, or the work they imply
    ("prompts_float", {}, [TINY, "workload.num_prompts=1e9"], ["workload.num_prompts"]),
    ("prompts_huge", {}, [TINY, "workload.num_prompts=1000000000"], ["workload.num_prompts", "100,000"]),
    ("work_too_large", {}, [TINY, "workload.num_prompts=100000", "workload.generations_per_prompt=1024"],
     ["workload.num_prompts", "1,000,000 simulated events"]),
    ("generations_huge", {}, [TINY, "workload.generations_per_prompt=10000000"], ["workload.generations_per_prompt"]),
    ("steps_huge", {}, [TINY, "rl.num_steps=1000000"], ["rl.num_steps"]),
    ("engines_huge", {}, [TINY, "cluster.num_engines=10000000"], ["cluster.num_engines"]),
    ("gpus_per_engine_huge", {}, [TINY, "hardware.gpus_per_engine=1000000"], ["hardware.gpus_per_engine"]),
    ("max_num_seqs_huge", {}, [TINY, "hardware.max_num_seqs=1000000"], ["hardware.max_num_seqs"]),
    ("max_len_huge", {}, [TINY, "workload.lengths.max_len=1000000000"], ["workload.lengths.max_len"]),
    ("prompt_len_huge", {}, [TINY, "workload.prompt_len=1000000000"], ["workload.prompt_len"]),
    ("history_huge", {}, [NV, "workload.history_rollouts=1000000"], ["workload.history_rollouts"]),
    ("budget_interval_work", {}, ["das_math_r1_distill_7b", "speculation.scheduling.budget_interval_steps=1"],
     ["speculation.scheduling.budget_interval_steps", "simulated events"]),
    ("capture_size_huge", {}, [NV, "hardware.roofline.max_capture_size=1000000000000"],
     ["hardware.roofline.max_capture_size"]),
    ("k_auto_table_too_large", {}, [NV, "speculation.scheduling.k=auto", "hardware.max_num_seqs=4096",
                                    "speculation.num_speculative_tokens=64"], ["speculation.scheduling.k"]),
    ("sweep_engines_too_many", {}, [TINY, "cluster.num_engines=16384", "sweep.num_engines=null", "--plots", "plots"],
     ["sweep.num_engines", "16,384"]),
    ("sweep_k_huge", {}, [TINY, "sweep.num_speculative_tokens=[1,1000]"], ["sweep.num_speculative_tokens"]),
    # empty or malformed lists, unknown keys, wrong types, missing sections
    ("sweep_k_empty", {}, [TINY, "sweep.num_speculative_tokens=[]"], ["sweep.num_speculative_tokens"]),
    ("sweep_engines_zero", {}, [TINY, "sweep.num_engines=[0]"], ["sweep.num_engines"]),
    ("lengths_values_empty", {}, [TINY, "workload.lengths.values=[]"], ["workload.lengths.values"]),
    ("lengths_values_zero", {}, [TINY, "workload.lengths.values=[0]"], ["workload.lengths.values"]),
    ("lengths_values_ignored", {}, [TINY, "workload.lengths.dist=lognormal"], ["workload.lengths.values"]),
    ("conditional_empty", {}, [TINY, "acceptance.mean_accepted_length=null", "acceptance.measured_at_k=null",
                               "++acceptance.conditional=[]"], ["acceptance.conditional"]),
    ("per_position_rising", {}, [TINY, "acceptance.mean_accepted_length=null", "acceptance.measured_at_k=null",
                                 "++acceptance.per_position=[0.2,0.9]"], ["acceptance.per_position"]),
    ("no_acceptance_form", {}, [TINY, "acceptance.mean_accepted_length=null", "acceptance.measured_at_k=null"],
     ["scenario.acceptance"]),
    ("k_schedule_gap", {}, [TINY, "speculation.scheduling.k_by_batch_size=[[2,8,4]]"], ["speculation"]),
    ("k_schedule_bad_entry", {}, [TINY, "speculation.scheduling.k_by_batch_size=[[1,2]]"],
     ["speculation.scheduling.k_by_batch_size"]),
    ("k_schedule_word", {}, [TINY, "speculation.scheduling.k_by_batch_size=fast"],
     ["speculation.scheduling.k_by_batch_size"]),
    ("capture_sizes_empty", {}, [NV, "hardware.roofline.capture_sizes=[]"], ["hardware.roofline.capture_sizes"]),
    ("k_schedule_bool_entry", {}, [TINY, "speculation.scheduling.k_by_batch_size=[[1,2,true]]"],
     ["speculation.scheduling.k_by_batch_size", "entry 0", "integers"]),
    ("k_schedule_overlap", {}, [TINY, "speculation.scheduling.k_by_batch_size=[[1,4,2],[3,8,2]]"],
     ["speculation.scheduling.k_by_batch_size", "entry 1", "ascending"]),
    ("medium_k_above_k", {}, [TINY, "speculation.scheduling.medium_k=10"], ["speculation.scheduling.medium_k"]),
    ("fractions_above_1", {},
     [TINY, "speculation.scheduling.long_fraction=0.9", "speculation.scheduling.short_fraction=0.9"],
     ["speculation.scheduling.short_fraction"]),
    ("fit_samples_one_size", {}, [TINY, "hardware.fit_samples=[[1,1],[1,1]]"], ["hardware.fit_samples"]),
    ("fit_samples_triples", {}, [TINY, "hardware.fit_samples=[[1,1,1],[2,2,2]]"], ["hardware.fit_samples"]),
    ("fit_samples_negative_time", {}, [TINY, "hardware.fit_samples=[[1,-1],[2,2]]"], ["hardware.fit_samples"]),
    ("groups_not_lists", {}, [TINY, "workload.lengths.dist=groups", "workload.lengths.values=null",
                              "++workload.lengths.groups=[1, 2]"], ["workload.lengths.groups"]),
    ("segments_not_from_0", {}, [TINY, "++acceptance.by_response_position=[[1, 1]]"],
     ["acceptance.by_response_position"]),
    ("segment_nan", {}, [TINY, "++acceptance.by_response_position=[[0, 1], [.nan, 1]]"],
     ["acceptance.by_response_position"]),
    ("calibration_point_without_targets", {}, [TINY, "++calibration_points=[{name: x, targets: {}}]"],
     ["calibration_points.0.targets"]),
    ("calibration_not_mapping", {}, [TINY, "calibration=[]"], ["calibration"]),
    ("sweep_alpha_spread_cannot_keep", {}, [TINY, "acceptance.mean_accepted_length=null",
                                            "acceptance.measured_at_k=null", "++acceptance.alpha=0.5",
                                            "acceptance.spread=0.3", "--plots", "plots"], ["sweep.alpha"]),
    ("sweep_engines_work", {}, [NV, "sweep.num_engines=[1,16384]", "--plots", "plots"],
     ["sweep.num_engines", "simulated events"]),
    ("interpolation_missing", {}, [TINY, "hardware.c_base_s=${nothing}"], ["cpu_tiny.yaml", "nothing"]),
    ("measured_graph_max_huge", {"m.json": json.dumps({"model": {}, "samples": [], "graph_max": 10 ** 12})},
     [NV, "hardware.roofline.measured=m.json", "hardware.roofline.mem_bw_Bps=null",
      "hardware.roofline.flops_per_s=null", "hardware.roofline.overhead_s=null"], ["hardware.roofline.measured"]),
    ("unknown_key", {}, [TINY, "speculation.scheduling.placment=length_aware"],
     ["speculation.scheduling.placment", "placement"]),
    ("unknown_section", {}, [TINY, "++foo.bar=1"], ["scenario.foo", "unknown key"]),
    ("missing_section", {}, [TINY, "~hardware"], ["scenario.hardware", "missing"]),
    ("section_not_mapping", {}, [TINY, "hardware=5"], ["scenario.hardware"]),
    ("name_not_string", {}, [TINY, "name=123"], ["scenario.name"]),
    ("bad_placement", {}, [TINY, "speculation.scheduling.placement=fastest"], ["speculation.scheduling.placement"]),
    ("target_min_above_max", {}, [TINY, "calibration={rollout_speedup: {min: 2, max: 1}}"],
     ["calibration.rollout_speedup"]),
    ("target_unknown_metric", {}, [TINY, "calibration={speedup: {value: 2}}"], ["calibration.speedup"]),
    ("malformed_override", {}, [TINY, "speculation.num_speculative_tokens"], ["speculation.num_speculative_tokens"]),
    ("delete_missing_key", {}, [TINY, "~speculation.nothing"], ["speculation.nothing"]),
    ("measured_missing", {}, [NV, "hardware.roofline.measured=nowhere.json", "hardware.roofline.mem_bw_Bps=null",
                              "hardware.roofline.flops_per_s=null", "hardware.roofline.overhead_s=null"],
     ["hardware.roofline.measured"]),
    ("measured_not_samples", {"m.json": "[1, 2, 3]"},
     [NV, "hardware.roofline.measured=m.json", "hardware.roofline.mem_bw_Bps=null",
      "hardware.roofline.flops_per_s=null", "hardware.roofline.overhead_s=null"], ["hardware.roofline.measured"]),
    ("bench_json_not_json", {"b.json": "not json"},
     [TINY, "acceptance.mean_accepted_length=null", "acceptance.measured_at_k=null", "++acceptance.bench_json=b.json"],
     ["acceptance.bench_json"]),
    ("bench_json_a_list", {"b.json": "[1]"},
     [TINY, "acceptance.mean_accepted_length=null", "acceptance.measured_at_k=null", "++acceptance.bench_json=b.json"],
     ["acceptance.bench_json"]),
    # scenario files that are not scenarios
    ("binary_file", {"s.yaml": b"\x00\x01\xff\xfe\x00binary"}, ["s.yaml"], ["s.yaml"]),
    ("nul_bytes", {"s.yaml": SMALL.encode() + b"\x00\n"}, ["s.yaml"], ["s.yaml"]),
    ("not_yaml", {"s.yaml": "name: [unclosed\n  : :\n"}, ["s.yaml"], ["s.yaml"]),
    ("yaml_list", {"s.yaml": "- 1\n- 2\n"}, ["s.yaml"], ["s.yaml"]),
    ("yaml_scalar", {"s.yaml": "just text\n"}, ["s.yaml"], ["s.yaml"]),
    ("empty_file", {"s.yaml": ""}, ["s.yaml"], ["s.yaml"]),
    ("cyclic_interpolation", {"s.yaml": SMALL.replace("name: small", "name: ${description}\ndescription: ${name}")},
     ["s.yaml"], ["s.yaml"]),
    ("deep_interpolation", {"s.yaml": _deep_chain(1500)}, ["s.yaml"], ["s.yaml"]),
    ("run_file", {}, [str(config_path("tiny_cpu.yaml"))], ["tiny_cpu.yaml", "run file"]),
    ("json_not_scenario", {"s.yaml": json.dumps({"samples": [], "model": {}})}, ["s.yaml"],
     ["s.yaml", "not a simulator scenario"]),
    ("not_found", {}, ["nowhere.yaml"], ["nowhere.yaml", "not found"]),
    ("directory", {"d/x.txt": ""}, ["d"], ["'d'", "directory"]),
    ("extends_cycle", {"s.yaml": "extends: s.yaml\n" + SMALL}, ["s.yaml"], ["s.yaml", "cycle"]),
    ("extends_not_a_name", {"s.yaml": "extends: [1, 2]\n" + SMALL}, ["s.yaml"], ["s.yaml", "extends"]),
    ("extends_missing", {"s.yaml": "extends: gone.yaml\n" + SMALL}, ["s.yaml"], ["gone.yaml"]),
    ("calibration_point_bad_override",
     {"s.yaml": SMALL + "calibration_points: [{name: p, overrides: ['speculation.num_speculative_tokens=999'], "
                        "targets: {rollout_speedup: {value: 1.0}}}]\n"}, ["s.yaml"],
     ["speculation.num_speculative_tokens", "s.yaml"]),
    # --all: the file at fault is named, nothing is simulated
    ("all_one_bad_file", {"a.yaml": SMALL, "b.yaml": SMALL + "speculation: {num_speculative_tokens: true}\n"},
     ["--all", "."],
     ["b.yaml", "speculation.num_speculative_tokens"]),
    ("all_binary_file", {"a.yaml": SMALL, "b.yaml": b"\xff\xfe\x00"}, ["--all", "."], ["b.yaml"]),
    ("all_not_a_directory", {"a.yaml": SMALL}, ["--all", "a.yaml"], ["--all", "a.yaml"]),
    ("all_empty_directory", {"d/x.txt": ""}, ["--all", "d"], ["--all", "'d'"]),
    ("all_with_plots", {"a.yaml": SMALL}, ["--all", ".", "--plots", "plots"], ["--plots", "--all"]),
    # output paths: checked before anything runs
    ("json_is_directory", {"d/x.txt": ""}, [TINY, "--json", "d"], ["--json", "d"]),
    ("json_under_a_file", {"f": "x"}, [TINY, "--json", "f/x.json"], ["--json", "f"]),
    ("json_deep_under_a_file", {"f": "x"}, [TINY, "--json", "f/a/b/x.json"], ["--json", "f"]),
    ("plots_is_file", {"f": "x"}, [TINY, "--plots", "f"], ["--plots", "f"]),
    ("plots_under_a_file", {"f": "x"}, [TINY, "--plots", "f/plots"], ["--plots", "f"]),
    ("json_ok_but_bad_scenario", {},
     [TINY, "speculation.num_speculative_tokens=true", "--json", "out/r.json", "--plots", "out/plots"],
     ["speculation.num_speculative_tokens"]),
    # --crosscheck with a bad bench JSON
    ("crosscheck_missing", {}, ["cpu_tiny_demo", "--crosscheck", "nowhere.json"], ["--crosscheck", "nowhere.json"]),
    ("crosscheck_directory", {"d/x.txt": ""}, ["cpu_tiny_demo", "--crosscheck", "d"], ["--crosscheck", "d"]),
    ("crosscheck_not_json", {"b.json": "{not json"}, ["cpu_tiny_demo", "--crosscheck", "b.json"],
     ["--crosscheck", "b.json", "not JSON"]),
    ("crosscheck_binary", {"b.json": b"\xff\xfe\x00\x01"}, ["cpu_tiny_demo", "--crosscheck", "b.json"],
     ["--crosscheck", "b.json"]),
    ("crosscheck_list", {"b.json": "[1, 2]"}, ["cpu_tiny_demo", "--crosscheck", "b.json"], ["--crosscheck", "b.json"]),
    ("crosscheck_no_results", {"b.json": _bench()}, ["cpu_tiny_demo", "--crosscheck", "b.json"],
     ["--crosscheck", "b.json"]),
    ("crosscheck_nan_ratio", {"b.json": _bench({**BENCH_ROW, "wall_clock_ratio": float("nan")})},
     ["cpu_tiny_demo", "--crosscheck", "b.json"], ["b.json", "wall_clock_ratio"]),
    ("crosscheck_k_bool", {"b.json": _bench({**BENCH_ROW, "k": True})}, ["cpu_tiny_demo", "--crosscheck", "b.json"],
     ["b.json", ".k"]),
    ("crosscheck_name_missing", {"b.json": _bench({**BENCH_ROW, "name": None})},
     ["cpu_tiny_demo", "--crosscheck", "b.json"], ["b.json", ".name"]),
    ("crosscheck_lengths_bad", {"b.json": _bench({**BENCH_ROW, "lengths": [0.5]})},
     ["cpu_tiny_demo", "--crosscheck", "b.json"], ["b.json", ".lengths"]),
    ("crosscheck_with_all", {"b.json": _bench(BENCH_ROW)}, ["--all", ".", "--crosscheck", "b.json"], ["--crosscheck"]),
    ("crosscheck_bad_scenario", {"b.json": _bench(BENCH_ROW)},
     ["cpu_tiny_demo", "speculation.num_speculative_tokens=true", "--crosscheck", "b.json"],
     ["speculation.num_speculative_tokens"]),
]


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("files, argv, names", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_error(tmp_path, monkeypatch, capsys, files, argv, names):
    for rel, content in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = _tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    start = time.monotonic()
    rc = main(["simulate", *argv])
    elapsed = time.monotonic() - start
    out, err = capsys.readouterr()
    assert rc == 2, (rc, out[-2000:], err)
    assert "Traceback" not in out + err
    lines = err.splitlines()
    assert lines and lines[0].startswith("error: "), err
    assert sum(line.startswith("error:") for line in lines) == 1, err
    for name in names:
        assert name in lines[0], (name, err)
    assert "rollout (s)" not in out and "wrote" not in out, out        # nothing was simulated or written
    assert _tree(tmp_path) == before, "the refusal left files behind"
    assert elapsed < 30, f"refused only after {elapsed:.0f} s"


def test_every_bundled_scenario_passes_the_checks():
    """The limits admit every bundled scenario and prediction, and the sweeps the CLI would run."""
    from nemo_rl_specdec.sim.report import calibration_variants, check_sweeps
    from nemo_rl_specdec.sim.scenario import load_scenario

    files = sorted(SIM.glob("*.yaml")) + sorted((SIM / "predictions").glob("*.yaml"))
    assert len(files) >= 18
    for f in files:
        sc = load_scenario(str(f))
        check_sweeps(sc)
        calibration_variants(str(f))


def test_all_runs_each_file_and_json_names_them(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.yaml").write_text(SMALL.replace("name: small", "name: a"))
    (tmp_path / "b.yaml").write_text(SMALL.replace("name: small", "name: b"))
    assert main(["simulate", "--all", ".", "--json", "out/all.json"]) == 0
    assert set(json.loads((tmp_path / "out" / "all.json").read_text())) == {"a", "b"}
    assert "Traceback" not in capsys.readouterr().err


def test_a_result_the_model_cannot_time_names_the_file(tmp_path, monkeypatch, capsys):
    """A SimulationError (a NaN or infinite result) is exit 2 and names the scenario's file."""
    from nemo_rl_specdec.sim import report

    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(SMALL)
    monkeypatch.setattr(report, "compare", lambda *a, **k: {"rollout_speedup": float("inf")})
    assert main(["simulate", "s.yaml", "--json", "r.json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: s.yaml: result.rollout_speedup is inf"), err
    assert not (tmp_path / "r.json").exists() and os.listdir(tmp_path) == ["s.yaml"]
