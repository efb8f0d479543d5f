"""`bench --suite das`: the configurations it measures, without engines."""
from nemo_rl_specdec.bench import das
from nemo_rl_specdec.config.run import load_run_config
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
    assert (off["cfg"].spec.model_dump(exclude={"auto_disable"})
            == confs[main]["cfg"].spec.model_dump(exclude={"auto_disable"}))
    assert confs["vllm_suffix"]["cfg"].spec.auto_disable is False  # vLLM runs that proposer: nothing judges its steps


def test_the_other_per_step_rule_row_changes_only_the_budget():
    """The run file's DAS beside the rule it does not use: tiny_cpu sets budget: uniform, SmolLM2's
    leaves it unset (adaptive); the row keeps the run file's scheduling block otherwise."""
    for name, main_budget, other, other_budget in (("tiny_cpu.yaml", "uniform", "das_adaptive", "adaptive"),
                                                   ("smollm2_cpu.yaml", "adaptive", "das_uniform", "uniform")):
        cfg = load_run_config(config_path(name), ["bench.das.steps=5"])
        opts = das._options(cfg)
        assert other in opts["baselines"]
        assert {"das_adaptive", "das_uniform"} - {other} & set(opts["baselines"]) == set()
        confs = {c["name"]: c for c in das.configurations(cfg, opts)}
        main = confs[f"das_w{cfg.spec.suffix.window_steps}_{cfg.spec.suffix.scope}"]["cfg"].spec
        row = confs[other]["cfg"].spec
        assert (main.scheduling.budget, row.scheduling.budget) == (main_budget, other_budget)
        assert row.auto_disable is True
        assert row.scheduling.placement == cfg.spec.scheduling.placement == "length_aware"
        assert row.model_dump(exclude={"scheduling": {"budget"}}) == main.model_dump(exclude={"scheduling": {"budget"}})
        off = confs["das_auto_disable_off"]["cfg"].spec  # every draft verified: no per-step rule at all
        assert off.auto_disable is False and off.scheduling.budget == "uniform"


def _step(step, gen, base_gen, spec_s, base_s):
    return {"step": step, "generated_tokens": gen, "baseline_generated_tokens": base_gen, "accepted_tokens": 0,
            "draft_tokens": 0, "spec_s": spec_s, "baseline_s": base_s, "spec_cpu_s": spec_s, "baseline_cpu_s": base_s,
            "propose_s": 0.0, "propose_cpu_s": 0.0}


def test_throughput_ratio_leaves_out_the_sampled_length():
    c = {"name": "x", "drafter": "suffix", "backend": "vllm", "window_steps": None, "scope": None, "k": 4}
    # step 0: the spec engine sampled twice the tokens in twice the time (same speed); step 3: 1.5x faster
    rows = [_step(0, 200, 100, 2.0, 1.0), _step(3, 150, 100, 1.0, 1.0)]
    out = das._summarize(c, rows, None)  # no replay: nothing to price
    assert out["wall_clock_ratio"] == 2.0 / 3.0  # the wall clock counts the longer samples against speculation
    assert out["throughput_ratio"] == (350 / 3.0) / (200 / 2.0)
    assert out["throughput_ratio_after_3"] == 1.5 and out["wall_clock_ratio_after_3"] == 1.0


def test_a_run_file_that_verifies_every_draft_still_gets_both_rules():
    """auto_disable: false in the run file (budget uniform, no per-step rule): the das_adaptive row
    turns the rule on rather than failing validation (adaptive refuses auto_disable: false)."""
    cfg = load_run_config(config_path("tiny_cpu.yaml"), ["policy.generation.speculative_decoding.auto_disable=false"])
    confs = {c["name"]: c for c in das.configurations(cfg, {**das._options(cfg), "baselines": ["das_adaptive",
                                                                                           "das_uniform"]})}
    assert confs["das_adaptive"]["cfg"].spec.auto_disable is True
    assert confs["das_uniform"]["cfg"].spec.auto_disable is True
    assert confs["das_uniform"]["cfg"].spec.scheduling.budget == "uniform"
