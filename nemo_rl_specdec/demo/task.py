"""Synthetic verifiable reasoning task for the embedded CPU demo: running sums mod 100.

A problem lists ``n`` two-digit numbers, each tagged with a one-letter label (``a``..``z``,
then ``A``..``N``). The worked solution starts from 00 and adds one labelled number per line,
keeping the running total modulo 100, and ends with an ``answer:`` line::

    prompt:    "add mod 100: a37 b45 c12 d91\n"
    solution:  "00+a37=37\n37+b45=82\n82+c12=94\n94+d91=85\nanswer: 85"

The labels make "which number comes next" a lookup by a unique key, so a ~2 M parameter
model learns the procedure in minutes on one CPU thread; what it gets wrong is carries and
long lists, so errors concentrate on long problems.

Why this task suits speculative decoding experiments:

* verifiable: :func:`verify` reads the final ``answer:`` line of any text;
* long-tailed: ``n`` is drawn from a clipped log-normal, so most responses are short and a
  few are ~6x the median (p99/p50 of response tokens is 5-7 over 2000 problems);
* repetitive per problem: the worked solution is a deterministic function of the problem,
  so a policy's rollouts for the same problem share long spans (suffix drafting helps), and
  errors are local (a wrong step changes the rest of the trajectory, which is what an
  on-policy drafter must track).

Everything here is pure Python (no torch) and deterministic given the seed.
"""
from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from typing import Any

MODULUS = 100
MIN_N = 2
MAX_N = 40
# log-normal over (n - MIN_N): median n = MIN_N + exp(LOG_MU) ~= 5, p99 n ~= 30, cap MAX_N.
LOG_MU = math.log(3.0)
LOG_SIGMA = 1.0
LABELS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
PROMPT_HEADER = f"add mod {MODULUS}:"
ANSWER_PREFIX = "answer:"

_ANSWER_RE = re.compile(r"^\s*answer\s*:\s*([0-9]{1,6})\s*$")


@dataclass
class Problem:
    problem_id: str
    prompt: str
    answer: str
    meta: dict = field(default_factory=dict)


def _fmt(x: int) -> str:
    return f"{x % MODULUS:02d}"


def sample_n(rng: random.Random) -> int:
    """Number of terms: clipped log-normal, long right tail (uses exactly two rng draws)."""
    u1 = rng.random()
    u2 = rng.random()
    z = math.sqrt(-2.0 * math.log(1.0 - u1)) * math.cos(2.0 * math.pi * u2)  # Box-Muller
    n = MIN_N + int(math.floor(math.exp(LOG_MU + LOG_SIGMA * z)))
    return max(MIN_N, min(MAX_N, n))


def make_problem(numbers: list[int], problem_id: str) -> Problem:
    """Build a problem from explicit numbers (each in 10..99; at least two)."""
    if len(numbers) < MIN_N:
        raise ValueError(f"need at least {MIN_N} numbers, got {len(numbers)}")
    if any((not isinstance(x, int)) or x < 10 or x > 99 for x in numbers):
        raise ValueError(f"numbers must be ints in 10..99, got {numbers}")
    if len(numbers) > len(LABELS):
        raise ValueError(f"at most {len(LABELS)} numbers, got {len(numbers)}")
    total = sum(numbers) % MODULUS
    prompt = f"{PROMPT_HEADER} {' '.join(f'{LABELS[i]}{x}' for i, x in enumerate(numbers))}\n"
    return Problem(
        problem_id=problem_id,
        prompt=prompt,
        answer=_fmt(total),
        meta={"numbers": list(numbers), "n": len(numbers), "modulus": MODULUS},
    )


def make_problems(n: int, seed: int) -> list[Problem]:
    """``n`` problems, deterministic in ``seed``; ids ``p{seed}-{i}``.

    Problem ``i`` does not depend on ``n``: ``make_problems(10, s)[:5] == make_problems(5, s)``.
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    rng = random.Random(seed)
    out = []
    for i in range(n):
        k = sample_n(rng)
        numbers = [10 + int(rng.random() * 90) for _ in range(k)]
        out.append(make_problem(numbers, f"p{seed}-{i}"))
    return out


def solution_steps(problem: Problem) -> list[str]:
    nums = problem.meta["numbers"]
    steps = []
    acc = 0
    for i, x in enumerate(nums):
        new = (acc + x) % MODULUS
        steps.append(f"{_fmt(acc)}+{LABELS[i]}{x}={_fmt(new)}")
        acc = new
    return steps


def reference_solution(problem: Problem) -> str:
    """Worked solution: one ``s+Lx=t`` line per number, then ``answer: c`` (no trailing newline)."""
    return "\n".join(solution_steps(problem) + [f"{ANSWER_PREFIX} {problem.answer}"])


def extract_answer(response_text: Any) -> str | None:
    """The number on the final non-empty line if that line is ``answer: <digits>``, else None."""
    if not isinstance(response_text, str):
        return None
    lines = [ln for ln in response_text.splitlines() if ln.strip()]
    if not lines:
        return None
    m = _ANSWER_RE.match(lines[-1])
    return m.group(1) if m else None


def verify(problem: Problem, response_text: str) -> float:
    """1.0 iff the response's final non-empty line is ``answer: X`` with X equal to the answer.

    Leading zeros are ignored (``answer: 2`` == ``answer: 02``). Anything else, including
    non-string input, gets 0.0; this function never raises on model output.
    """
    got = extract_answer(response_text)
    if got is None:
        return 0.0
    return 1.0 if int(got) == int(problem.answer) else 0.0


def _encode_len(tokenizer: Any, text: str) -> int:
    if hasattr(tokenizer, "encode"):
        try:
            ids = tokenizer.encode(text, add_special_tokens=False)
        except TypeError:
            ids = tokenizer.encode(text)
        ids = getattr(ids, "ids", ids)
        return len(ids)
    return len(tokenizer(text))


def _percentile(sorted_vals: list[int], q: float) -> float:
    """Linear-interpolation percentile (same as numpy's default) of a sorted list."""
    if not sorted_vals:
        raise ValueError("empty")
    pos = (len(sorted_vals) - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def length_stats(problems: list[Problem], tokenizer: Any) -> dict:
    """Token-length statistics of the reference responses (EOS not counted) and prompts."""
    resp = sorted(_encode_len(tokenizer, reference_solution(p)) for p in problems)
    prompt = sorted(_encode_len(tokenizer, p.prompt) for p in problems)
    p50 = _percentile(resp, 50)
    p99 = _percentile(resp, 99)
    return {
        "num_problems": len(problems),
        "p50": p50,
        "p90": _percentile(resp, 90),
        "p99": p99,
        "max": resp[-1],
        "mean": sum(resp) / len(resp),
        "ratio": p99 / p50,
        "prompt_max": prompt[-1],
    }


# --------------------------------------------------------------------------- real (chat) models
# The bundled tiny policy was trained on the raw prompt. An instruction-tuned model (SmolLM2,
# configs/smollm2_cpu.yaml) gets the same problem inside its chat template, with an instruction and
# one worked example, and is graded with partial credit: a 135M model rarely gets the final sum
# right, so the exact-answer reward alone would be 0 for nearly every rollout (no GRPO signal).
PROMPT_FORMATS = ("plain", "chat")
REWARDS = ("exact", "steps")
CHAT_INSTRUCTION = "Add the numbers modulo 100, one per line, then write the final line \"answer: N\"."
_STEP_RE = re.compile(r"^\s*(\d{1,4})\s*\+\s*([A-Za-z])(\d{1,4})\s*=\s*(\d{1,4})\s*$")


def chat_prompt_text(problem: Problem) -> str:
    """The user message of the chat format: instruction, one worked example, the problem."""
    ex = make_problem([37, 45, 12, 91], "example")
    return f"{CHAT_INSTRUCTION}\nExample:\n{ex.prompt}{reference_solution(ex)}\n\nNow: {problem.prompt}"


def run_prompt_format(cfg: Any) -> str:
    """The run file's ``demo.prompt_format`` (default ``plain``); a bad value is a ConfigError naming the key."""
    from nemo_rl_specdec.config import ConfigError

    fmt = cfg.get("demo.prompt_format", "plain")
    if fmt not in PROMPT_FORMATS:
        raise ConfigError(f"demo.prompt_format: got {fmt!r}; allowed: {list(PROMPT_FORMATS)}")
    return fmt


def prompt_token_ids(tokenizer: Any, problem: Problem, prompt_format: str = "plain") -> list:
    """The prompt's token ids: ``plain`` is the raw prompt (no special tokens); ``chat`` wraps
    :func:`chat_prompt_text` in the tokenizer's chat template with the assistant turn opened."""
    if prompt_format == "plain":
        return list(tokenizer(problem.prompt, add_special_tokens=False)["input_ids"])
    if prompt_format != "chat":
        raise ValueError(f"prompt_format: got {prompt_format!r}; allowed: {list(PROMPT_FORMATS)}")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("prompt_format 'chat' needs a tokenizer with a chat template")
    text = tokenizer.apply_chat_template([{"role": "user", "content": chat_prompt_text(problem)}],
                                         tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def step_credit(problem: Problem, response_text: Any) -> float:
    """Partial credit for the worked solution's lines, in [0, 1].

    The i-th line of the form ``s+Lx=t`` (other lines are skipped; lines past the problem's ``n``
    are ignored) earns half a point when ``Lx`` is the problem's i-th labelled number and half a
    point when ``t == (s + x) mod 100`` for its own ``s``; the sum is divided by ``n``. A wrong
    running total therefore costs one line, not the rest of the solution.
    """
    if not isinstance(response_text, str):
        return 0.0
    nums = problem.meta["numbers"]
    points = 0.0
    i = 0
    for line in response_text.splitlines():
        if i >= len(nums):
            break
        m = _STEP_RE.match(line)
        if not m:
            continue
        s, label, x, t = m.groups()
        points += 0.5 * (label == LABELS[i] and int(x) == nums[i])
        points += 0.5 * (len(t) <= 2 and int(t) == (int(s) + int(x)) % MODULUS)
        i += 1
    return points / len(nums)


def reward(problem: Problem, response_text: Any, kind: str = "exact") -> float:
    """``exact``: :func:`verify` (0 or 1). ``steps``: half :func:`step_credit`, half :func:`verify`,
    so 1.0 still means a fully correct response and partial progress scores in between."""
    if kind == "exact":
        return verify(problem, response_text)
    if kind != "steps":
        raise ValueError(f"reward: got {kind!r}; allowed: {list(REWARDS)}")
    return 0.5 * step_credit(problem, response_text) + 0.5 * verify(problem, response_text)
