"""cost/price.py and cost/profile.py: traces priced by a GPU's measured cost model, deterministically,
with the draft side measured on a GPU and the history proposers' host time in the step."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from nemo_rl_specdec.config.schema import ConfigError
from nemo_rl_specdec.cost.model import ModelShape
from nemo_rl_specdec.cost.price import PricedStepCost, fit_proposer, price, speedup
from nemo_rl_specdec.cost.profile import HardwareProfile, load_profile
from nemo_rl_specdec.cost.trace import Trace, TraceError, TraceStep

REPO = Path(__file__).resolve().parents[3]


def _trace(requests: int, k: int, accepted: int, ctx: int = 1000, length: int = 60, kind: str = "list",
           proposer_s: float = 2e-4) -> Trace:
    """`requests` requests of `length` tokens each, drafting k and accepting `accepted` at every step."""
    steps = [TraceStep([], [], [], [], requests * ctx, None, requests)]
    left = {f"r{i}": length - 1 for i in range(requests)}
    c = {r: ctx for r in left}
    while left:
        rids = list(left)
        acc = [min(accepted, left[r] - 1) for r in rids]
        steps.append(TraceStep(rids, [c[r] for r in rids], [k] * len(rids), acc, 0,
                               proposer_s if kind == "list" else None))
        for r, a in zip(rids, acc, strict=True):
            c[r] += 1 + a
            left[r] -= 1 + a
            if left[r] == 0:
                del left[r]
    return Trace(kind, k, steps, {"list": "das", "model": "eagle3", "block": "dflash"}[kind], "replay")


@pytest.fixture(scope="module")
def h100():
    return load_profile("h100_qwen3_8b")


def test_the_same_trace_is_priced_the_same_every_time(h100):
    t = _trace(16, 4, 3)
    a, b = speedup(t, h100), speedup(Trace.from_dict(json.loads(json.dumps(t.to_dict()))), h100)
    assert a == b


def test_small_batches_gain_near_their_tokens_per_forward_and_large_ones_lose_long_drafts(h100):
    small = speedup(_trace(4, 4, 3), h100)
    assert 2.5 < small["speedup"] < small["spec"]["tokens_per_forward"]
    # 256 requests verifying 8 drafts each: compute-bound, so drafts that are mostly rejected cost more than they save
    large = speedup(_trace(256, 8, 1), h100)
    assert large["speedup"] < 1.0
    assert speedup(_trace(256, 2, 1), h100)["speedup"] > large["speedup"]


def test_a_model_drafters_forwards_are_priced_and_a_history_proposers_host_time(h100):
    eagle = price(_trace(64, 3, 2, kind="model"), h100)
    assert eagle.draft_s > 0 and eagle.proposer_s == 0
    das = price(_trace(64, 3, 2), h100)
    d = h100.drafter("das")
    decode = sum(1 for s in _trace(64, 3, 2).steps if s.rids)
    assert das.draft_s == 0
    assert das.proposer_s == pytest.approx(sum(d.step_overhead_s + d.per_request_s * len(s.rids)
                                               for s in _trace(64, 3, 2).steps if s.rids))
    assert decode > 0 and das.measured_proposer_s == pytest.approx(2e-4 * decode)


def test_draft_forwards_cost_a_fixed_time_per_layer_by_the_layers_width(h100):
    """On the GPU the drafts were timed on, a draft layer's fixed time is the fitted line in its width; on
    another GPU, that line scaled as the targets' fixed time per layer is."""
    h200 = load_profile("h200_qwen3_8b")
    fit = h200.draft_layers.fit
    assert fit["device"] == "NVIDIA H200" and {f["hidden_size"] for f in fit["files"]} == {1024, 4096}
    for prof in (h200, h100):
        scale = prof.layer_overhead_s / fit["target_layer_s"]
        for key, layers, width in (("eagle3", 1, 4096), ("dflash", 5, 4096), ("draft_model", 28, 1024)):
            line = fit["fixed_s"] + fit["per_width_s"] * width
            assert prof.drafter(key).fwd_base_s == pytest.approx(layers * line * scale)
    assert h200.layer_overhead_s / fit["target_layer_s"] == pytest.approx(1.0)


@pytest.mark.parametrize("key, samples", [("eagle3", "eagle3-qwen3-8b"), ("mtp", "mtp-qwen3-8b"),
                                          ("dflash", "dflash-qwen3-8b"), ("draft_model", "qwen3-0.6b")])
def test_the_profiles_draft_forwards_match_the_ones_timed_on_a_gpu(key, samples):
    """The H200 device check timed each draft shape's forward beside the target's; the H200 profile
    (roofline fitted on that target alone, drafts priced by shape and layers) predicts them."""
    prof = load_profile("h200_qwen3_8b")
    roof, d = prof.hardware.roofline_model(), prof.drafter(key)
    data = json.loads((REPO / "benchmarks/device_check/h200" / f"forward_{samples}.json").read_text())
    name = key.replace("draft_model", "qwen3_0.6b")
    bundled = json.loads((REPO / "configs/sim/measured" / f"h200_{name}_forward.json").read_text())
    assert bundled == data   # the profiles fit on the bundled copies of the device check's samples
    m = data["model"]
    shape = ModelShape(m["weight_bytes"], m["flops_per_token"], m["kv_bytes_per_token"], m["attn_flops_per_ctx"],
                       m["num_layers"], m["hidden_size"])
    rel = []
    for s in data["samples"]:
        const, (m0, _, f0, _) = roof.forward(shape, s["tokens"], s["ctx_sum"], 0.0, s["attn_ctx"], 0.0, overhead=False)
        rel.append(abs((const + max(m0, f0) + d.fwd_base_s) / s["seconds"] - 1))
    assert statistics.median(rel) < 0.2


def test_the_priced_step_cost_makes_draft_tokens_dear_at_large_batches(h100):
    sc = PricedStepCost(h100, "das", k=8)
    t1, c1 = sc.split(1, 1000)
    t256, c256 = sc.split(256, 256 * 1000)
    assert t256 > t1 > 0 and c256 > 20 * c1


def test_the_proposer_fit_recovers_planted_constants():
    traces = [Trace("list", 4, [TraceStep([f"r{i}" for i in range(n)], [5] * n, [1] * n, [0] * n, 0,
                                          3e-5 + 7e-6 * n) for n in (1, 4, 16, 64)], "das")]
    fit = fit_proposer(traces)
    assert fit["step_overhead_s"] == pytest.approx(3e-5) and fit["per_request_s"] == pytest.approx(7e-6)


def test_a_profile_that_cannot_price_a_drafter_says_which(h100, tmp_path):
    with pytest.raises(ConfigError, match=r"drafters\.medusa: not in this hardware profile"):
        h100.drafter("medusa")
    from nemo_rl_specdec.config import yaml_loader
    from nemo_rl_specdec.cost.profile import HARDWARE_CONFIGS

    raw = yaml_loader.load(HARDWARE_CONFIGS / "h100_qwen3_8b.yaml")
    raw["drafters"]["das"] = {"name": "suffix"}
    with pytest.raises(ValueError, match=r"drafters\.das\.kind: missing"):
        HardwareProfile.model_validate(raw)
    raw["drafters"]["das"] = {"name": "suffix", "kind": "list"}
    prof = HardwareProfile.model_validate(raw)
    with pytest.raises(TraceError, match="per_request_s"):
        price(_trace(4, 3, 1), prof)
    no_widths = {k: v for k, v in raw.items() if k != "draft_layers"}
    with pytest.raises(ValueError, match=r"draft_layers: missing; drafters\.eagle3's fixed time"):
        HardwareProfile.model_validate(no_widths)
    no_widths["drafters"] = {k: v for k, v in raw["drafters"].items() if k not in ("eagle3", "mtp", "dflash",
                                                                                    "draft_model")}
    HardwareProfile.model_validate(no_widths)   # history drafters alone need no draft layers
    raw["drafters"]["eagle3"] = {"name": "eagle3", "kind": "model"}
    with pytest.raises(ValueError, match=r"drafters\.eagle3\.model"):
        HardwareProfile.model_validate(raw)
    with pytest.raises(ConfigError, match="--hardware: 'a100'"):
        load_profile("a100")


def test_the_baseline_must_be_the_same_rollout(h100):
    t = _trace(4, 3, 2)
    other = _trace(4, 3, 2, length=80).without_drafts()
    with pytest.raises(TraceError, match="generated tokens"):
        speedup(t, h100, other)
    with pytest.raises(TraceError, match="kind"):
        price(_trace(4, 3, 2, kind="model"), h100, drafter="das")


def test_the_price_command_prices_a_trace_and_fits_a_proposer(tmp_path, capsys):
    from nemo_rl_specdec import cli

    path = _trace(8, 3, 2).save(tmp_path / "t.json")
    out = tmp_path / "priced.json"
    assert cli.main(["price", str(path), "--hardware", "h200_qwen3_8b", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["hardware"] == "h200_qwen3_8b" and row["speedup"] == speedup(_trace(8, 3, 2),
                                                                             load_profile("h200_qwen3_8b"))["speedup"]
    assert "priced on h200_qwen3_8b" in capsys.readouterr().out
    many = Trace("list", 3, [TraceStep([f"r{i}" for i in range(n)], [9] * n, [1] * n, [0] * n, 0, 1e-5 * n)
                             for n in (1, 2, 8, 32)], "das")
    assert cli.main(["price", str(many.save(tmp_path / "m.json")), "--fit-proposer"]) == 0
    assert "per_request_s 1e-05" in capsys.readouterr().out


def test_a_scenario_on_a_hardware_profile_prices_steps_as_the_benches_do(h100):
    """`hardware_profile:` gives a scenario the profile's target, roofline and drafter costs: the
    simulator's step is the priced step."""
    from nemo_rl_specdec.cost.model import CostModel
    from nemo_rl_specdec.sim.scenario import ScenarioError, validate_scenario

    base = {"hardware_profile": "h100_qwen3_8b", "hardware": {"max_num_seqs": 64},
            "acceptance": {"mean_accepted_length": 2.3, "measured_at_k": 3},
            "speculation": {"num_speculative_tokens": 3}}
    for entry, name in (("eagle3", "eagle3"), ("das", "suffix"), ("dflash", "dflash")):
        sc = validate_scenario({**base, "drafter": {"name": name, "profile_entry": entry}})
        sim, priced = CostModel.from_scenario(sc), h100.cost_model(entry)
        for b, d in ((1, 3.0), (64, 3.0), (256, 8.0)):
            assert sim.mean_step_time(b, d, 3000) == pytest.approx(priced.mean_step_time(b, d, 3000))
    with pytest.raises(ScenarioError, match=r"hardware\.roofline: .*null with hardware_profile"):
        validate_scenario({**base, "hardware": {"roofline": {"mem_bw_Bps": 1e12, "flops_per_s": 1e14}}})
    with pytest.raises(ScenarioError, match=r"drafter\.profile_entry: .*drafters\.medusa"):
        validate_scenario({**base, "drafter": {"name": "eagle3", "profile_entry": "medusa"}})
    with pytest.raises(ScenarioError, match=r"drafter\.name: got 'ngram'"):
        validate_scenario({**base, "drafter": {"name": "ngram", "profile_entry": "das"}})


def test_a_hybrid_trace_pays_the_model_forwards_only_where_they_ran_and_the_proposer_everywhere(h100):
    from nemo_rl_specdec.cost.price import model_forward_s

    lst = _trace(64, 3, 2)
    parts = {"history": "das", "model": "eagle3"}
    hybrid = [Trace("hybrid", 3, [TraceStep(s.rids, s.ctx, s.drafts, s.accepted, s.prefill_tokens, s.proposer_s,
                                            s.prefill_requests, forwards if s.rids and i % 2 else 0)
                                  for i, s in enumerate(lst.steps)], "hybrid", "replay", {}, parts)
              for forwards in (0, 3)]
    none, some = price(hybrid[0], h100), price(hybrid[1], h100)
    das = price(lst, h100)
    # no model forward: exactly the history drafter's price; with them: their roofline cost added
    assert none.rollout_s == pytest.approx(das.rollout_s) and none.draft_s == 0
    ran = [s for i, s in enumerate(lst.steps) if s.rids and i % 2]
    assert some.draft_s == pytest.approx(sum(model_forward_s(h100, "eagle3", 3, s.ctx) for s in ran))
    assert some.proposer_s == pytest.approx(das.proposer_s) and some.drafter == "hybrid"
    # three eagle3 forwards over a step's requests cost what the model drafter's trace charges its k=3 drafts
    eagle = _trace(64, 3, 2, kind="model")
    step = eagle.steps[1]
    one = price(Trace("model", 3, [step], "eagle3"), h100).draft_s
    assert model_forward_s(h100, "eagle3", 3, step.ctx) == pytest.approx(one)
    assert speedup(hybrid[1], h100)["speedup"] < speedup(hybrid[0], h100)["speedup"]
    with pytest.raises(TraceError, match="parts.model"):
        price(Trace("hybrid", 3, hybrid[1].steps, "hybrid", "replay", {}, {"history": "das", "model": "ngram"}), h100)
    with pytest.raises(TraceError, match="name no drafter"):
        price(hybrid[1], h100, "das")


def test_a_model_step_that_counts_its_forwards_is_priced_from_them(h100):
    """A model drafter under a rule: a step that skipped its later forwards ran one (no draft verified),
    and pays it; a step without the count pays the forwards its drafts imply."""
    from nemo_rl_specdec.cost.price import model_forward_s

    step = _trace(64, 3, 2, kind="model").steps[1]
    skipped = TraceStep(step.rids, step.ctx, [0] * len(step.rids), [0] * len(step.rids), 0, None, 0, 1)
    priced = price(Trace("model", 3, [skipped], "eagle3"), h100)
    assert priced.draft_s == pytest.approx(model_forward_s(h100, "eagle3", 1, step.ctx)) and priced.draft_s > 0
    uncounted = TraceStep(step.rids, step.ctx, [0] * len(step.rids), [0] * len(step.rids), 0, None, 0, 0)
    assert price(Trace("model", 3, [uncounted], "eagle3"), h100).draft_s == 0


def test_the_verdict_is_given_at_two_host_speeds_and_the_proposer_shares_are_the_profiles(h100):
    from nemo_rl_specdec.bench.das import _priced
    from nemo_rl_specdec.cost.price import HOST_SPEEDS, proposer_share

    t = _trace(64, 4, 3)
    r = speedup(t, h100)
    one, two = r["by_host_speed"]
    assert (one["host_speed"], two["host_speed"]) == HOST_SPEEDS == (1.0, 2.0) and r["host"] == h100.host != ""
    assert one["speedup"] == r["speedup"] and two["proposer_s"] == pytest.approx(one["proposer_s"] / 2)
    assert two["speedup"] > one["speedup"]   # only the host term moves
    # the shares come from the profile's constants: the measured thread times do not move them
    slow = _trace(64, 4, 3, proposer_s=5e-3)
    assert [(b["share_of_step"], b["share_of_step_2x"]) for b in proposer_share([t], h100)] == \
        [(b["share_of_step"], b["share_of_step_2x"]) for b in proposer_share([slow], h100)]
    assert all(b["share_of_step_2x"] < b["share_of_step"] for b in proposer_share([t], h100))
    priced = _priced({"replay": [{"trace": t}]}, h100)
    assert [b["speedup"] for b in priced["priced_by_host_speed"]] == pytest.approx([one["speedup"], two["speedup"]])


def test_a_verdict_prices_the_host_term_from_the_proposer_time_measured_in_the_trace(h100):
    """`host="measured"`: every decode step's host term is the trace's own proposer time (over the host
    speed), the other terms unchanged; the profile's constants give the other figure, and how far they
    are from the measurement is reported with a fit on the same steps."""
    from nemo_rl_specdec.cost.price import proposer_gap, step_costs

    slow, fast = _trace(8, 4, 3, proposer_s=9e-4), _trace(8, 4, 3, proposer_s=1e-4)
    for t in (slow, fast):
        decode = [s for s in t.steps if s.rids]
        for h in (1.0, 2.0):
            p = price(t, h100, host_speed=h, host="measured")
            assert p.proposer_s == pytest.approx(sum(s.proposer_s for s in decode) / h) and p.host_term == "measured"
        assert [c.target_s for c in step_costs(t, h100, host="measured")] == [c.target_s for c in step_costs(t, h100)]
    # the constants price both alike; the measurement tells them apart
    assert price(slow, h100).rollout_s == price(fast, h100).rollout_s
    assert price(slow, h100, host="measured").rollout_s > price(fast, h100, host="measured").rollout_s
    r = speedup(slow, h100)
    m1, m2 = r["measured_by_host_speed"]
    assert m1["proposer_s"] == pytest.approx(2 * m2["proposer_s"]) and m1["speedup"] < m2["speedup"]
    assert m1["rollout_s"] != r["by_host_speed"][0]["rollout_s"]
    gap = proposer_gap([slow], h100, "das")
    assert gap["measured_proposer_s"] == pytest.approx(price(slow, h100, host="measured").proposer_s)
    assert gap["profile_proposer_s"] == pytest.approx(price(slow, h100).proposer_s)
    assert gap["profile_over_measured"] == pytest.approx(gap["profile_proposer_s"] / gap["measured_proposer_s"])
    assert gap["fit"] is None   # every decode step ran the same 8 requests: no two constants fit on them
    mixed = Trace("list", 4, [TraceStep(list(range(n)), [10] * n, [2] * n, [1] * n, 0, 1e-5 + 2e-5 * n)
                              for n in (1, 2, 4, 8)], "das")
    fit = proposer_gap([mixed], h100, "das")["fit"]
    assert (fit["step_overhead_s"], fit["per_request_s"]) == pytest.approx((1e-5, 2e-5), rel=1e-6)
    with pytest.raises(TraceError, match="host: 'wall'"):
        price(slow, h100, host="wall")
    # a model drafter's trace has no host term to measure: both ways price it alike
    model = _trace(8, 3, 2, kind="model")
    assert price(model, h100, host="measured").rollout_s == price(model, h100).rollout_s
