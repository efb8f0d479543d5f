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
