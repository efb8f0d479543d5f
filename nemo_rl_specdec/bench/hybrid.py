"""Bench suite `hybrid`: history drafts (DAS), a co-trained model drafter (Eagle3), and the hybrid
that takes, per request and step, the draft with more expected committed tokens per priced second
(`drafters/machinery/hybrid_choice.py`), replayed on one recorded text and priced on a GPU.

    nemo-rl-specdec bench configs/tiny_cpu.yaml --suite hybrid --json runs/bench/hybrid_tiny.json
    nemo-rl-specdec bench configs/smollm2_cpu.yaml --suite hybrid --json runs/bench/hybrid_smollm2.json

1. The text: `bench.hybrid.steps` GRPO steps of the run file's policy and task on a no-spec engine
   (`bench/das.py`'s phase 1): a fixed pool of problems revisited every step, the policy updated
   after each.
2. Model drafts, teacher-forced: one forward of the policy version that generated each rollout
   gives the hidden states vLLM's eagle3 proposer would read at every position, and the head's
   greedy k-token draft at every position (`eagle3.greedy_drafts`) is what it would propose there.
   The head refreshes in lockstep with the policy (`refresh.mode: online`): step t drafts with the
   head distilled (the drafter's `refresh.distill` settings) on the rollouts of steps < t towards
   the policy that followed each. Its start: the run file's `eagle3.model` (the bundled tiny head),
   else a head built for the policy by `nemo_rl_specdec/tools/train_eagle3.py` on rollouts of other problems,
   cached under the cache directory (the command is printed).
3. Replays (`bench/replay.py`), every draft verified against the recorded tokens, each request
   advancing by what its verified draft commits:
   - ``das``: history only, DAS with its per-step rule (`scheduling.budget: adaptive`) deciding on
     the profile's step cost and refreshed with each step's rollouts; ``das_all``: the same DAS
     with every draft verified (its coverage and acceptance by position are what the simulator's
     hybrid reads for the history half);
   - ``eagle3``: model only, its `model_k` drafts verified at every step (vLLM's eagle3 at
     k = model_k; default 3, the depth Eagle3 heads are trained for and run at in NeMo-RL's
     published setups, and at most the run file's k);
   - ``eagle3_rule``: model only with the per-step rule: the engine's `HybridProposer` (below)
     with its history half drafting nothing (no store, no in-flight sharing, no per-request tree),
     so the rule decides on the model drafts alone;
   - ``hybrid``: the engine's own proposer, `drafters/hybrid.py` `HybridProposer`, driven by the
     replay runner (`bench/replay.py` `BesideReplay`) as the engine's worker drives it, with the
     Eagle3 drafts read from the teacher-forced table where vLLM's eagle3 proposer would run: DAS's
     drafts with their calibrated acceptance, the model half's acceptance by position measured on
     the model drafts verified, and `hybrid_choice.choose` on the profile's costs
     (`cost/price.py` `PricedHybridCost`: t0 and c_tok with DAS's proposer and the model half's
     first forward, and the `model_k` - 1 forwards a step may skip). As in the engine, a step that
     skips the model half still runs its first forward (it writes the head's KV and hidden states
     of the verified tokens, which later drafts attend to): the trace charges 1 model forward on
     such a step, `model_k` on a step that runs it, and DAS's proposer on every step;
   - ``hybrid_tail``: the same with `hybrid.tail_requests` = ``tail_requests`` (its model half drafts
     only on steps of at most that many requests; its KV forward still runs on every step). What
     that KV forward costs both hybrid rows is printed (`kv_forward_s`), and a projection of
     ``hybrid_tail`` with a KV catch-up in its place (`catch_up_projection`, not an engine path);
   - ``reference``: the same proposer choosing with hindsight (`hindsight_class`: each draft token's
     gain 1 if the target accepts it, else 0), on the same cost: a reference, not a bound (the
     per-request hindsight bound, `hindsight_bound`, is the bound);
   - vLLM's built-ins (`bench/builtins.py`): ``vllm_suffix`` and ``ngram`` at the run file's k,
     ``vllm_suffix_default`` and ``ngram_default`` at vLLM's own defaults.
4. Pricing (`cost/price.py`, `bench.hybrid.hardware`, default h100_qwen3_8b): each replay's trace
   against the same text without drafts. The hybrid's priced rollout time and its tokens per target
   forward are given against the better half's (of das, das_all, eagle3, eagle3_rule). Every row
   carries ``coverage`` (the share of request-steps that verified a draft) and
   ``accepted_per_position`` (the share of those drafts whose j-th token was accepted), the
   simulator's acceptance input (`acceptance.bench_json`). The default DAS (``das``) and the hybrid
   are also given against the best of vLLM's built-ins, priced, at each host speed, every row's host
   term its proposer's thread time measured in its own replay (the profile's constants give a
   comparison beside it).
5. The tail, per batch-size bin, in the table `bench --suite das` prints (`bench/das.py`
   `print_tail`): for ``das``, ``eagle3`` and ``hybrid``, tokens per request-step, drafted and covered
   request-steps, acceptance, where ``das``'s drafts come from and the top-N oracle at its matched
   node (`TailDiagnosis`), the share of the hybrid's steps that ran its model half, and the history
   hindsight ceiling on the same bin.

The replays are deterministic for a given text; the wall clock printed beside them is each
replay's own run on this host (proposer lookups, no target forward), the median of
`bench.hybrid.repeats` runs and its range, not what is judged.

Run-file knobs (under ``bench.hybrid``, all optional): ``steps`` (default ``grpo.max_num_steps``),
``hardware``, ``repeats`` (default 3), ``core``, ``problem_seed``, ``head`` (an Eagle3 head to
start from, default the run file's ``eagle3.model``), ``distill`` (default true: the head refreshes
every step), ``model_k`` (the model half's depth, default 3), ``head_problems``, ``head_epochs``
(the problems and epochs a head is built with where none is given, default 48 and 4),
``tail_requests`` (``hybrid_tail``'s `hybrid.tail_requests`, default 4: the tail of the tail table).
Every hybrid row runs at the run file's k, as the DAS rows do.
"""
from __future__ import annotations

import functools
import statistics
import time
from typing import Any

import numpy as np

from nemo_rl_specdec.bench import MAX_PROMPTS, MAX_SAMPLES, MAX_STEPS, hardware_option, option, say, suite_options
from nemo_rl_specdec.config.run import ConfigError, RunConfig

MIN_STEPS = 2
HALVES = ("das", "das_all", "eagle3", "eagle3_rule")
HISTORY_KEY, MODEL_KEY = "das", "eagle3"   # the hardware profile's entries of the two halves
# the replayed rows that draft with a model half: alone, alone under the per-step rule, and with the history half
# chosen per request by the hybrid's rule or with hindsight
MODEL_ALONE, MODEL_RULE, HYBRID_ROW, REFERENCE_ROW = "eagle3", "eagle3_rule", "hybrid", "reference"
TAIL_ROW = "hybrid_tail"   # the hybrid with its model half at the tail only (`hybrid.tail_requests`)
CATCH_UP = "hybrid_tail_catch_up"   # the same, priced with a KV catch-up in place of its KV forwards (projection)
BOTH_HALVES = (HYBRID_ROW, TAIL_ROW, REFERENCE_ROW)
BUILTIN_KEYS = ("vllm_suffix", "ngram")   # the profile's entries of vLLM's built-ins (`bench/builtins.py`)
MODEL_K = 3   # the model half's default depth: an Eagle3 head is trained for a few positions (TTT), run at k=3

_say = functools.partial(say, "hybrid")


def _options(cfg: RunConfig) -> dict:
    from nemo_rl_specdec.bench.das import TAIL

    b = suite_options(cfg, "hybrid", known=("steps", "hardware", "repeats", "core", "problem_seed", "head",
                                            "distill", "head_problems", "head_epochs", "model_k", "tail_requests"))
    seed = cfg.setting("grpo.seed", 0, 0, 2**32 - 1)
    distill = b.get("distill", True)
    if not isinstance(distill, bool):
        raise ConfigError(f"bench.hybrid.distill: got {distill!r}; allowed: true (the head refreshes every step) "
                          "or false (the starting head throughout)")
    head = b.get("head", cfg.get("policy.generation.speculative_decoding.eagle3.model"))
    if head is not None and not isinstance(head, str):
        raise ConfigError(f"bench.hybrid.head: got {head!r}; allowed: an Eagle3 head's directory")
    return {"steps": option(b, "hybrid", "steps", cfg.get("grpo.max_num_steps") or MIN_STEPS, MIN_STEPS, MAX_STEPS),
            "profile": hardware_option(b, "hybrid"), "repeats": option(b, "hybrid", "repeats", 3, 1, 100),
            "core": option(b, "hybrid", "core", 0, 0, 4095), "seed": seed,
            "problem_seed": option(b, "hybrid", "problem_seed", 20_000 + seed, 0, 2**32 - 1),
            "head": head, "distill": distill,
            "head_problems": option(b, "hybrid", "head_problems", 48, 1, MAX_PROMPTS),
            "head_epochs": option(b, "hybrid", "head_epochs", 4, 1, 100),
            "model_k": option(b, "hybrid", "model_k", min(MODEL_K, cfg.spec.num_speculative_tokens), 1,
                              cfg.spec.num_speculative_tokens),
            "tail_requests": option(b, "hybrid", "tail_requests", TAIL, 1, MAX_PROMPTS * MAX_SAMPLES),
            "prompts": cfg.setting("grpo.num_prompts_per_step", 16, 1, MAX_PROMPTS),
            "generations": cfg.setting("grpo.num_generations_per_prompt", 4, 2, MAX_SAMPLES),
            "lr": cfg.setting("grpo.learning_rate", 1e-4, 1e-12, 1.0, float)}


def das_spec(cfg: RunConfig, rule: bool = True):
    """The run file's DAS (`suffix.backend: das`) with the per-step rule on (the history half), or
    with every draft verified (`rule=False`)."""
    from nemo_rl_specdec.drafters.suffix import for_backend

    sched = {**(cfg.get("policy.generation.speculative_decoding.scheduling") or {}),
             "budget": "adaptive" if rule else "uniform"}
    return cfg.with_spec(enabled=True, drafter="suffix", suffix=for_backend(cfg.spec.suffix.model_dump(), "das"),
                         refresh={"mode": "rebuild"}, auto_disable=rule, scheduling=sched).spec


# --------------------------------------------------------------------------- the model half's drafts

def head_command(cfg: RunConfig, out, problems: int, epochs: int) -> list[str]:
    """The `nemo_rl_specdec/tools/train_eagle3.py` command that builds a head for the run file's policy."""
    from nemo_rl_specdec.demo.task import run_task_families

    return ["python", "-m", "nemo_rl_specdec.tools.train_eagle3", "--policy", str(cfg.model_path), "--out", str(out),
            "--problems", str(problems), "--max-new-tokens", str(cfg.generation.max_new_tokens),
            "--epochs", str(epochs), "--threads", "2", "--families", ",".join(run_task_families(cfg))]


def starting_head(cfg: RunConfig, opts: dict) -> str:
    """The head the model half starts from: `bench.hybrid.head` (default the run file's
    `eagle3.model`), else one built for the policy and cached (module doc)."""
    import hashlib
    from pathlib import Path

    from nemo_rl_specdec.resources import cache_dir

    if opts["head"]:
        return str(opts["head"])
    cmd = head_command(cfg, "OUT", opts["head_problems"], opts["head_epochs"])
    tag = hashlib.sha256(" ".join(cmd).encode()).hexdigest()[:12]
    out = cache_dir() / "eagle3_heads" / f"{Path(str(cfg.model_path)).name}-{tag}"
    cmd = head_command(cfg, out, opts["head_problems"], opts["head_epochs"])
    if (out / "model.safetensors").is_file():
        _say(f"Eagle3 head for {cfg.model_path}: cached {out} (built by: {' '.join(cmd)})")
        return str(out)
    _say(f"no Eagle3 head for {cfg.model_path}: building one: {' '.join(cmd)}")
    import subprocess
    import sys

    done = subprocess.run([sys.executable, *cmd[1:]], check=False)   # the tool in its own process (a vLLM engine)
    if done.returncode or not (out / "model.safetensors").is_file():
        raise RuntimeError(f"bench hybrid: building the Eagle3 head failed (exit {done.returncode}): {' '.join(cmd)}")
    return str(out)


def model_drafts(cfg: RunConfig, opts: dict, head_dir: str, weights: list, recorded: list) -> tuple[dict, list]:
    """({(step, rollout): [response tokens - 1, k] drafts for text indices prompt + 1 ...}, the head's
    distillation log): the head's greedy drafts at every decode position of every recorded rollout,
    teacher-forced on the policy version that generated it, the head refreshed after every step."""
    import torch
    from transformers import AutoModelForCausalLM

    from nemo_rl_specdec.drafters.eagle3 import aux_hidden, greedy_drafts
    from nemo_rl_specdec.drafters.registry import drafter as drafter_of
    from nemo_rl_specdec.drafters.roles import ModelWeights

    k = opts["model_k"]
    spec = cfg.with_spec(enabled=True, drafter="eagle3", eagle3={"model": head_dir}, refresh={"mode": "online"}).spec
    distiller = drafter_of("eagle3", ModelWeights).distiller(spec, temperature=max(cfg.generation.temperature, 1e-3),
                                             seed=opts["seed"], model_path=str(cfg.model_path))
    head, layer_ids = distiller.module, distiller.layer_ids
    policy = AutoModelForCausalLM.from_pretrained(str(cfg.model_path), dtype=torch.float32).eval()
    embed = policy.get_input_embeddings()
    L = policy.config.num_hidden_layers
    tables: dict = {}
    log: list = []
    for v, rollouts in enumerate(recorded):
        policy.load_state_dict(weights[v])
        head.eval()
        t0 = time.perf_counter()
        with torch.no_grad():
            for i, r in enumerate(rollouts):
                prompt, tokens = list(r.prompt_token_ids), list(r.token_ids)
                if len(tokens) < 2:   # no decode step: nothing to draft
                    tables[(v, i)] = np.zeros((0, k), dtype=np.int64)
                    continue
                out = policy(input_ids=torch.tensor([prompt + tokens]), output_hidden_states=True, logits_to_keep=1)
                aux = torch.cat(aux_hidden(out.hidden_states, layer_ids, L), -1)[0]
                tables[(v, i)] = greedy_drafts(head, aux, out.hidden_states[0][0], embed, k,
                                               len(prompt) + 1).numpy()
        entry = {"step": v, "draft_s": time.perf_counter() - t0}
        if opts["distill"] and v + 1 < len(recorded):   # the next step's head: distilled towards policy v + 1
            policy.load_state_dict(weights[v + 1])
            st = distiller.step(policy, rollouts)
            entry.update({k_: st[k_] for k_ in ("kl_first", "kl_last", "top1_agreement_before",
                                                "top1_agreement_after", "seconds")})
        log.append(entry)
        _say(f"model drafts of step {v}: {len(rollouts)} rollouts in {entry['draft_s']:.1f}s"
             + (f"; head distilled: top-1 agreement {entry['top1_agreement_before']:.3f} -> "
                f"{entry['top1_agreement_after']:.3f}" if "kl_first" in entry else ""))
    return tables, log


# --------------------------------------------------------------------------- the replayed drafters

def hybrid_spec(cfg: RunConfig, head: str, model_k: int, history: bool = True, tail_requests: int | None = None):
    """The hybrid the engine would run: the run file's DAS beside the Eagle3 head `head` at depth
    `model_k`, both refreshed every step (`history=False`: refresh frozen and no in-flight sharing,
    so the store stays empty: the model half under the hybrid's rule alone); `tail_requests`: its
    `hybrid.tail_requests` (the model half drafts only on steps of at most that many requests)."""
    from nemo_rl_specdec.drafters.suffix import for_backend

    suffix = for_backend(cfg.spec.suffix.model_dump(), "das")
    if not history:
        suffix["share_in_flight"] = "off"
    sched = {**(cfg.get("policy.generation.speculative_decoding.scheduling") or {}), "budget": "uniform"}
    # the run file's k, as the das rows run at (the hybrid's own default k is not DAS's)
    return cfg.with_spec(enabled=True, drafter="hybrid", num_speculative_tokens=cfg.spec.num_speculative_tokens,
                         hybrid={"history": "suffix", "model": "eagle3", "model_k": model_k,
                                 "tail_requests": tail_requests},
                         suffix=suffix, eagle3={"model": head}, refresh={"mode": "online" if history else "frozen"},
                         auto_disable=False, scheduling=sched).spec


def _key(rid: str) -> tuple[int, int]:
    _, v, j = rid.rsplit("-", 2)   # `replay` names request j of batch v "replay-v-j"
    return int(v), int(j)


def table_drafts(tables: dict, recorded: list, k: int):
    """The model half's drafts of a replayed batch, read from `tables` (`model_drafts`): per row, the
    head's k-token draft at the row's position."""
    from nemo_rl_specdec.bench.replay import _field

    plen = {(v, i): len(_field(r, "prompt_token_ids")) for v, rs in enumerate(recorded) for i, r in enumerate(rs)}

    def drafts(batch) -> list:
        out = []
        for i, rid in enumerate(batch.req_ids):
            key = _key(rid)
            out.append([int(x) for x in tables[key][int(batch.num_tokens_no_spec[i]) - plen[key] - 1][:k]])
        return out

    return drafts


def _hits(draft, truth) -> np.ndarray:
    """1 for each leading draft token the target produced, then 0."""
    a = 0
    while a < len(draft) and a < len(truth) and draft[a] == truth[a]:
        a += 1
    return np.array([1.0] * a + [0.0] * (len(draft) - a))


def hindsight_class(texts: dict, drafts) -> type:
    """The engine's `HybridProposer` choosing with hindsight: every draft token's gain is 1 if the
    target produces it, else 0 (`texts`: the recorded tokens per (step, rollout); `drafts`: the model
    half's, `table_drafts`). The ceiling of any rule choosing between the same two drafts."""
    from nemo_rl_specdec.drafters.hybrid import HybridProposer

    class HindsightProposer(HybridProposer):
        def _truth(self, i: int) -> list:
            b = self.runner.input_batch
            n = int(b.num_tokens_no_spec[i])
            return texts[_key(b.req_ids[i])][n:n + self.k]

        def history_gains(self, pending, decode, k):
            by_row = {p[0]: p[3] for p in pending}
            return [_hits(list(by_row.get(i, ()))[:k], self._truth(i)) for i in decode]

        def model_gains(self, decode, k):
            rows = drafts(self.runner.input_batch)
            return [_hits(rows[i][:k], self._truth(i)) for i in decode]

    return HindsightProposer


def model_alone(drafts):
    """vLLM's eagle3 at k = model_k: the head's drafts verified at every step (no proposer of ours)."""
    from nemo_rl_specdec.bench.replay import ReplayDrafter

    return ReplayDrafter(lambda batch, sampled, requests: drafts(batch), lambda rollouts, version: None, "model")


def _counts(rows: list, proposer=None) -> dict:
    """The shares' counts of a replay: the hybrid proposer's own counters, or (the model alone) every
    request-step drafted by the model with its forwards run."""
    if proposer is not None:
        c = proposer.counters
        return {"history": c["from_history"], "model": c["from_model"], "none": c["from_none"], "steps": c["steps"],
                "model_forward_steps": c["model_runs"]}
    steps = [s for r in rows for s in r["trace"].steps if s.rids]
    return {"history": 0, "model": sum(len(s.rids) for s in steps), "none": 0, "steps": len(steps),
            "model_forward_steps": len(steps)}


# --------------------------------------------------------------------------- figures

def summarize(name: str, rows: list, profile, counts: dict | None) -> dict:
    """One configuration's replay (`replay` rows) priced on `profile`, with its shares of drafts."""
    from nemo_rl_specdec.bench.das import by_batch
    from nemo_rl_specdec.cost.price import HOST_SPEEDS, speedup

    traces = [r["trace"] for r in rows]
    sp = [speedup(t, profile) for t in traces]
    gen = sum(r["generated_tokens"] for r in rows)
    fwd = sum(r["target_forwards"] for r in rows)
    dt = sum(r["draft_tokens"] for r in rows)
    spec_s = sum(x["spec"]["rollout_s"] for x in sp)
    base_s = sum(x["baseline"]["rollout_s"] for x in sp)
    request_steps = sum(len(s.rids) for t in traces for s in t.steps)
    if counts is None:   # a list drafter: every drafted request-step is history
        drafted = sum(1 for t in traces for s in t.steps for d in s.drafts if d)
        counts = {"history": drafted, "model": 0, "none": request_steps - drafted, "steps": 0,
                  "model_forward_steps": 0}
    total = counts["history"] + counts["model"] + counts["none"]
    decode_steps = sum(1 for t in traces for s in t.steps if s.rids)
    accepted = [a for t in traces for s in t.steps for d, a in zip(s.drafts, s.accepted, strict=True) if d]
    k = max((t.k for t in traces), default=0)
    per_position = [sum(1 for a in accepted if a > j) / len(accepted) for j in range(k)] if accepted else []
    return {"name": name, "drafter": name, "k": k, "tokens_per_target_forward": gen / fwd if fwd else None,
            "acceptance_rate": sum(r["accepted_draft_tokens"] for r in rows) / dt if dt else 0.0,
            "wall_clock_ratio": None,   # no engine runs these drafters side by side: see the priced figures
            "share_history": counts["history"] / total if total else 0.0,
            "share_model": counts["model"] / total if total else 0.0,
            "share_none": counts["none"] / total if total else 0.0,
            "model_forward_steps": counts["model_forward_steps"], "decode_steps": decode_steps,
            "coverage": len(accepted) / request_steps if request_steps else 0.0,
            "accepted_per_position": per_position,
            "hardware": profile.name, "priced_speedup": base_s / spec_s if spec_s else None,
            "priced_rollout_s": spec_s, "priced_baseline_s": base_s,
            "priced_draft_s": sum(x["spec"]["draft_s"] for x in sp),
            "priced_proposer_s": sum(x["spec"]["proposer_s"] for x in sp),
            "priced_by_host_speed": [{"host_speed": h, "rollout_s": sum(next(
                b["rollout_s"] for b in x["by_host_speed"] if b["host_speed"] == h) for x in sp)}
                for h in HOST_SPEEDS],
            "measured_by_host_speed": [{"host_speed": h, **{key: sum(next(
                b[key] for b in x["measured_by_host_speed"] if b["host_speed"] == h) for x in sp)
                for key in ("rollout_s", "proposer_s")}} for h in HOST_SPEEDS],
            "by_batch": by_batch(traces, profile),
            "per_step": [{"step": v, "tokens_per_target_forward": r["tokens_per_target_forward"],
                          "priced_speedup": x["speedup"], "trace": r["trace"].to_dict()}
                         for v, (r, x) in enumerate(zip(rows, sp, strict=True))]}


def kv_forward_s(result: dict, profile) -> float:
    """The priced draft side of the steps of a hybrid row whose model half ran its KV forward alone
    (vLLM's k = 0 first forward, ``model_forwards`` 1): what drafting beside the model costs on the
    steps the model half did not draft."""
    from nemo_rl_specdec.cost.price import step_costs
    from nemo_rl_specdec.cost.trace import Trace

    out = 0.0
    for st in result["per_step"]:
        t = Trace.from_dict(st["trace"])
        out += sum(c.draft_s for s, c in zip(t.steps, step_costs(t, profile), strict=True)
                   if s.rids and s.model_forwards == 1)
    return out


def catch_up_projection(result: dict, tail: int, profile, model_key: str) -> dict:
    """The hybrid at the tail (`TAIL_ROW`) as it would price if its model half skipped its KV forward
    on every step of more than `tail` requests and caught its KV up in one forward when the tail
    begins (the first step at or below `tail` after steps above it), over every context token of the
    requests then decoding, priced as the model part's forward over that many prefilled tokens. A
    projection from the row's own trace, not an engine path: the engine keeps the KV forward
    (`drafters/hybrid.py`). ``above_tail_kv_s``: what the KV forwards above the tail cost;
    ``catch_up_s``, ``catch_ups``, ``catch_up_tokens``: the catch-up forwards; ``measured_by_host_speed``:
    the row's rollout time with the one replaced by the other, at each host speed."""
    import numpy as np

    from nemo_rl_specdec.cost.model import Step
    from nemo_rl_specdec.cost.price import step_costs
    from nemo_rl_specdec.cost.trace import Trace

    cm = profile.cost_model(model_key)
    above = catch = 0.0
    events = tokens = 0
    for st in result["per_step"]:
        t = Trace.from_dict(st["trace"])
        was_above = False
        for s, c in zip(t.steps, step_costs(t, profile), strict=True):
            if not s.rids:
                continue
            if len(s.rids) > tail:
                above += c.draft_s
                was_above = True
            elif was_above:
                n = int(sum(s.ctx))
                catch += cm.cost(Step.of(np.zeros(0), np.zeros(0), float(n), 1)).draft_s
                events, tokens, was_above = events + 1, tokens + n, False
    return {"tail_requests": tail, "above_tail_kv_s": above, "catch_up_s": catch, "catch_ups": events,
            "catch_up_tokens": tokens, "projection": True,
            "measured_by_host_speed": [{"host_speed": b["host_speed"], "rollout_s": b["rollout_s"] - above + catch}
                                       for b in result["measured_by_host_speed"]]}


def hindsight_bound(recorded: list, tables: dict, k: int, model_k: int) -> dict:
    """The per-request hindsight bound on tokens per target forward (`bench/ceilings.py`
    `hybrid_bound`): at every position the better of the history hindsight at `k` and the model
    half's teacher-forced draft there (`model_drafts`, its first `model_k` tokens), so no rule choosing
    between the two drafts makes more tokens per forward."""
    from nemo_rl_specdec.bench.ceilings import hybrid_bound
    from nemo_rl_specdec.bench.replay import _field

    plen_of = {(v, i): len(_field(r, "prompt_token_ids")) for v, rs in enumerate(recorded) for i, r in enumerate(rs)}

    def model_accepted(v: int, i: int, n: int) -> int:
        table, plen = tables[(v, i)], plen_of[(v, i)]
        row = n - plen - 1
        if not 0 <= row < len(table):
            return 0
        truth = list(_field(recorded[v][i], "token_ids"))[n - plen:]
        a = 0
        for d, t in zip(table[row][:model_k], truth, strict=False):
            if int(d) != int(t):
                break
            a += 1
        return a

    return {**hybrid_bound(recorded, k, model_accepted), "model_k": model_k}


def judge(results: list, bound: dict | None = None) -> dict:
    """The hybrid and the reference row against the better half (module doc), priced and replayed, the hybrid's
    share of the per-request hindsight `bound` (`hindsight_bound`), and the default DAS and the hybrid
    against the best of vLLM's built-ins at each host speed, every row's host term its proposer's time
    measured in its replay (``*_vs_best_builtin``; with the profile's constants:
    ``*_vs_best_builtin_profile_constants``, a comparison)."""
    from nemo_rl_specdec.bench.builtins import BUILTINS, verdict

    by = {r["name"]: r for r in results}
    halves = [by[h] for h in HALVES if h in by]
    best_time = min(halves, key=lambda r: r["priced_rollout_s"])
    best_tpf = max(halves, key=lambda r: r["tokens_per_target_forward"])
    out = {"better_half_priced": best_time["name"], "better_half_tokens_per_forward": best_tpf["name"]}
    for name in BOTH_HALVES:
        if name in by:
            out[f"{name}_vs_better_half_priced"] = best_time["priced_rollout_s"] / by[name]["priced_rollout_s"]
            out[f"{name}_vs_better_half_tokens_per_forward"] = (by[name]["tokens_per_target_forward"]
                                                                / best_tpf["tokens_per_target_forward"])
    if bound is not None:
        out["hindsight_bound_tokens_per_forward"] = bound["tokens_per_target_forward"]
        for name in (HYBRID_ROW, TAIL_ROW, REFERENCE_ROW, *HALVES):
            if name in by:
                out[f"{name}_share_of_hindsight_bound"] = (by[name]["tokens_per_target_forward"]
                                                           / bound["tokens_per_target_forward"])
    if set(by) & set(BUILTINS):   # the default DAS and the hybrid against the best of vLLM's built-ins, priced
        for bands, suffix in (("measured_by_host_speed", ""), ("priced_by_host_speed", "_profile_constants")):
            by_host: dict = {b["host_speed"]: {} for r in results for b in r.get(bands, [])}
            for r in results:
                for b in r.get(bands, []):
                    by_host[b["host_speed"]][r["name"]] = b["rollout_s"]
            for ours in (HISTORY_KEY, HYBRID_ROW, TAIL_ROW):
                if ours in by:
                    out[f"{ours}_vs_best_builtin{suffix}"] = verdict(by_host, ours)
        projected = by.get(TAIL_ROW, {}).get("catch_up")
        if projected:   # the tail row with a catch-up in place of its KV forwards above the tail (a projection)
            by_host = {}
            for r in results:
                for b in r.get("measured_by_host_speed", []):
                    by_host.setdefault(b["host_speed"], {})[r["name"]] = b["rollout_s"]
            for b in projected["measured_by_host_speed"]:
                by_host[b["host_speed"]][CATCH_UP] = b["rollout_s"]
            out[f"{CATCH_UP}_vs_best_builtin"] = verdict(by_host, CATCH_UP)
    return out


ROWS = ("das", "das_all", MODEL_ALONE, MODEL_RULE, *BOTH_HALVES)   # the replayed rows before vLLM's built-ins


def replay_all(cfg: RunConfig, opts: dict, recorded: list, tables: dict, head: str,
               names: tuple | None = None) -> list[dict]:
    """Every configuration's replay (`names`: only those rows), `opts["repeats"]` times (the figures
    must repeat exactly; the wall clock is the median), summarized and priced."""
    from nemo_rl_specdec.bench.builtins import BUILTINS, changes as builtin_changes
    from nemo_rl_specdec.bench.replay import BesideReplay, _field, replay
    from nemo_rl_specdec.config.run import cost_entry, cost_parts
    from nemo_rl_specdec.cost.price import PricedHybridCost, PricedStepCost

    g, k, profile, model_k = cfg.generation, cfg.spec.num_speculative_tokens, opts["profile"], opts["model_k"]
    history = das_spec(cfg)
    texts = {(v, i): list(_field(r, "prompt_token_ids")) + list(_field(r, "token_ids")) for v, rs in enumerate(recorded)
             for i, r in enumerate(rs)}
    drafts = table_drafts(tables, recorded, model_k)
    mml = g.vllm_cfg.max_model_len
    results = []
    for name in (n for n in (*ROWS, *BUILTINS) if names is None or n in names):
        walls, first = [], None
        for _ in range(opts["repeats"]):
            t0 = time.perf_counter()
            counts = None
            if name == "das":
                rows = replay(history, recorded, mml, g.temperature, step_cost=PricedStepCost(profile, HISTORY_KEY, k),
                              label=HISTORY_KEY)
            elif name == "das_all":
                rows = replay(das_spec(cfg, rule=False), recorded, mml, g.temperature, label=HISTORY_KEY)
            elif name == MODEL_ALONE:
                rows = replay(history, recorded, mml, g.temperature, drafter=model_alone(drafts), label=MODEL_KEY)
                counts = _counts(rows)
            elif name in (MODEL_RULE, *BOTH_HALVES):   # the engine's HybridProposer on the replayed steps
                spec = hybrid_spec(cfg, head, model_k, history=name != MODEL_RULE,
                                   tail_requests=opts["tail_requests"] if name == TAIL_ROW else None)
                both = name in BOTH_HALVES
                cost = (PricedHybridCost(profile, HISTORY_KEY, MODEL_KEY, k) if both
                        else PricedHybridCost(profile, MODEL_KEY, MODEL_KEY, model_k))
                beside = BesideReplay(spec, mml, drafts, cost=cost, temperature=g.temperature,
                                      proposer_class=hindsight_class(texts, drafts) if name == REFERENCE_ROW else None)
                if not both:   # no per-request tree either: the history half drafts nothing
                    beside.proposer.history.use_local = False
                drafter = beside.drafter("hybrid", cost_parts(spec)) if both else beside.drafter("model")
                rows = replay(spec, recorded, mml, g.temperature, drafter=drafter, label=name if both else MODEL_KEY)
                counts = _counts(rows, beside.proposer)
            else:   # a built-in row with an entry of its own in the profile is priced by it (bench/das.py)
                spec = cfg.with_spec(enabled=True, **builtin_changes(name, cfg)).spec
                rows = replay(spec, recorded, mml, g.temperature,
                              label=name if name in profile.drafters else cost_entry(spec)[1])
            walls.append(time.perf_counter() - t0)
            figures = [(r["generated_tokens"], r["target_forwards"], r["draft_tokens"]) for r in rows]
            if first is not None and figures != first:
                raise RuntimeError(f"bench hybrid: the {name} replay gave different figures on a repeat: it must be "
                                   "deterministic")
            first = figures
        r = summarize(name, rows, profile, counts)
        if name in BOTH_HALVES:
            r["kv_forward_s"] = kv_forward_s(r, profile)
        if name == TAIL_ROW:
            r["catch_up"] = catch_up_projection(r, opts["tail_requests"], profile, MODEL_KEY)
        r.update(replay_wall_s=statistics.median(walls), replay_wall_spread=f"{min(walls):.2f}-{max(walls):.2f}",
                 repeats=len(walls))
        results.append(r)
        _say(f"{name}: {r['tokens_per_target_forward']:.3f} tok/fwd, priced x{r['priced_speedup']:.3f}, "
             f"shares history {r['share_history']:.2f} model {r['share_model']:.2f}")
    return results


def run(cfg: RunConfig, args: Any) -> list[dict]:
    from nemo_rl_specdec.bench import release_memory
    from nemo_rl_specdec.bench.das import record_trajectory
    from nemo_rl_specdec.driver.engine import Engine

    opts = _options(cfg)
    for key in (HISTORY_KEY, MODEL_KEY, *BUILTIN_KEYS):   # a profile that cannot price a row fails before any engine
        opts["profile"].drafter(key)
    g = cfg.generation
    head = starting_head(cfg, opts)
    _say(f"{opts['steps']} steps, {opts['prompts']} problems x {opts['generations']} samples, "
         f"k={cfg.spec.num_speculative_tokens}, T={g.temperature}, model={cfg.model_path}, head={head}, "
         f"priced on {opts['profile'].name}")
    baseline = Engine(cfg, spec_enabled=False, core=opts["core"], seed=opts["seed"], name="no_spec")
    try:
        _, _, weights, train_log, recorded = record_trajectory(cfg, opts, baseline, _say)
    finally:
        baseline.close()
        release_memory()
    tables, distill_log = model_drafts(cfg, opts, head, weights, recorded)
    del weights
    release_memory()
    results = replay_all(cfg, opts, recorded, tables, head)
    verdict = judge(results, hindsight_bound(recorded, tables, cfg.spec.num_speculative_tokens, opts["model_k"]))
    tail = tail_figures(cfg, opts, recorded)
    for r in results:
        r.update(train=train_log, distill=distill_log, head=head, verdict=verdict)
        if r["name"] == HISTORY_KEY:
            r["tail"] = tail["das"]
    _print(results, verdict, cfg, opts, tail["ceiling"])
    return results


def tail_figures(cfg: RunConfig, opts: dict, recorded: list) -> dict:
    """What the per-bin tail table (`bench/das.py` `print_tail`, as `bench --suite das` prints it) needs
    beyond the rows' traces: the history hindsight ceiling at the run file's k (``ceiling``: its
    figures per batch-size bin) and the ``das`` row's `TailDiagnosis` (``das``)."""
    from nemo_rl_specdec.bench.ceilings import history_ceiling
    from nemo_rl_specdec.bench.das import diagnose_tail
    from nemo_rl_specdec.cost.price import PricedStepCost

    g, k = cfg.generation, cfg.spec.num_speculative_tokens
    mml = g.vllm_cfg.max_model_len
    return {"ceiling": history_ceiling(das_spec(cfg), recorded, mml, g.temperature)["by_batch"],
            "das": diagnose_tail(das_spec(cfg), recorded, mml, g.temperature,
                                 PricedStepCost(opts["profile"], HISTORY_KEY, k))}


def _print(results: list, verdict: dict, cfg: RunConfig, opts: dict, ceiling: dict | None = None) -> None:
    from nemo_rl_specdec.bench import print_table

    p = opts["profile"]
    print(f"Hybrid suite on {cfg.source} ({cfg.model_path}, k={cfg.spec.num_speculative_tokens}): every configuration "
          f"replayed on the same recorded text, priced on {p.name} ({p.hardware.name}) against the same text without "
          "drafts (deterministic); wall s: the replay's own run on this host, median of "
          f"{opts['repeats']} (range), printed, not judged")
    rows = [{"config": r["name"], "tok/fwd": r["tokens_per_target_forward"], "accept": r["acceptance_rate"],
             "history %": 100 * r["share_history"], "model %": 100 * r["share_model"], "none %": 100 * r["share_none"],
             "model fwd steps": f"{r['model_forward_steps']}/{r['decode_steps']}", "priced x": r["priced_speedup"],
             "rollout s": r["priced_rollout_s"], "draft s": r["priced_draft_s"], "proposer s": r["priced_proposer_s"],
             "wall s": r["replay_wall_s"], "wall range": r["replay_wall_spread"]} for r in results]
    print_table(rows, list(rows[0]))
    v = verdict
    print(f"hybrid vs the better half ({v['better_half_priced']}), priced rollout time: "
          f"{v['hybrid_vs_better_half_priced']:.3f}x; "
          f"tokens per forward vs {v['better_half_tokens_per_forward']}: "
          f"{v['hybrid_vs_better_half_tokens_per_forward']:.3f}x; the reference (the rule with hindsight gains): "
          f"{v['reference_vs_better_half_priced']:.3f}x priced, "
          f"{v['reference_vs_better_half_tokens_per_forward']:.3f}x tok/fwd")
    if "hindsight_bound_tokens_per_forward" in v:
        print(f"per-request hindsight bound (no rule choosing between the two drafts makes more, bench/ceilings.py): "
              f"{v['hindsight_bound_tokens_per_forward']:.3f} tok/fwd; share of it: " + ", ".join(
                  f"{n} {100 * v[f'{n}_share_of_hindsight_bound']:.1f}%" for n in (HYBRID_ROW, REFERENCE_ROW, *HALVES)
                  if f"{n}_share_of_hindsight_bound" in v))
    from nemo_rl_specdec.bench.builtins import verdict_lines

    ks = {r["name"]: r["k"] for r in results if "k" in r}
    for ours in (HISTORY_KEY, HYBRID_ROW, TAIL_ROW):
        for line in verdict_lines(v.get(f"{ours}_vs_best_builtin", []),
                                  "priced rollout time, proposer time measured in this run", ks):
            print(line)
        print("  the same with the profile's constants for the host term (a comparison, not the verdict): " + "; ".join(
            f"host {x['host_speed']:g}x {x['ratio']:.3f}x against {x['best_builtin']}"
            for x in v.get(f"{ours}_vs_best_builtin_profile_constants", [])))
    by = {r["name"]: r for r in results}
    for name in (HYBRID_ROW, TAIL_ROW):
        if "kv_forward_s" in by.get(name, {}):
            print(f"{name}: its model half's KV forward alone (vLLM's k = 0 forward, on the steps it did not draft) "
                  f"costs {by[name]['kv_forward_s']:.3f} s of its priced {by[name]['priced_rollout_s']:.3f} s")
    cu = by.get(TAIL_ROW, {}).get("catch_up")
    if cu:
        one = next(b for b in cu["measured_by_host_speed"] if b["host_speed"] == 1.0)
        print(f"{TAIL_ROW} (model half at <= {cu['tail_requests']} requests): its KV forwards above the tail cost "
              f"{cu['above_tail_kv_s']:.3f} s; skipped there and caught up in one forward when the tail begins "
              f"({cu['catch_ups']} forwards over {cu['catch_up_tokens']} context tokens, {cu['catch_up_s']:.4f} s), "
              f"the row would price at {one['rollout_s']:.3f} s at host 1x (a projection from its trace, not an "
              "engine path: the engine keeps the KV forward)")
        for line in verdict_lines(v.get(f"{CATCH_UP}_vs_best_builtin", []),
                                  "projected priced rollout time, proposer time measured in this run", ks):
            print("  " + line)
    from nemo_rl_specdec.bench.das import print_tail

    shown = [r for r in results if r["name"] in (HISTORY_KEY, MODEL_ALONE, HYBRID_ROW, TAIL_ROW) and r.get("by_batch")]
    print_tail(shown, ceiling, HISTORY_KEY, HYBRID_ROW, TAIL_ROW)
