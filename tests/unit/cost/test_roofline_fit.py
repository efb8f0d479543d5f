"""The roofline fitted on measured forwards: the fit recovers planted
constants, refuses samples that cannot separate them, and a scenario takes its constants from a
samples file (`hardware.roofline.measured`) with errors that name the key."""
from __future__ import annotations

import json

import numpy as np
import pytest

from nemo_rl_specdec.config.schema import ConfigError
from nemo_rl_specdec.cost.fit import ROOFLINE_FITTED, fit_roofline, roofline_from_file
from nemo_rl_specdec.cost.model import ModelShape, Roofline, vllm_capture_sizes
from nemo_rl_specdec.resources import config_path
from nemo_rl_specdec.sim.scenario import load_scenario

SHAPE = ModelShape(1.5e10, 1.5e10, 147456, 589824)
PLANTED = {"mem_bw_Bps": 2.8e12, "flops_per_s": 4.5e14, "overhead_s": 4e-3, "eager_overhead_s": 2e-3,
           "overhead_per_seq_s": 3e-5}
SIZES = vllm_capture_sizes(512)


def _samples(noise: float = 0.0, seed: int = 0) -> list:
    """Steps over the time_forward grid's span, timed by the planted roofline (x lognormal noise)."""
    r = Roofline(PLANTED["mem_bw_Bps"], PLANTED["flops_per_s"], PLANTED["overhead_s"], capture_sizes=SIZES,
                 eager_overhead_s=PLANTED["eager_overhead_s"])
    rng = np.random.default_rng(seed)
    out = []
    for ctx in (1024, 4096, 16384):
        for b in (1, 4, 16, 64):
            for n in (1, 4, 16, 64):
                attn = b * n * (ctx + n)
                const, (m0, _, f0, _) = r.forward(SHAPE, b * n, b * ctx, 0.0, attn, 0.0)
                t = (const + PLANTED["overhead_per_seq_s"] * b + max(m0, f0)) * float(np.exp(rng.normal(0, noise)))
                out.append({"requests": b, "tokens": b * n, "ctx_sum": b * ctx, "attn_ctx": attn, "seconds": t})
    return out


def test_fit_recovers_planted_constants():
    fit = fit_roofline(_samples(), SHAPE, SIZES)
    for key in ROOFLINE_FITTED:
        assert fit[key] == pytest.approx(PLANTED[key], rel=1e-3), key
    assert fit["max_rel_residual"] < 1e-6


def test_fit_on_noisy_samples_is_close_and_reports_its_residuals():
    fit = fit_roofline(_samples(noise=0.03), SHAPE, SIZES)
    assert fit["mem_bw_Bps"] == pytest.approx(PLANTED["mem_bw_Bps"], rel=0.05)
    assert fit["flops_per_s"] == pytest.approx(PLANTED["flops_per_s"], rel=0.05)
    assert 0.01 < fit["median_rel_residual"] < 0.05


def test_fit_refuses_samples_that_cannot_separate_the_constants():
    graph_only = [s for s in _samples() if s["tokens"] <= 512]
    with pytest.raises(ValueError, match="both sides of the largest capture size"):
        fit_roofline(graph_only, SHAPE, SIZES)
    with pytest.raises(ValueError, match="at least"):
        fit_roofline(_samples()[:3], SHAPE, SIZES)


def test_shipped_h100_samples_fit_within_the_data_sheet():
    fit = roofline_from_file(str(config_path("sim", "measured", "h100_qwen3_8b_forward.json")))
    assert "H100" in fit["device"] and fit["samples"] >= 100
    assert fit["mem_bw_Bps"] < 3.35e12 and fit["flops_per_s"] < 989e12   # H100 SXM: 3.35 TB/s, 989 TFLOP/s dense bf16
    assert fit["median_rel_residual"] < 0.10


def _measured_scenario(tmp_path, samples_path, extra=""):
    p = tmp_path / "s.yaml"
    p.write_text(f"""extends: {config_path('sim', 'predictions', 's7_qwen3_8b_dapo_h100_eagle3.yaml')}
name: measured_test
hardware:
  roofline:
    measured: {samples_path}
{extra}""")
    return p


def test_scenario_takes_its_roofline_from_a_samples_file(tmp_path):
    path = tmp_path / "samples.json"
    path.write_text(json.dumps({"model": {"weight_bytes": SHAPE.weight_bytes, "flops_per_token": SHAPE.flops_per_token,
                                          "kv_bytes_per_token": SHAPE.kv_bytes_per_token,
                                          "attn_flops_per_ctx": SHAPE.attn_flops_per_ctx},
                                "graph_max": 512, "device": "planted", "samples": _samples()}))
    sc = load_scenario(str(_measured_scenario(tmp_path, path)))
    r = sc.hardware.roofline
    for key in ROOFLINE_FITTED:
        assert getattr(r, key) == pytest.approx(PLANTED[key], rel=1e-3)
    assert r.fit["device"] == "planted"


def test_measured_roofline_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"hardware\.roofline\.measured.*samples JSON"):
        load_scenario(str(_measured_scenario(tmp_path, tmp_path / "missing.json")))
    shipped = "measured/h100_qwen3_8b_forward.json"
    with pytest.raises(ConfigError, match=r"hardware\.roofline\.flops_per_s.*null with roofline\.measured"):
        load_scenario(str(_measured_scenario(tmp_path, shipped, "    flops_per_s: 1.0e15\n")))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model": {}, "graph_max": 512, "samples": []}))
    with pytest.raises(ConfigError, match=r"hardware\.roofline\.measured.*fitted"):
        load_scenario(str(_measured_scenario(tmp_path, bad)))


def test_shipped_h100_fit_predicts_held_out_contexts():
    """Fitted on three of the five measured contexts, the roofline predicts the other two."""
    data = json.loads(config_path("sim", "measured", "h100_qwen3_8b_forward.json").read_text())
    m = data["model"]
    shape = ModelShape(m["weight_bytes"], m["flops_per_token"], m["kv_bytes_per_token"], m["attn_flops_per_ctx"])
    train = [s for s in data["samples"] if s["ctx"] in (1024, 4096, 16384)]
    held = [s for s in data["samples"] if s["ctx"] in (2048, 8192)]
    fit = fit_roofline(train, shape, SIZES)
    r = Roofline(fit["mem_bw_Bps"], fit["flops_per_s"], fit["overhead_s"], capture_sizes=SIZES,
                 eager_overhead_s=fit["eager_overhead_s"], overhead_per_seq_s=fit["overhead_per_seq_s"])
    err = []
    for s in held:
        const, (m0, _, f0, _) = r.forward(shape, s["tokens"], s["ctx_sum"], 0.0, s["attn_ctx"], 0.0)
        err.append(abs((const + r.overhead_per_seq_s * s["requests"] + max(m0, f0)) / s["seconds"] - 1.0))
    assert len(held) >= 40 and float(np.median(err)) < 0.10
