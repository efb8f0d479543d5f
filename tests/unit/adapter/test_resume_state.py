"""What NeMo-RL's checkpoint carries of the drafter, without NeMo-RL: the DAS window, calibration and
per-step rule, an online drafter's weights and optimizer (draft model; Eagle3 with a draft
vocabulary), the files they are saved in, and every refusal of a state a run cannot restore."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from fakes import STAND_INS, gen_cfg

from nemo_rl_specdec.adapter import api, checkpoint, translate
from nemo_rl_specdec.config.run import ConfigError
from nemo_rl_specdec.drafter_state import digest, from_bytes, to_bytes
from nemo_rl_specdec.drafters.eagle3 import Eagle3Distiller
from nemo_rl_specdec.drafters.machinery.calibration import AcceptanceCalibration
from nemo_rl_specdec.drafters.machinery.step_judge import StepJudge
from nemo_rl_specdec.drafters.machinery.store import RolloutStore, StoreInputError
from nemo_rl_specdec.resources import asset_path

DAS = {"drafter": "suffix", "suffix": {"backend": "das"}}
EAGLE = {"drafter": "eagle3", "eagle3": {"model": str(asset_path("tiny", "eagle3"))}}


def _spec(block):
    return translate.enabled_spec(gen_cfg(**block))


def _fill(store: RolloutStore, steps: int = 6, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for v in range(1, steps + 1):
        rollouts = [{"problem_id": f"p{i % 3}", "prompt_token_ids": rng.integers(3, 50, 5).tolist(),
                     "token_ids": rng.integers(3, 50, int(rng.integers(4, 30))).tolist(), "policy_version": v - 1}
                    for i in range(8)]
        store.rebuild(rollouts, v)


def _content(store: RolloutStore) -> list:
    return sorted((e.problem_id, e.version, tuple(e.tokens.tolist())) for e in store.entries())


def test_the_das_window_restores_to_the_same_content_and_the_same_drafts():
    a = RolloutStore(window_steps=3, scope="both", max_tree_depth=24)
    _fill(a)
    saved = from_bytes(to_bytes(a.export()))  # as it travels: an RPC, then a file
    b = RolloutStore(window_steps=3, scope="both", max_tree_depth=24)
    assert b.restore(saved) == len(a) > 0
    assert _content(b) == _content(a) and b.newest_version == a.newest_version
    for e in a.entries():
        ctx = e.tokens[: len(e.tokens) // 2]
        da, db = a.speculate(ctx, e.problem_id, 8), b.speculate(ctx, e.problem_id, 8)
        assert (list(da.token_ids), da.source, da.match_len) == (list(db.token_ids), db.source, db.match_len)
    # the next update slides both windows alike
    more = [{"problem_id": "p0", "prompt_token_ids": [5, 6], "token_ids": [7, 8, 9], "policy_version": 6}]
    a.rebuild(more, 7)
    b.rebuild(more, 7)
    assert _content(b) == _content(a)


def test_a_window_of_another_tree_depth_or_inconsistent_is_refused_and_nothing_changes():
    a = RolloutStore(window_steps=3, max_tree_depth=24)
    _fill(a)
    b = RolloutStore(window_steps=3, max_tree_depth=16)
    _fill(b, steps=2, seed=1)
    before = _content(b)
    with pytest.raises(StoreInputError, match="max_tree_depth 24, this store's is 16"):
        b.restore(a.export())
    bad = {**RolloutStore(window_steps=3, max_tree_depth=16).export(), "lengths": [3]}
    with pytest.raises(StoreInputError, match="inconsistent"):
        b.restore(bad)
    assert _content(b) == before


def test_calibration_and_the_per_step_rule_restore_exactly():
    cal = AcceptanceCalibration(flush_every=4)
    rng = np.random.default_rng(0)
    for _ in range(50):
        cal.record(int(rng.integers(0, 2)), rng.random(int(rng.integers(1, 6))).tolist(), int(rng.integers(0, 4)))
    other = AcceptanceCalibration(flush_every=4)
    other.load_state_dict(from_bytes(to_bytes(cal.state_dict())))
    assert other.rates == cal.rates and other.observed_drafts == cal.observed_drafts
    assert cal._pending  # feedback not yet folded travels as it is, and is folded at the same draft
    cal.flush()
    other.flush()
    assert other.rates == cal.rates
    judge = StepJudge("DAS", {}, adaptive=True, auto_disable=True)
    for i in range(80):
        judge.fit.add(4 + i % 5, 4 + i % 5 + (i * 7) % 11, 100 * (i % 5 + 1), 1e-3 * (1 + i % 5 + 0.1 * ((i * 7) % 11)))
    assert judge.fit.coef is not None
    again = StepJudge("DAS", {}, adaptive=True, auto_disable=True)
    again.load_state_dict(from_bytes(to_bytes(judge.state_dict())))
    assert np.array_equal(again.fit.coef, judge.fit.coef)
    assert again.fit.split(8, 800) == judge.fit.split(8, 800)


def _teacher():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_pretrained(str(asset_path("tiny", "policy")), dtype=torch.float32)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return m.eval()


def _rollouts(vocab: int, n: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [{"prompt_token_ids": torch.randint(3, vocab, (6,), generator=g).tolist(),
             "token_ids": torch.randint(3, vocab, (20,), generator=g).tolist()} for _ in range(n)]


@pytest.mark.parametrize("draft_vocab", [None, 64])
def test_an_online_eagle3_head_restores_bit_identical_and_trains_on_as_the_uninterrupted_one(draft_vocab):
    """Weights, d2t/t2d and AdamW state come back bit-identical; the next step from the restored trainer
    gives the same weights as the next step of the one that never stopped."""
    torch.set_num_threads(1)
    teacher = _teacher()
    vocab = teacher.config.vocab_size
    make = lambda: Eagle3Distiller(asset_path("tiny", "eagle3"), draft_vocab_size=draft_vocab, epochs=1)  # noqa: E731
    a = make()
    a.step(teacher, _rollouts(vocab, seed=1))
    saved = from_bytes(to_bytes(a.checkpoint_state()))
    b = make()
    b.load_checkpoint_state(saved)
    for k, v in a.module.state_dict().items():
        assert torch.equal(b.module.state_dict()[k], v), k
    sa, sb = a.opt.state_dict(), b.opt.state_dict()
    for i, st in sa["state"].items():
        assert all(torch.equal(st[k], sb["state"][i][k]) for k in st if torch.is_tensor(st[k])), i
    assert b.steps == a.steps == 1 and (draft_vocab is None) == (b.module.draft_ids() is None)
    assert digest(b.opt.state_dict()) == digest(a.opt.state_dict()) == digest(saved["optimizer"])
    nxt = _rollouts(vocab, seed=2)
    a.step(teacher, nxt)
    b.step(teacher, nxt)
    for k, v in a.module.state_dict().items():
        assert torch.equal(b.module.state_dict()[k], v), k


def test_a_head_state_of_another_draft_vocabulary_or_kind_is_refused():
    from nemo_rl_specdec.train.distill import DistillInputError

    teacher = _teacher()
    a = Eagle3Distiller(asset_path("tiny", "eagle3"), draft_vocab_size=64, epochs=1)
    a.step(teacher, _rollouts(teacher.config.vocab_size))
    with pytest.raises(DistillInputError, match="drafts from 64 tokens; this run asks for 32"):
        Eagle3Distiller(asset_path("tiny", "eagle3"), draft_vocab_size=32).load_checkpoint_state(a.checkpoint_state())
    with pytest.raises(DistillInputError, match="is a draft_model over"):
        Eagle3Distiller(asset_path("tiny", "eagle3")).load_checkpoint_state({**a.checkpoint_state(),
                                                                             "kind": "draft_model"})


# ---------------------------------------------------------------------- the checkpoint's files
class _Generation:
    """The engines' side of a save, as our VllmGeneration answers it (one engine, a DAS window)."""

    def __init__(self, store: RolloutStore):
        self.store = store

    def specdec_export_state(self):
        proposer = {"depth": self.store.max_tree_depth, "store": self.store.export()}
        return {"engines": [{"version": 6, "pending": None,
                             "worker": {"state": {"policy_version": 6, "drafter_version": 6}, "proposer": proposer}}],
                "planner": {"predictor": {}, "acceptance": 0.5}}


def _ckpt(tmp_path, block=DAS, step=2):
    """A checkpoint NeMo-RL's CheckpointManager finalised with our hook (a session with a live generation)."""
    store = RolloutStore(window_steps=3, max_tree_depth=24)
    _fill(store)
    session = checkpoint.Session(_spec(block))
    generation = _Generation(store)
    session.attach_generation(generation)
    manager_cls = STAND_INS[api.CHECKPOINT_MANAGER]
    manager = manager_cls({"checkpoint_dir": str(tmp_path / "ckpt")})
    path = checkpoint.wrap_init_tmp_checkpoint(manager_cls.init_tmp_checkpoint, session)(manager, step, {})
    manager.finalize_checkpoint(path)
    return tmp_path / "ckpt" / f"step_{step}", store, session


def _run(tmp_path) -> dict:
    return {"checkpointing": {"checkpoint_dir": str(tmp_path / "ckpt")}}


def test_a_saved_checkpoint_restores_what_was_saved(tmp_path):
    step, store, session = _ckpt(tmp_path)
    assert json.loads((step / checkpoint.MARKER).read_text())["state"] == checkpoint.STATE_DIR
    assert checkpoint.check_resume(_run(tmp_path), _spec(DAS)) == step
    resumed = checkpoint.Session(_spec(DAS), step)
    (engine,) = resumed.engines_state()["engines"]
    b = RolloutStore(window_steps=3, max_tree_depth=24)
    b.restore(engine["worker"]["proposer"]["store"])
    assert _content(b) == _content(store) and engine["version"] == 6
    assert session.saves[0]["bytes"] > 0 and not list(step.glob(".speculative_decoding.tmp-*"))


def test_a_save_without_a_running_generation_fails_loudly(tmp_path):
    session = checkpoint.Session(_spec(DAS))
    with pytest.raises(RuntimeError, match="no VllmGeneration of nemo-rl-specdec is running"):
        session.save(tmp_path)
    assert not (tmp_path / checkpoint.MARKER).exists()


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "manifest"])
def test_a_truncated_or_corrupt_state_is_refused_naming_the_checkpoint_and_left_as_it_is(tmp_path, damage):
    step, _, _ = _ckpt(tmp_path)
    f = step / checkpoint.STATE_DIR / checkpoint.ENGINES
    if damage == "truncate":
        f.write_bytes(f.read_bytes()[:-100])
    elif damage == "flip":
        raw = bytearray(f.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        f.write_bytes(bytes(raw))
    elif damage == "delete":
        f.unlink()
    else:
        (step / checkpoint.STATE_DIR / checkpoint.MANIFEST).write_text("{half")
    before = {p: p.read_bytes() for p in step.rglob("*") if p.is_file()}
    want = {"truncate": "truncated or grown", "flip": "corrupt: its SHA-256", "delete": "is missing engines.pt",
            "manifest": "unreadable state.json"}[damage]
    with pytest.raises(ConfigError, match=want) as e:
        checkpoint.check_resume(_run(tmp_path), _spec(DAS))
    assert str(step / checkpoint.STATE_DIR) in str(e.value) and "resume: fresh" in str(e.value)
    assert {p: p.read_bytes() for p in step.rglob("*") if p.is_file()} == before
    spec = _spec({**DAS, "resume": "fresh"})
    assert checkpoint.check_resume(_run(tmp_path), spec) == step  # fresh on purpose: the policy resumes
    assert checkpoint.Session(spec, step).engines_state() is None


def test_a_state_for_another_tree_depth_vocabulary_or_drafter_is_refused(tmp_path):
    step, _, _ = _ckpt(tmp_path)
    with pytest.raises(ConfigError, match=r"saved with max_tree_depth 64; this run has .*suffix\.max_tree_depth 32"):
        checkpoint.check_resume(_run(tmp_path), _spec({"drafter": "suffix",
                                                       "suffix": {"backend": "das", "max_tree_depth": 32}}))
    manifest = step / checkpoint.STATE_DIR / checkpoint.MANIFEST
    m = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**m, "vocab_size": 7}))
    run = {**_run(tmp_path), "policy": {"model_name": str(asset_path("tiny", "policy"))}}
    with pytest.raises(ConfigError, match=r"saved with vocab_size 7; this run has the policy's vocabulary size"):
        checkpoint.check_resume(run, _spec(DAS))
    manifest.write_text(json.dumps({**m, "identity": {"drafter": "ngram"}}))
    with pytest.raises(ConfigError, match=r"was saved for drafter='ngram'; this run asks for drafter='suffix'"):
        checkpoint.check_resume(_run(tmp_path), _spec(DAS))


def test_a_checkpoint_of_an_older_package_is_refused_unless_the_drafter_starts_fresh(tmp_path):
    step, _, _ = _ckpt(tmp_path)
    marker = step / checkpoint.MARKER
    old = {k: v for k, v in json.loads(marker.read_text()).items() if k != "state"}
    marker.write_text(json.dumps({**old, "version": 1}))
    with pytest.raises(ConfigError, match=r"written by an older nemo-rl-specdec \(marker version 1\).*resume: fresh"):
        checkpoint.check_resume(_run(tmp_path), _spec(DAS))
    assert checkpoint.check_resume(_run(tmp_path), _spec({**DAS, "resume": "fresh"})) == step
    marker.write_text(json.dumps({**old, "version": 3}))
    with pytest.raises(ConfigError, match=r"readable: versions \[1, 2\]"):
        checkpoint.check_resume(_run(tmp_path), _spec(DAS))


def test_resume_is_validated_by_key_path():
    with pytest.raises(ConfigError, match=r"speculative_decoding\.resume: got 'fersh'"):
        _spec({**DAS, "resume": "fersh"})


def test_the_drivers_planner_restores_its_predictions_and_acceptance():
    from nemo_rl_specdec.scheduling.planner import Planner
    from nemo_rl_specdec.scheduling.predictor import LengthPredictor

    a = Planner(LengthPredictor(), budget="das", k=8)
    a.observe(["p0", "p1", "p0"], [120.0, 40.0, 90.0])
    a.acceptance = 0.62
    b = Planner(LengthPredictor(), budget="das", k=8)
    b.load_state_dict(from_bytes(to_bytes(a.state_dict())))
    assert b.predict(["p0", "p1", "p2"]) == a.predict(["p0", "p1", "p2"]) and b.acceptance == 0.62


def test_a_state_of_the_previous_layout_reads_except_a_hybrids_whose_engine_state_changed(tmp_path):
    """State version 2 saves a hybrid engine's history half as its own state (version 1 nested it): a
    version-1 state still resumes a drafter of one part, and a hybrid's is refused before any engine."""
    hybrid = {"drafter": "hybrid", "eagle3": {"model": str(asset_path("tiny", "eagle3"))},
              "refresh": {"mode": "frozen"}}
    for block, readable in ((DAS, True), (hybrid, False)):
        step, _, _ = _ckpt(tmp_path / block["drafter"], block=block)
        run = {"checkpointing": {"checkpoint_dir": str(tmp_path / block["drafter"] / "ckpt")}}
        manifest = step / checkpoint.STATE_DIR / checkpoint.MANIFEST
        m = json.loads(manifest.read_text())
        assert m["version"] == checkpoint.STATE_VERSION == 2
        manifest.write_text(json.dumps({**m, "version": 1}))
        if readable:
            assert checkpoint.check_resume(run, _spec(block)) == step
        else:
            with pytest.raises(ConfigError, match=r"older nemo-rl-specdec \(state version 1\).*resume: fresh"):
                checkpoint.check_resume(run, _spec(block))
