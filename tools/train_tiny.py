"""Train the bundled default workload: a tiny Qwen3 policy and a smaller Qwen3 draft model.

    python -m tools.train_tiny --out nemo_rl_specdec/assets/tiny --seed 0

The bundled assets were made in two runs: the command above (the sum family alone), then
``--families sum,sort,base --init-from <that output> --min-steps 200`` on the three-family pool
(MANIFEST.json keeps the first run's manifest under ``continued_from``).

Writes ``<out>/policy`` and ``<out>/draft`` (``save_pretrained``, fp32 safetensors, plus the
tokenizer files) and ``<out>/MANIFEST.json``. Everything is derived from ``--seed``:

* tokenizer: character level (a ``tokenizers`` BPE model with an empty merge list, so every
  character is one token), wrapped as a ``PreTrainedTokenizerFast``;
* policy: ``Qwen3ForCausalLM`` (~1.7 M params) trained by supervised learning on the worked
  solutions of :mod:`nemo_rl_specdec.demo.task`, stopped EARLY, as soon as its greedy
  exact-match rate on a dev set (computed exactly by one teacher-forced pass) reaches
  ``--target-acc``. The GRPO demo needs a policy that is partially competent (it fails mostly
  on long problems) and still has something to learn;
* draft: a smaller ``Qwen3ForCausalLM`` (~0.36 M params), SFT-trained on the policy's batches,
  then distilled from the final policy (KL(policy || draft) on teacher-forced reference
  solutions), so it imitates the policy's distribution rather than the ground truth.

What made SFT fit in ~1000 steps of 1024 tokens (measured, seed 0): lr 6e-4 (2e-3 stalled on
the loss plateau), and Fourier features of the digit value written into the digit embeddings
at init (without them the sum digits were still at ~50% token accuracy after 1000 steps; with
them the units digit reached 99% by step ~950).

CPU only, plain torch + transformers, one thread by default. Runs are reproducible on a given
machine; across machines floating-point differences may shift the early-stop step.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from nemo_rl_specdec.demo import task
from nemo_rl_specdec.resources import asset_path
from nemo_rl_specdec.tools.draft_training import families_arg, optimizer_step

SCRIPT_VERSION = "1.0"

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = "0123456789" + " \n+-=*:,.?()" + "abcdefghijklmnopqrstuvwxyz" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
VOCAB_SIZE = 128  # model vocab: tokenizer vocab (78) padded up to a multiple of 64

POLICY_ARCH = dict(hidden_size=192, num_hidden_layers=4, num_attention_heads=8,
                   num_key_value_heads=4, intermediate_size=480)
DRAFT_ARCH = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=320)

# Seed offsets of the problem streams, so training, dev (early stop) and eval never share a seed.
TRAIN_SEED_BASE = 1_000_000
DEV_SEED_BASE = 7_000_000
EVAL_SEED_BASE = 9_000_000
LEN_SEED_BASE = 11_000_000

N_BUCKETS = [(2, 3), (4, 6), (7, 12), (13, task.MAX_N)]


def log(msg: str) -> None:
    print(f"[train_tiny {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----------------------------------------------------------------------------- tokenizer
def build_tokenizer():
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + list(CHARS))}
    assert len(vocab) <= VOCAB_SIZE
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
    )
    # Round-trip check: every character of the task is its own token and decodes back exactly.
    sample = task.make_problems(1, 0)[0]
    text = sample.prompt + task.reference_solution(sample)
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(text) and tok.decode(ids) == text, "tokenizer round trip failed"
    return tok


# ----------------------------------------------------------------------------- models
def make_config(arch: dict, tok):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=VOCAB_SIZE,
        head_dim=32,
        hidden_act="silu",
        max_position_embeddings=1024,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        initializer_range=0.02,
        attention_bias=False,
        use_cache=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        architectures=["Qwen3ForCausalLM"],
        **arch,
    )


def make_model(arch: dict, tok, seed: int):
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(make_config(arch, tok)).float()
    model.generation_config.bos_token_id = tok.bos_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model


def n_params(model) -> int:
    # Parameters are unique objects; the tied lm_head is counted once.
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------- data
def encode(tok, problem) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids incl. EOS) for the reference solution."""
    p = tok.encode(problem.prompt, add_special_tokens=False)
    r = tok.encode(task.reference_solution(problem), add_special_tokens=False) + [tok.eos_token_id]
    return p, r


def batch_stream(tok, seed: int, token_budget: int, chunk: int = 512, max_seqs: int = 64,
                 families=("sum",)):
    """Endless stream of (input_ids, labels) batches; similar lengths grouped to cut padding."""
    rng = random.Random(seed)
    k = 0
    while True:
        probs = task.make_problems(chunk, TRAIN_SEED_BASE + 1000 * seed + k, families)
        k += 1
        seqs = [encode(tok, p) for p in probs]
        seqs.sort(key=lambda s: len(s[0]) + len(s[1]))
        batches, cur = [], []
        for s in seqs:
            L = len(s[0]) + len(s[1])
            if cur and ((len(cur) + 1) * L > token_budget or len(cur) >= max_seqs):
                batches.append(cur)
                cur = []
            cur.append(s)
        if cur:
            batches.append(cur)
        rng.shuffle(batches)
        for b in batches:
            T = max(len(p) + len(r) for p, r in b)
            ids = torch.full((len(b), T), tok.pad_token_id, dtype=torch.long)
            labels = torch.full((len(b), T), -100, dtype=torch.long)
            for i, (p, r) in enumerate(b):
                ids[i, : len(p) + len(r)] = torch.tensor(p + r)
                labels[i, len(p): len(p) + len(r)] = torch.tensor(r)
            yield ids, labels


def shifted_logits_and_targets(model, ids, labels):
    # Right padding + causal attention: pad positions never influence real tokens, so no mask.
    logits = model(input_ids=ids).logits[:, :-1]
    return logits, labels[:, 1:]


# ----------------------------------------------------------------------------- evaluation
@torch.no_grad()
def generate(model, tok, problems, *, max_new_tokens: int = 512, do_sample: bool = False,
             temperature: float = 1.0, seed: int = 0) -> list[str]:
    """Responses (special tokens stripped), batched by prompt length (no padding needed)."""
    model.eval()
    out: dict[int, str] = {}
    groups: dict[int, list[int]] = {}
    enc = [tok.encode(p.prompt, add_special_tokens=False) for p in problems]
    for i, e in enumerate(enc):
        groups.setdefault(len(e), []).append(i)
    if do_sample:
        torch.manual_seed(seed)
    for L in sorted(groups):
        idx = groups[L]
        inp = torch.tensor([enc[i] for i in idx])
        kw = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if do_sample \
            else dict(do_sample=False)
        gen = model.generate(input_ids=inp, attention_mask=torch.ones_like(inp),
                             max_new_tokens=max_new_tokens, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id, **kw)
        for j, i in enumerate(idx):
            out[i] = tok.decode(gen[j, L:], skip_special_tokens=True)
    model.train()
    return [out[i] for i in range(len(problems))]


_WELL_FORMED = {
    "sum": re.compile(r"(?:\d\d\+[A-Za-z]\d\d=\d\d\n)+answer: \d\d"),
    "sort": re.compile(r"(?:[A-Za-z]\d\d(?: [A-Za-z]\d\d)*\n)+answer: [A-Za-z]+"),
    "base": re.compile(r"(?:\d+=2\*\d+\+[01]\n)+answer: [01]+"),
}


def well_formed(text: str, family: str = "sum") -> bool:
    return _WELL_FORMED[family].fullmatch(text) is not None


def _by_family(families: list, scores: list) -> dict:
    """Mean score per task family (`families[i]` is the family of `scores[i]`)."""
    return {
        f: sum(s for g, s in zip(families, scores, strict=True) if g == f) / families.count(f)
        for f in sorted(set(families))
    }


def evaluate(model, tok, problems, **gen_kw) -> dict:
    texts = generate(model, tok, problems, **gen_kw)
    scores = [task.verify(p, t) for p, t in zip(problems, texts, strict=True)]
    by_bucket = {}
    for lo, hi in N_BUCKETS:
        s = [sc for p, sc in zip(problems, scores, strict=True) if lo <= p.meta["n"] <= hi]
        by_bucket[f"n{lo}-{hi}"] = {"count": len(s), "accuracy": (sum(s) / len(s)) if s else None}
    return {
        "num_problems": len(problems),
        "accuracy": sum(scores) / len(scores),
        "well_formed": sum(well_formed(t, p.family) for p, t in zip(problems, texts, strict=True)) / len(texts),
        "by_n": by_bucket,
        "by_family": _by_family([p.family for p in problems], scores),
    }


# ----------------------------------------------------------------------------- training
def lr_at(step: int, peak: float, warmup: int) -> float:
    """Linear warmup, then constant: training is ended by the early stop, not by a schedule."""
    return peak * min(1.0, (step + 1) / warmup)


def _adamw(model, lr: float):
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)


def sft_loss(model, ids, labels):
    logits, tgt = shifted_logits_and_targets(model, ids, labels)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), ignore_index=-100)


def train_models(tok, args) -> tuple[object, object, dict, dict]:
    """Phase 1: SFT of the policy (early-stopped) with the draft SFT-trained on the same batches.

    Phase 2: the draft is distilled from the final policy, KL(policy || draft) on reference
    solutions, so it imitates the policy it will draft for (including its mistakes).
    """
    if args.init_from:
        from transformers import Qwen3ForCausalLM

        policy = Qwen3ForCausalLM.from_pretrained(Path(args.init_from) / "policy").float()
        draft = Qwen3ForCausalLM.from_pretrained(Path(args.init_from) / "draft").float()
        log(f"policy and draft start from {args.init_from}")
    else:
        policy = make_model(POLICY_ARCH, tok, args.seed)
        draft = make_model(DRAFT_ARCH, tok, args.seed + 1)
        init_digit_embeddings(policy, tok, args.digit_fourier_init)
        init_digit_embeddings(draft, tok, args.digit_fourier_init)
    log(f"policy: {n_params(policy):,} params; draft: {n_params(draft):,} params")
    p_opt, d_opt = _adamw(policy, args.lr), _adamw(draft, args.draft_lr)
    dev = task.make_problems(args.dev_size, DEV_SEED_BASE + args.seed, args.families)
    stream = batch_stream(tok, args.seed, args.token_budget, families=args.families)
    history, t0 = [], time.time()
    p_ema = d_ema = None
    log(f"dev set: {len(dev)} problems; early stop once greedy exact-match >= {args.target_acc}")
    step, stopped = 0, "max_steps"
    policy.train()
    draft.train()
    while step < args.policy_max_steps:
        ids, labels = next(stream)
        lr = lr_at(step, args.lr, args.warmup)
        pl = optimizer_step(policy, p_opt, sft_loss(policy, ids, labels), lr)
        dl = optimizer_step(draft, d_opt, sft_loss(draft, ids, labels), lr_at(step, args.draft_lr, args.warmup))
        step += 1
        p_ema = pl if p_ema is None else 0.95 * p_ema + 0.05 * pl
        d_ema = dl if d_ema is None else 0.95 * d_ema + 0.05 * dl
        if step % 50 == 0:
            log(f"step {step} policy loss {p_ema:.4f} draft loss {d_ema:.4f} lr {lr:.2e} "
                f"({time.time() - t0:.0f}s)")
        if step >= args.min_steps and step % args.eval_every == 0:
            r = teacher_forced_exact(policy, tok, dev)
            history.append({"step": step, "loss_ema": round(p_ema, 4), "dev_exact_match": r["accuracy"],
                            "dev_exact_match_by_n": {k: v["accuracy"] for k, v in r["by_n"].items()},
                            "dev_exact_match_by_family": r["by_family"],
                            "token_accuracy_by_role": r["token_accuracy_by_role"],
                            "seconds": round(time.time() - t0, 1)})
            log(f"step {step} policy dev greedy exact-match {r['accuracy']:.3f} by family {r['by_family']} "
                f"by n {_fmt_buckets(r)} "
                f"token acc {r['token_accuracy_by_role']}")
            if r["accuracy"] >= args.target_acc:
                stopped = f"dev exact-match {r['accuracy']:.3f} >= target {args.target_acc}"
                break
    p_info = {"steps": step, "stopped": stopped, "seconds": round(time.time() - t0, 1),
              "final_loss_ema": round(p_ema, 4), "dev_history": history,
              "objective": "cross-entropy on reference solutions (response tokens + EOS)"}
    log(f"policy done: {step} steps, {stopped}, {p_info['seconds']}s")

    log(f"draft: distilling from the policy for {args.distill_steps} steps")
    t1, kl_ema = time.time(), None
    policy.eval()
    stream = batch_stream(tok, args.seed + 1, args.token_budget, families=args.families)
    for k in range(args.distill_steps):
        ids, labels = next(stream)
        with torch.no_grad():
            t_logits, tgt = shifted_logits_and_targets(policy, ids, labels)
        s_logits, _ = shifted_logits_and_targets(draft, ids, labels)
        mask = tgt != -100
        t_logp = F.log_softmax(t_logits[mask], -1)
        s_logp = F.log_softmax(s_logits[mask], -1)
        kl = (t_logp.exp() * (t_logp - s_logp)).sum(-1).mean()  # KL(policy || draft)
        lr = args.draft_lr * 0.5 * (1 + math.cos(math.pi * k / max(1, args.distill_steps)))
        v = optimizer_step(draft, d_opt, kl, lr)
        kl_ema = v if kl_ema is None else 0.95 * kl_ema + 0.05 * v
        if (k + 1) % 50 == 0:
            log(f"distill step {k + 1} KL {kl_ema:.4f} ({time.time() - t1:.0f}s)")
    d_info = {"sft_steps": step, "sft_final_loss_ema": round(d_ema, 4),
              "distill_steps": args.distill_steps,
              "distill_final_kl_ema": round(kl_ema, 4) if kl_ema is not None else None,
              "seconds_distill": round(time.time() - t1, 1),
              "objective": "SFT on the policy's batches, then KL(policy || draft) on reference solutions"}
    return policy, draft, p_info, d_info


def init_digit_embeddings(model, tok, amplitude: float) -> None:
    """Write Fourier features of the digit value into the first 8 embedding dims of '0'..'9'.

    Deterministic and optional (amplitude 0 disables it). Modular addition is solved with
    such features; starting from them shortens SFT a lot on one CPU thread.
    """
    if amplitude <= 0:
        return
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        for d in range(10):
            t = tok.convert_tokens_to_ids(str(d))
            for k in range(1, 5):
                emb[t, 2 * k - 2] = amplitude * math.cos(2 * math.pi * k * d / 10)
                emb[t, 2 * k - 1] = amplitude * math.sin(2 * math.pi * k * d / 10)


@torch.no_grad()
def teacher_forced_exact(model, tok, problems, token_budget: int = 4096) -> dict:
    """Fraction of problems whose whole reference response (incl. EOS) is the model's argmax.

    Greedy decoding reproduces the reference exactly iff the argmax under teacher forcing
    matches at every response position, so this equals the greedy exact-match rate (a tight
    lower bound of greedy accuracy) at the cost of one forward pass. Used for early stopping.
    """
    model.eval()
    hits, role_hits = [], {}
    seqs = sorted(((encode(tok, p), p) for p in problems), key=lambda x: len(x[0][0]) + len(x[0][1]))
    i = 0
    while i < len(seqs):
        j = i + 1
        while j < len(seqs) and (j - i + 1) * (len(seqs[j][0][0]) + len(seqs[j][0][1])) <= token_budget:
            j += 1
        chunk = seqs[i:j]
        T = max(len(pr) + len(r) for (pr, r), _ in chunk)
        ids = torch.full((len(chunk), T), tok.pad_token_id, dtype=torch.long)
        for k, ((pr, r), _) in enumerate(chunk):
            ids[k, : len(pr) + len(r)] = torch.tensor(pr + r)
        pred = model(input_ids=ids).logits.argmax(-1)
        for k, ((pr, r), p) in enumerate(chunk):
            match = pred[k, len(pr) - 1: len(pr) + len(r) - 1] == ids[k, len(pr): len(pr) + len(r)]
            hits.append((p.meta["n"], bool(match.all()), p.family))
            for role, m in zip(token_roles(p), match.tolist(), strict=False):
                role_hits.setdefault(role, []).append(m)
        i = j
    model.train()
    by = {}
    for lo, hi in N_BUCKETS:
        s = [ok for n, ok, _ in hits if lo <= n <= hi]
        by[f"n{lo}-{hi}"] = {"count": len(s), "accuracy": (sum(s) / len(s)) if s else None}
    roles = {k: round(sum(v) / len(v), 4) for k, v in sorted(role_hits.items())}
    by_family = {f: round(v, 4) for f, v in _by_family([f for _, _, f in hits], [ok for _, ok, _ in hits]).items()}
    return {"accuracy": sum(ok for _, ok, _ in hits) / len(hits), "by_n": by, "by_family": by_family,
            "token_accuracy_by_role": roles}


_STEP_ROLES = ["copy", "copy", "op", "label", "lookup", "lookup", "op", "sum_tens", "sum_units", "eol"]


def token_roles(problem) -> list[str]:
    """Role of every reference response token (characters, then EOS) for diagnostics."""
    roles = []
    for line in task.reference_solution(problem).split("\n"):
        if line.startswith(task.ANSWER_PREFIX):
            roles += ["answer"] * (len(line) + 1)
        else:
            roles += _STEP_ROLES if problem.family == "sum" else [f"{problem.family}_step"] * (len(line) + 1)
    return roles  # the answer line's last slot is the EOS


def _fmt_buckets(r: dict) -> str:
    return " ".join(f"{k}:{v['accuracy']:.2f}" for k, v in r["by_n"].items() if v["accuracy"] is not None)


@torch.no_grad()
def greedy_agreement(policy, draft, tok, problems) -> float:
    """Fraction of the policy's greedy response tokens that the draft's argmax predicts."""
    texts = generate(policy, tok, problems, max_new_tokens=512)
    hit = tot = 0
    for p, t in zip(problems, texts, strict=True):
        pi = tok.encode(p.prompt, add_special_tokens=False)
        ri = tok.encode(t, add_special_tokens=False)
        if not ri:
            continue
        ids = torch.tensor([pi + ri])
        pred = draft(input_ids=ids).logits[0, len(pi) - 1: -1].argmax(-1)
        hit += (pred == ids[0, len(pi):]).sum().item()
        tot += len(ri)
    return hit / max(1, tot)


def save(model, tok, path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    # transformers 5 writes its own class name; the generic one also loads in transformers 4.x.
    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(asset_path("tiny")))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    # lr: 2e-3 left the policy on the loss plateau (no copy/lookup circuits) for 600+ steps
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--token-budget", type=int, default=1024, help="padded tokens per batch")
    ap.add_argument("--policy-max-steps", type=int, default=2500)
    ap.add_argument("--min-steps", type=int, default=400, help="no dev eval / early stop before this step")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument(
        "--target-acc", type=float, default=0.5, help="early stop once the dev greedy exact-match rate reaches this"
    )
    ap.add_argument("--dev-size", type=int, default=200)
    ap.add_argument("--draft-lr", type=float, default=1e-3)
    ap.add_argument("--distill-steps", type=int, default=300)
    ap.add_argument("--digit-fourier-init", type=float, default=0.1,
                    help="amplitude of Fourier digit-embedding init (0 = plain random init)")
    ap.add_argument("--eval-size", type=int, default=200)
    ap.add_argument("--families", type=families_arg, default=("sum",),
                    help=f"comma-separated task families of the problem pool, from {','.join(task.FAMILIES)}")
    ap.add_argument("--init-from", default=None,
                    help="a directory with policy/ and draft/ (an earlier output) to continue training from")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start, cpu_start = time.time(), time.process_time()

    tok = build_tokenizer()
    policy, draft, policy_info, draft_info = train_models(tok, args)

    log(f"evaluating on {args.eval_size} fresh problems (greedy, max_new_tokens=512)")
    fresh = task.make_problems(args.eval_size, EVAL_SEED_BASE + args.seed, args.families)
    pol_eval = evaluate(policy, tok, fresh, max_new_tokens=512)
    log(f"policy greedy accuracy {pol_eval['accuracy']:.3f} by family {pol_eval['by_family']} "
        f"by n {_fmt_buckets(pol_eval)}")
    pol_sample = evaluate(policy, tok, fresh, max_new_tokens=512, do_sample=True, temperature=1.0,
                          seed=args.seed)
    log(f"policy T=1 sample accuracy {pol_sample['accuracy']:.3f} well-formed {pol_sample['well_formed']:.3f}")
    dr_eval = evaluate(draft, tok, fresh, max_new_tokens=512)
    log(f"draft greedy accuracy {dr_eval['accuracy']:.3f} well-formed {dr_eval['well_formed']:.3f}")
    agree = greedy_agreement(policy, draft, tok, fresh[:50])
    log(f"draft argmax agrees with policy greedy tokens: {agree:.3f}")

    lengths = task.length_stats(task.make_problems(2000, LEN_SEED_BASE + args.seed, args.families), tok)
    save(policy, tok, out / "policy")
    save(draft, tok, out / "draft")
    manifest = {
        "script": "tools.train_tiny",
        "script_version": SCRIPT_VERSION,
        "seed": args.seed,
        "args": vars(args) | {"out": None, "init_from": args.init_from and Path(args.init_from).name},
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
        "task": {"families": list(args.families), "min_n": task.MIN_N, "max_n": task.MAX_N,
                 "sort_max_n": task.SORT_MAX_N, "base_max_bits": task.BASE_MAX_BITS,
                 "response_length_tokens": lengths},
        "tokenizer": {"type": "character-level BPE (no merges)", "tokenizer_vocab": len(tok),
                      "model_vocab_size": VOCAB_SIZE},
        "policy": {"arch": POLICY_ARCH, "head_dim": 32, "params": n_params(policy),
                   "training": policy_info,
                   "greedy_eval": pol_eval | {"seed": EVAL_SEED_BASE + args.seed},
                   "sample_t1_eval": pol_sample,
                   "bytes": dir_bytes(out / "policy")},
        "draft": {"arch": DRAFT_ARCH, "head_dim": 32, "params": n_params(draft),
                  "training": draft_info, "greedy_eval": dr_eval,
                  "argmax_agreement_with_policy_greedy": agree,
                  "bytes": dir_bytes(out / "draft")},
        "total_seconds": round(time.time() - t_start, 1),
        "total_cpu_seconds": round(time.process_time() - cpu_start, 1),
    }
    if args.init_from:  # provenance: the run this one continued (its own manifest, nested as written)
        prev = Path(args.init_from) / "MANIFEST.json"
        manifest["continued_from"] = json.loads(prev.read_text()) if prev.exists() else None
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"wrote {out} ({(manifest['policy']['bytes'] + manifest['draft']['bytes']) / 1e6:.2f} MB) "
        f"in {manifest['total_seconds']}s wall, {manifest['total_cpu_seconds']}s CPU")
    return manifest


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
