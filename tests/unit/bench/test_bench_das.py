"""`bench --suite das`: the configurations it measures, without engines."""
from nemo_rl_specdec.bench import das
from nemo_rl_specdec.config import load_run_config
from nemo_rl_specdec.resources import config_path


def test_das_rows_run_auto_disable_and_the_off_baseline_verifies_every_draft():
    cfg = load_run_config(config_path("tiny_cpu.yaml"))
    confs = {c["name"]: c for c in das.configurations(cfg, das._options(cfg))}
    main = f"das_w{cfg.spec.suffix.window_steps}_{cfg.spec.suffix.scope}"
    assert confs[main]["cfg"].spec.auto_disable is True
    off = confs["das_auto_disable_off"]
    assert off["cfg"].spec.auto_disable is False and off["cfg"].spec.suffix.backend == "das"
    assert (off["window_steps"], off["scope"]) == (cfg.spec.suffix.window_steps, cfg.spec.suffix.scope)
    # the run file's DAS in every other respect
    assert off["cfg"].spec.model_dump(exclude={"auto_disable"}) == confs[main]["cfg"].spec.model_dump(exclude={"auto_disable"})
    assert confs["vllm_suffix"]["cfg"].spec.auto_disable is False  # vLLM runs that proposer: nothing judges its steps


def test_das_adaptive_row_changes_only_the_budget():
    cfg = load_run_config(config_path("smollm2_cpu.yaml"), ["bench.das.steps=5"])
    confs = {c["name"]: c for c in das.configurations(cfg, das._options(cfg))}
    main = confs[f"das_w{cfg.spec.suffix.window_steps}_{cfg.spec.suffix.scope}"]["cfg"].spec
    ad = confs["das_adaptive"]["cfg"].spec
    assert ad.scheduling.budget == "adaptive" and ad.auto_disable is True
    assert ad.scheduling.placement == cfg.spec.scheduling.placement == "length_aware"  # the run file's block, merged
    assert ad.model_dump(exclude={"scheduling": {"budget"}}) == main.model_dump(exclude={"scheduling": {"budget"}})


def _step(step, gen, base_gen, spec_s, base_s):
    return {"step": step, "generated_tokens": gen, "baseline_generated_tokens": base_gen, "accepted_tokens": 0,
            "draft_tokens": 0, "spec_s": spec_s, "baseline_s": base_s, "spec_cpu_s": spec_s, "baseline_cpu_s": base_s,
            "propose_s": 0.0, "propose_cpu_s": 0.0}


def test_throughput_ratio_leaves_out_the_sampled_length():
    c = {"name": "x", "drafter": "suffix", "backend": "vllm", "window_steps": None, "scope": None, "k": 4}
    # step 0: the spec engine sampled twice the tokens in twice the time (same speed); step 3: 1.5x faster
    rows = [_step(0, 200, 100, 2.0, 1.0), _step(3, 150, 100, 1.0, 1.0)]
    out = das._summarize(c, rows)
    assert out["wall_clock_ratio"] == 2.0 / 3.0  # the wall clock counts the longer samples against speculation
    assert out["throughput_ratio"] == (350 / 3.0) / (200 / 2.0)
    assert out["throughput_ratio_after_3"] == 1.5 and out["wall_clock_ratio_after_3"] == 1.0
