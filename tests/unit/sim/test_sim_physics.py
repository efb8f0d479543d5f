"""The simulator's cost model and capacity limits: roofline, MoE, capture sizes, tensor
parallelism, KV capacity and preemption, acceptance by depth, list-drafter coverage, async
pools, and the rejection of inputs and results the model cannot time. No wall-clock asserts."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from sim_scenarios import build

from nemo_rl_specdec.cost.model import CostModel, ModelShape, Roofline, StepTime, vllm_capture_sizes
from nemo_rl_specdec.sim import acceptance as acc
from nemo_rl_specdec.sim.report import SimulationError, check_finite, simulate
from nemo_rl_specdec.sim.scenario import ScenarioError, load_scenario, validate_scenario
from nemo_rl_specdec.sim.step import simulate_rl
from nemo_rl_specdec.sim.workload import make_batches

# an 8B dense model on one GPU: 16 GB of weights at 6 TB/s, 1.5 PFLOP/s -> knee near 250 tokens
DENSE = ModelShape(weight_bytes=1.6e10, flops_per_token=1.6e10, kv_bytes_per_token=1.5e5)
ROOF = Roofline(mem_bw_Bps=6e12, flops_per_s=1.5e15, overhead_s=5e-4)


def roofline_scenario(**overrides):
    raw = {
        "model": {"weight_bytes": 1.6e10, "flops_per_token": 1.6e10, "kv_bytes_per_token": 1.5e5},
        "hardware": {"max_num_seqs": 256, "roofline": {"mem_bw_Bps": 6e12, "flops_per_s": 1.5e15, "overhead_s": 5e-4}},
        "cluster": {"num_engines": 1},
        "drafter": {"name": "eagle3", "fwd_base_s": 1e-4,
                    "model": {"weight_bytes": 7e8, "flops_per_token": 7e8, "kv_bytes_per_token": 4096}},
        "acceptance": {"alpha": 0.8},
        "speculation": {"num_speculative_tokens": 3},
        "workload": {"num_prompts": 16, "generations_per_prompt": 16, "prompt_len": 64,
                     "lengths": {"dist": "values", "values": [300], "max_len": 300}, "prediction": "none"},
        "rl": {"num_steps": 2},
    }
    return build(raw, overrides)


def step_time(tokens, cm=None, ctx=0.0):
    cm = cm or CostModel(roofline=ROOF, target=DENSE)
    return cm.step_cost(np.zeros(1), np.array([ctx]), np.zeros(1), prefill_tokens=tokens - 1).at(0)


# --------------------------------------------------------------------------- roofline

def test_roofline_is_flat_while_memory_bound_and_linear_past_the_knee():
    knee = ROOF.flops_per_s * DENSE.weight_bytes / (ROOF.mem_bw_Bps * DENSE.flops_per_token)   # 250 tokens
    flat = [step_time(n) for n in (1, 8, 64, 200)]
    assert max(flat) == pytest.approx(min(flat))                 # memory-bound: tokens are free
    assert flat[0] == pytest.approx(ROOF.overhead_s + DENSE.weight_bytes / ROOF.mem_bw_Bps)
    big = [step_time(n) for n in (4 * knee, 8 * knee, 16 * knee)]
    per_token = DENSE.flops_per_token / ROOF.flops_per_s
    assert big[1] - big[0] == pytest.approx(4 * knee * per_token)   # compute-bound: linear in tokens
    assert big[2] - big[1] == pytest.approx(8 * knee * per_token)


@pytest.mark.parametrize("batch,ctx", [(8, 2000.0), (64, 4000.0), (128, 8000.0)])
def test_linearised_roofline_counts_a_requests_context_read_once(batch, ctx):
    """The linear form the submission-time budgets take: per verified token (c_tok), per draft
    token (c_draft), per context token (c_ctx). A request's context read is in c_ctx only, so the
    form gives the roofline's step time at batch, twice the batch and one draft each (c_tok used
    to include the read too, counting it twice and driving c_base to its floor)."""
    cm = CostModel(roofline=ROOF, target=DENSE)
    c_base, c_tok, c_draft, c_ctx = cm.linearised(batch, ctx)
    assert c_base > ROOF.overhead_s + 0.9 * DENSE.weight_bytes / ROOF.mem_bw_Bps   # the weight read
    for n, d in ((batch, 0), (2 * batch, 0), (batch, 1)):
        linear = c_base + c_tok * n * (1 + d) + c_draft * n * d + c_ctx * n * ctx
        assert linear == pytest.approx(cm.mean_step_time(n, d, ctx), rel=1e-6)


def test_kv_reads_move_the_knee():
    # a long context adds bytes: the same token count stays memory-bound longer
    assert step_time(400, ctx=0.0) > step_time(1, ctx=0.0)
    assert step_time(400, ctx=2e5) == pytest.approx(step_time(1, ctx=2e5))


def test_moe_reads_the_experts_its_tokens_touch():
    moe = ModelShape(weight_bytes=3e9, flops_per_token=1e10, num_experts=128, active_experts=4, expert_bytes=6e10)
    for n in (1, 8, 40):
        assert moe.experts_touched_fraction(n) == pytest.approx(1 - (1 - 4 / 128) ** n)
    rng = np.random.default_rng(0)   # the expectation matches sampling 4 distinct experts per token
    hits = np.mean([len({e for _ in range(8) for e in rng.choice(128, 4, replace=False)}) for _ in range(3000)])
    assert hits / 128 == pytest.approx(moe.experts_touched_fraction(8), rel=0.02)
    cm = CostModel(roofline=ROOF, target=moe)
    assert step_time(40, cm) > step_time(8, cm) > step_time(1, cm)   # memory-bound yet growing
    corr = ModelShape(**{**moe.__dict__, "expert_correlation": 0.5})
    one = np.ones(8)
    t_ind = CostModel(roofline=ROOF, target=moe).step_cost(3 * one, 0 * one, one).at(0)
    t_cor = CostModel(roofline=ROOF, target=corr).step_cost(3 * one, 0 * one, one).at(0)
    assert t_cor < t_ind                  # correlated draft tokens touch fewer experts


def test_capture_size_staircase_and_eager_steps():
    sizes = vllm_capture_sizes(512)
    assert sizes[:4] == (1, 2, 4, 8) and sizes[-1] == 512 and 264 not in sizes and 272 in sizes
    roof = Roofline(mem_bw_Bps=1e12, flops_per_s=1e13, overhead_s=0.0, capture_sizes=sizes, eager_overhead_s=0.01)
    cm = CostModel(roofline=roof, target=DENSE)
    assert step_time(9, cm) == pytest.approx(step_time(16, cm))      # padded to the capture size 16
    assert step_time(16, cm) < step_time(17, cm)
    assert step_time(513, cm) - step_time(512, cm) > 0.01             # eager past the largest size


def test_tensor_parallel_splits_work_and_pays_all_reduce():
    shape = ModelShape(weight_bytes=1.6e10, flops_per_token=1.6e10, num_layers=36, hidden_size=4096)
    tp1 = step_time(64, CostModel(roofline=ROOF, target=shape))
    tp4 = Roofline(mem_bw_Bps=6e12, flops_per_s=1.5e15, overhead_s=5e-4, tp=4, allreduce_bw_Bps=3e11,
                   allreduce_latency_s=1e-5)
    t4 = step_time(64, CostModel(roofline=tp4, target=shape))
    reads = shape.weight_bytes / 6e12
    allreduce = 2 * 36 * (1e-5 + 1.5 * 64 * 4096 * 2 / 3e11)
    assert t4 == pytest.approx(5e-4 + reads / 4 + allreduce)
    assert t4 < tp1


def test_step_time_total_is_the_sum_of_its_steps():
    rng = np.random.default_rng(1)
    for _ in range(20):
        st = StepTime(rng.uniform(0, 1), rng.uniform(0, 0.1),
                      [(rng.uniform(0, 1), rng.uniform(-0.01, 0.1), rng.uniform(0, 1), rng.uniform(-0.01, 0.1))
                       for _ in range(3)])
        for n in (1, 2, 7, 50):
            assert st.total(n) == pytest.approx(sum(st.at(j) for j in range(n)))
        budget = st.total(13) - 1e-9
        assert st.steps_within(budget) == 13


def test_drafter_cost_by_kind():
    d = np.array([3.0, 3.0, 0.0, 3.0])
    ctx, rate = np.full(4, 100.0), np.ones(4)
    small = ModelShape(weight_bytes=7e8, flops_per_token=7e8)
    base = dict(roofline=ROOF, target=DENSE, draft_shape=small, draft_fwd_base=1e-4)
    t0 = CostModel(roofline=ROOF, target=DENSE).step_cost(np.zeros(4), ctx, rate).at(0)
    model = CostModel(draft_kind="model", **base).step_cost(d, ctx, rate).at(0) - t0
    block = CostModel(draft_kind="block", **base).step_cost(d, ctx, rate).at(0) - t0
    lst = CostModel(draft_kind="list", roofline=ROOF, target=DENSE, draft_per_request=2e-5,
                    spec_step_overhead=1e-4).step_cost(d, ctx, rate).at(0) - t0
    one_fwd = 1e-4 + 7e8 / 6e12
    verify = 0.0                                          # 13 tokens: still memory-bound
    assert model == pytest.approx(3 * one_fwd + verify)   # three sequential forwards
    assert block == pytest.approx(one_fwd + verify)       # one parallel forward
    assert lst == pytest.approx(1e-4 + 4 * 2e-5)          # sync + host time per running request (the
    # proposer runs for every request of the step, drafting or not)


# --------------------------------------------------------------------------- whole runs

def test_k_sweep_rises_then_falls_when_compute_bound():
    sc = roofline_scenario(**{"workload.num_prompts": 4})      # 64 requests: 64 x (k + 1) tokens per step
    batches = make_batches(sc.workload, sc.rl.num_steps, sc.seed)
    base = simulate_rl(sc, speculative=False, batches=batches)
    speedups = [base.rollout_s / simulate_rl(sc, speculative=True, k=k, batches=batches).rollout_s
                for k in (1, 2, 3, 4, 6, 8, 12)]
    best = int(np.argmax(speedups))
    assert 0 < best < len(speedups) - 1, speedups
    assert speedups[-1] < speedups[best] - 0.1
    # the same sweep with a memory-bound batch keeps rising to the largest k tried below 8
    small = roofline_scenario(**{"workload.num_prompts": 1, "workload.generations_per_prompt": 4})
    sb = make_batches(small.workload, small.rl.num_steps, small.seed)
    b0 = simulate_rl(small, speculative=False, batches=sb)
    s_small = [b0.rollout_s / simulate_rl(small, speculative=True, k=k, batches=sb).rollout_s for k in (1, 2, 3, 4)]
    assert s_small == sorted(s_small)


def test_kv_capacity_limits_concurrency_and_preempts():
    roomy = simulate(roofline_scenario(**{"hardware.kv_capacity_tokens": 10 ** 7}))
    assert roomy["preemptions_baseline"] == roomy["preemptions_spec"] == 0
    tight = simulate(roofline_scenario(**{"hardware.kv_capacity_tokens": 40 * 364}))
    assert tight["preemptions_baseline"] > 0 and tight["preemptions_spec"] > 0
    assert tight["rollout_s_baseline"] > roomy["rollout_s_baseline"]
    # every request still finishes: tokens per second are finite and positive
    assert tight["output_tokens_per_s_spec"] > 0


def test_lookahead_slots_lower_concurrency():
    from nemo_rl_specdec.sim.engine_sim import EngineSim, SimRequest, SpecPolicy

    def starts(k):
        cm = CostModel(c_base=0.01, c_tok=1e-4)
        eng = EngineSim(0, cm, SpecPolicy(k=k) if k else None, 16, lambda r, g: 1.0, kv_capacity=4 * 101)
        reqs = [SimRequest(i, 0, "p", 1, 100, np.ones(k + 1)) for i in range(4)]
        eng.add(reqs, 0.0)
        eng.run_until_done(0)
        return [r.start for r in reqs]

    assert starts(0) == [0.0] * 4                  # 4 x (100 context + 1) slots fit exactly
    assert starts(8)[:3] == [0.0] * 3 and starts(8)[3] > 0.0   # 8 lookahead slots each: only 3 fit


def test_kv_capacity_from_memory():
    sc = roofline_scenario(**{"hardware.memory_bytes": 8e10, "hardware.memory_utilization": 0.9})
    free = 8e10 * 0.9 - 1.6e10 - 7e8
    assert sc.kv_capacity_tokens == pytest.approx(free / (1.5e5 + 4096))


def test_list_drafter_coverage_lowers_the_speedup():
    over = {"drafter": {"name": "ngram", "per_request_s": 2e-5, "step_overhead_s": 2e-4}, "acceptance.alpha": 0.7}
    full = simulate(roofline_scenario(**over))
    half = simulate(roofline_scenario(**{**over, "drafter": {**over["drafter"], "coverage": 0.3}}))
    assert half["rollout_speedup"] < full["rollout_speedup"]
    # acceptance is reported over steps that drafted, as vLLM does
    assert half["mean_accepted_length"] == pytest.approx(full["mean_accepted_length"], rel=5e-3)
    assert half["draft_tokens_per_response_token"] < full["draft_tokens_per_response_token"]


def test_ngram_with_acceptance_above_two_can_lose():
    over = {"drafter": {"name": "ngram", "per_request_s": 5e-5, "step_overhead_s": 1e-3, "coverage": 0.5},
            "acceptance": {"mean_accepted_length": 2.1}}
    res = simulate(roofline_scenario(**over))
    assert res["mean_accepted_length"] > 2.0 and res["rollout_speedup"] < 1.0


# --------------------------------------------------------------------------- acceptance

def test_acceptance_decay_and_conditional_forms():
    flat = roofline_scenario(**{"acceptance": {"mean_accepted_length": 2.47, "measured_at_k": 3}})
    dec = roofline_scenario(**{"acceptance": {"mean_accepted_length": 2.47, "measured_at_k": 3, "decay": 0.9}})
    from nemo_rl_specdec.scheduling.budget import expected_accepted
    for sc in (flat, dec):
        assert float(expected_accepted(sc.acceptance_model, 3)[3]) == pytest.approx(2.47)
    assert float(expected_accepted(dec.acceptance_model, 7)[7]) < float(expected_accepted(flat.acceptance_model, 7)[7])
    cond = roofline_scenario(**{"acceptance": {"conditional": [0.58, 0.5, 0.5]}})
    assert cond.acceptance_model == pytest.approx([0.58, 0.29, 0.145])


def test_acceptance_from_a_bench_json(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"results": [
        {"name": "suffix", "accepted_per_position": [0.8, 0.61, 0.62, 0.3]},
        {"name": "none", "accepted_per_position": []}]}))
    sc = roofline_scenario(**{"acceptance": {"bench_json": str(path)}})
    assert sc.acceptance_model == [0.8, 0.61, 0.61, 0.3]          # made non-increasing
    with pytest.raises(ScenarioError, match=r"scenario\.acceptance\.bench_json: .*named 'x'"):
        roofline_scenario(**{"acceptance": {"bench_json": str(path), "bench_result": "x"}})


def test_spread_keeps_the_mean_accepted_length():
    m = acc.spread_mean(0.7, 1.0, 0.15, 3)
    alphas = acc.per_request_alphas(m, 0.15, 4000, np.random.default_rng(0))
    assert np.std(alphas) == pytest.approx(0.15, rel=0.05)
    lengths = acc.tables(alphas, 1.0, 3)[:, 3]
    assert lengths.mean() == pytest.approx(float(acc.tables(0.7, 1.0, 3)[0, 3]), rel=5e-3)


# --------------------------------------------------------------------------- async pools

def test_exposed_generation_sync_is_the_rollout_and_async_hides_it():
    over = {"rl.num_steps": 5, "rl.train": {"fixed_s": 5.0}, "rl.refit_s": 0.5}
    sync = simulate(roofline_scenario(**over))
    assert sync["exposed_generation_s_baseline"] == pytest.approx(sync["rollout_s_baseline"])
    asy = simulate(roofline_scenario(**over, **{"rl.mode": "async"}))
    assert 0 <= asy["exposed_generation_s_baseline"] < sync["exposed_generation_s_baseline"]
    blocked = simulate(roofline_scenario(**over, **{"rl.mode": "async", "rl.refit_blocks_training": True}))
    assert blocked["step_s_baseline"] > asy["step_s_baseline"]


def test_trainer_cost_is_driven_by_tokens():
    over = {"rl.train": {"flops_per_token": 6 * 8e9}, "rl.training_flops_per_s": 4e14, "rl.training_gpus": 8,
            "rl.colocated": False}
    sc = roofline_scenario(**over)
    run = simulate_rl(sc, speculative=False)
    tokens = make_batches(sc.workload, 2, sc.seed)[0].total_tokens
    assert run.step_s == pytest.approx(run.rollout_s + 6 * 8e9 * tokens / (4e14 * 8), rel=1e-6)
    longer = roofline_scenario(**over, **{"workload.lengths": {"dist": "values", "values": [600], "max_len": 600}})
    assert simulate_rl(longer, speculative=False).step_s > run.step_s


# --------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("overrides,path", [
    ({"seed": -1}, r"scenario\.seed: got -1"),
    ({"hardware": {"c_base_s": math.inf, "c_tok_s": 1e-5}}, r"scenario\.hardware\.c_base_s: got inf"),
    ({"hardware": {"c_base_s": 1e-3, "c_tok_s": math.nan}}, r"scenario\.hardware\.c_tok_s: got nan"),
    ({"hardware": {"fit_samples": [[1, 0.01], [100, 0.009], [200, 0.008]]}},
     r"scenario\.hardware\.fit_samples: .*c_tok_s = .* <= 0"),
    ({"hardware": {"fit_samples": [[10, 0.001], [20, 0.0035]]}}, r"scenario\.hardware\.fit_samples: .*c_base_s"),
    ({"acceptance": {"alpha": 0.95, "spread": 0.45}}, r"scenario\.acceptance\.spread: got 0\.45"),
    ({"acceptance": {"per_position": [0.5], "decay": 0.9}}, r"scenario\.acceptance\.decay"),
    ({"drafter": {"name": "eagle3", "coverage": 0.5}}, r"scenario\.drafter\.coverage"),
    ({"rl": {"mode": "async", "colocated": True}}, r"scenario\.rl\.colocated"),
    ({"hardware": {"max_num_seqs": 8, "roofline": {"mem_bw_Bps": 1e12, "flops_per_s": 1e14}}}, r"scenario\.model: "),
])
def test_bad_inputs_are_rejected_with_their_key_path(overrides, path):
    raw = {"hardware": {"c_base_s": 1e-3, "c_tok_s": 1e-5}, "acceptance": {"alpha": 0.6}, **overrides}
    with pytest.raises(ScenarioError, match=path):
        validate_scenario(raw)


def test_roofline_input_errors_name_their_key_path():
    with pytest.raises(ScenarioError, match=r"scenario\.hardware\.kv_capacity_tokens: .*room for one request"):
        roofline_scenario(**{"hardware.kv_capacity_tokens": 100})
    with pytest.raises(ScenarioError, match=r"scenario\.hardware\.roofline\.allreduce_bw_Bps"):
        roofline_scenario(**{"hardware.gpus_per_engine": 4})
    with pytest.raises(ScenarioError, match=r"scenario\.hardware: .*roofline or the linear"):
        roofline_scenario(**{"hardware.c_base_s": 1e-3})
    with pytest.raises(ScenarioError, match=r"scenario\.hardware\.roofline\.mem_bw_Bps: got inf"):
        roofline_scenario(**{"hardware.roofline.mem_bw_Bps": math.inf})


def test_a_nan_or_inf_result_is_an_error():
    with pytest.raises(SimulationError, match=r"result\.rollout_speedup is inf"):
        check_finite({"rollout_speedup": math.inf})
    with pytest.raises(SimulationError, match=r"result\.per_step\.x\[1\] is nan"):
        check_finite({"per_step": {"x": [1.0, math.nan]}})
    assert issubclass(SimulationError, ScenarioError)


# --------------------------------------------------------------------------- serving, CLI

def test_steady_state_serving_keeps_the_concurrency():
    raw = {"hardware": {"c_base_s": 0.01, "c_tok_s": 0.0, "max_num_seqs": 8}, "acceptance": {"alpha": 0.5},
           "speculation": {"num_speculative_tokens": 2},
           "workload": {"steady_state": True, "num_prompts": 8, "generations_per_prompt": 1, "prompt_len": 0,
                        "lengths": {"dist": "values", "values": [1000], "max_len": 1000}, "prediction": "none",
                        "history_rollouts": 0},
           "rl": {"num_steps": 3}}
    res = simulate(validate_scenario(raw))
    assert res["mode"] == "serving"
    assert res["output_tokens_per_s_baseline"] == pytest.approx(8 / 0.01, rel=1e-3)   # 8 in flight, 1 token each
    assert res["rollout_speedup"] == pytest.approx(1 + 0.5 + 0.25, rel=2e-3)          # free verification


def test_cli_all_prints_one_line_per_scenario(tmp_path, capsys):
    from nemo_rl_specdec.cli import main

    for name, k in (("a", 2), ("b", 4)):
        (tmp_path / f"{name}.yaml").write_text(
            f"name: {name}\nhardware: {{c_base_s: 0.01, c_tok_s: 1.0e-4}}\nacceptance: {{alpha: 0.6}}\n"
            f"speculation: {{num_speculative_tokens: {k}}}\nworkload: {{num_prompts: 2, generations_per_prompt: 2, "
            "lengths: {median: 100, max_len: 400}}\nrl: {num_steps: 2}\n")
    out = tmp_path / "all.json"
    assert main(["simulate", "--all", str(tmp_path), "--json", str(out)]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0].split()[:3] == ["scenario", "mode", "k"] and "step speedup" in text[0]
    assert [line.split()[0] for line in text[1:3]] == ["a", "b"]
    data = json.loads(out.read_text())
    assert set(data) == {"a", "b"} and data["b"]["k"] == 4
    assert main(["simulate", "--all", str(tmp_path / "a.yaml")]) == 2       # not a directory


def test_bundled_scenarios_are_found_from_any_directory(tmp_path, monkeypatch):
    from nemo_rl_specdec.sim.scenario import SIM_CONFIGS, ScenarioError, resolve_scenario_path, scenario_files

    monkeypatch.chdir(tmp_path)
    s3 = SIM_CONFIGS / "predictions" / "s3_nvidia_rlthink_k5.yaml"
    for name in ("predictions/s3_nvidia_rlthink_k5", "sim/predictions/s3_nvidia_rlthink_k5.yaml",
                 "configs/sim/predictions/s3_nvidia_rlthink_k5.yaml", str(s3)):
        assert resolve_scenario_path(name) == s3
    assert resolve_scenario_path("cpu_tiny") == SIM_CONFIGS / "cpu_tiny.yaml"
    assert scenario_files("configs/sim/predictions") == scenario_files("predictions") != []
    assert s3 in scenario_files("predictions")
    with pytest.raises(ScenarioError, match=r"--all 'nowhere': not a directory with \*\.yaml scenarios"):
        scenario_files("nowhere")


def test_prediction_scenarios_load():
    from nemo_rl_specdec.sim.scenario import SIM_CONFIGS

    files = sorted((SIM_CONFIGS / "predictions").glob("*.yaml"))
    assert len(files) >= 12
    for f in files:
        sc = load_scenario(str(f))
        assert sc.calibration is None and sc.calibration_points is None    # predictions carry no targets


def test_cli_prints_calibration_points(tmp_path, capsys):
    from nemo_rl_specdec.cli import main

    out = tmp_path / "c3.json"
    assert main(["simulate", "c3_gptoss120b_h100_eagle3", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "calibration point 'depth 2' (speculation.num_speculative_tokens=2):" in text and "OUT OF RANGE" not in text
    pts = json.loads(out.read_text())["calibration_points"]
    assert [p["name"] for p in pts] == ["depth 2", "depth 3", "depth 6"]
    assert json.loads(out.read_text())["exposed_generation_s_baseline"] is None    # serving: no trainer
