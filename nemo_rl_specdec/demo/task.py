"""Synthetic verifiable reasoning tasks for the embedded CPU demo: running sums mod 100 (``sum``),
and the ``sort`` and ``base`` families below.

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

Two more families share the pool when a run asks for them (``demo.task_families``; the bundled
run files ask for all three), so that a batch mixes problems whose responses differ in form and
per-problem history matters:

* ``sort``: sort labelled numbers by insertion, one line per inserted number showing the sorted
  list so far, then the labels in order::

    prompt:    "sort: a37 b45 c12\n"
    solution:  "a37\na37 b45\nc12 a37 b45\nanswer: cab"

* ``base``: write a number in base 2 by repeated halving, then the bits, most significant first::

    prompt:    "base 2: 11\n"
    solution:  "11=2*5+1\n5=2*2+1\n2=2*1+0\n1=2*0+1\nanswer: 1011"

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
FAMILIES = ("sum", "sort", "base")
SORT_HEADER = "sort:"
SORT_MAX_N = 10    # an insertion trace has ~2 n^2 tokens: n = 10 is ~230
BASE_HEADER = "base 2:"
BASE_MAX_BITS = 16  # bits of the number to convert: 2..16, drawn like sum's n

_ANSWER_RES = {
    "sum": re.compile(r"^\s*answer\s*:\s*([0-9]{1,6})\s*$"),
    "sort": re.compile(r"^\s*answer\s*:\s*([A-Za-z]{1,52})\s*$"),
    "base": re.compile(r"^\s*answer\s*:\s*([01]{1,32})\s*$"),
}


@dataclass
class Problem:
    problem_id: str
    prompt: str
    answer: str
    meta: dict = field(default_factory=dict)
    family: str = "sum"


def _fmt(x: int) -> str:
    return f"{x % MODULUS:02d}"


def sample_n(rng: random.Random) -> int:
    """Number of terms: clipped log-normal, long right tail (uses exactly two rng draws)."""
    u1 = rng.random()
    u2 = rng.random()
    z = math.sqrt(-2.0 * math.log(1.0 - u1)) * math.cos(2.0 * math.pi * u2)  # Box-Muller
    n = MIN_N + int(math.floor(math.exp(LOG_MU + LOG_SIGMA * z)))
    return max(MIN_N, min(MAX_N, n))


def _check_numbers(numbers: list[int], max_n: int) -> None:
    if len(numbers) < MIN_N:
        raise ValueError(f"need at least {MIN_N} numbers, got {len(numbers)}")
    if any((not isinstance(x, int)) or x < 10 or x > 99 for x in numbers):
        raise ValueError(f"numbers must be ints in 10..99, got {numbers}")
    if len(numbers) > max_n:
        raise ValueError(f"at most {max_n} numbers, got {len(numbers)}")


def _labelled(numbers: list[int]) -> str:
    return " ".join(f"{LABELS[i]}{x}" for i, x in enumerate(numbers))


def make_problem(numbers: list[int], problem_id: str) -> Problem:
    """A ``sum`` problem from explicit numbers (each in 10..99; at least two)."""
    _check_numbers(numbers, len(LABELS))
    total = sum(numbers) % MODULUS
    return Problem(
        problem_id=problem_id,
        prompt=f"{PROMPT_HEADER} {_labelled(numbers)}\n",
        answer=_fmt(total),
        meta={"numbers": list(numbers), "n": len(numbers), "modulus": MODULUS},
    )


def _sort_order(numbers: list[int]) -> list[int]:
    return sorted(range(len(numbers)), key=lambda i: (numbers[i], i))  # stable


def make_sort_problem(numbers: list[int], problem_id: str) -> Problem:
    """A ``sort`` problem from explicit numbers (each in 10..99; 2..SORT_MAX_N of them)."""
    _check_numbers(numbers, SORT_MAX_N)
    return Problem(
        problem_id=problem_id,
        prompt=f"{SORT_HEADER} {_labelled(numbers)}\n",
        answer="".join(LABELS[i] for i in _sort_order(numbers)),
        meta={"numbers": list(numbers), "n": len(numbers)},
        family="sort",
    )


def make_base_problem(value: int, problem_id: str) -> Problem:
    """A ``base`` problem: write ``value`` (2 .. 2**BASE_MAX_BITS - 1) in base 2."""
    if not isinstance(value, int) or not 2 <= value < 2 ** BASE_MAX_BITS:
        raise ValueError(f"value must be an int in 2..{2 ** BASE_MAX_BITS - 1}, got {value!r}")
    return Problem(
        problem_id=problem_id,
        prompt=f"{BASE_HEADER} {value}\n",
        answer=format(value, "b"),
        meta={"value": value, "n": value.bit_length()},
        family="base",
    )


def _draw(rng: random.Random, family: str, problem_id: str) -> Problem:
    n = sample_n(rng)
    if family == "base":
        bits = min(n, BASE_MAX_BITS)
        return make_base_problem(2 ** (bits - 1) + int(rng.random() * 2 ** (bits - 1)), problem_id)
    if family == "sort":
        n = min(n, SORT_MAX_N)
    numbers = [10 + int(rng.random() * 90) for _ in range(n)]
    return (make_sort_problem if family == "sort" else make_problem)(numbers, problem_id)


def check_families(families) -> tuple[str, ...]:
    """``families`` as a tuple; a ValueError names the allowed values."""
    fams = tuple(families) if isinstance(families, (list, tuple)) else None
    if not fams or any(f not in FAMILIES for f in fams) or len(set(fams)) != len(fams):
        raise ValueError(f"got {families!r}; allowed: a non-empty list of distinct values from {list(FAMILIES)}")
    return fams


def make_problems(n: int, seed: int, families=("sum",)) -> list[Problem]:
    """``n`` problems, deterministic in ``seed`` and ``families``; ids ``p{seed}-{i}``.

    With several families each problem's family is drawn uniformly. Problem ``i`` does not
    depend on ``n``: ``make_problems(10, s)[:5] == make_problems(5, s)``.
    """
    if n < 0:
        raise ValueError("n must be >= 0")
    fams = check_families(families)
    rng = random.Random(seed)
    out = []
    for i in range(n):
        fam = fams[0] if len(fams) == 1 else fams[min(int(rng.random() * len(fams)), len(fams) - 1)]
        out.append(_draw(rng, fam, f"p{seed}-{i}"))
    return out


def solution_steps(problem: Problem) -> list[str]:
    """The worked solution's lines before the answer line."""
    if problem.family == "base":
        steps, x = [], problem.meta["value"]
        while x:
            steps.append(f"{x}=2*{x // 2}+{x % 2}")
            x //= 2
        return steps
    nums = problem.meta["numbers"]
    if problem.family == "sort":
        return [" ".join(f"{LABELS[i]}{nums[i]}" for i in _sort_order(nums[: j + 1])) for j in range(len(nums))]
    steps = []
    acc = 0
    for i, x in enumerate(nums):
        new = (acc + x) % MODULUS
        steps.append(f"{_fmt(acc)}+{LABELS[i]}{x}={_fmt(new)}")
        acc = new
    return steps


def reference_solution(problem: Problem) -> str:
    """Worked solution: the steps, one per line, then ``answer: ...`` (no trailing newline)."""
    return "\n".join(solution_steps(problem) + [f"{ANSWER_PREFIX} {problem.answer}"])


def extract_answer(response_text: Any, family: str = "sum") -> str | None:
    """The answer on the final non-empty line if that line is ``answer: X`` with X of the family's
    form (sum: digits; sort: labels; base: bits), else None."""
    if not isinstance(response_text, str):
        return None
    lines = [ln for ln in response_text.splitlines() if ln.strip()]
    if not lines:
        return None
    m = _ANSWER_RES[family].match(lines[-1])
    return m.group(1) if m else None


def verify(problem: Problem, response_text: str) -> float:
    """1.0 iff the response's final non-empty line is ``answer: X`` with X equal to the answer.

    For ``sum`` leading zeros are ignored (``answer: 2`` == ``answer: 02``); the other families
    compare exactly. Anything else, including non-string input, gets 0.0; this function never
    raises on model output.
    """
    got = extract_answer(response_text, problem.family)
    if got is None:
        return 0.0
    if problem.family == "sum":
        return 1.0 if int(got) == int(problem.answer) else 0.0
    return 1.0 if got == problem.answer else 0.0


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
    """The user message of the chat format: instruction, one worked example, the problem (``sum`` only)."""
    if problem.family != "sum":
        raise ValueError(f"the chat prompt format covers the sum family only, got a {problem.family!r} problem")
    ex = make_problem([37, 45, 12, 91], "example")
    return f"{CHAT_INSTRUCTION}\nExample:\n{ex.prompt}{reference_solution(ex)}\n\nNow: {problem.prompt}"


def run_prompt_format(cfg: Any) -> str:
    """The run file's ``demo.prompt_format`` (default ``plain``); a bad value is a ConfigError naming the key."""
    from nemo_rl_specdec.config.run import ConfigError

    fmt = cfg.get("demo.prompt_format", "plain")
    if fmt not in PROMPT_FORMATS:
        raise ConfigError(f"demo.prompt_format: got {fmt!r}; allowed: {list(PROMPT_FORMATS)}")
    return fmt


def run_task_families(cfg: Any) -> tuple[str, ...]:
    """The run file's ``demo.task_families`` (default ``[sum]``); a bad value is a ConfigError naming
    the key. The chat format and the ``steps`` reward are written for ``sum`` and refuse the others."""
    from nemo_rl_specdec.config.run import ConfigError

    kind = run_reward(cfg)
    raw = cfg.get("demo.task_families", ["sum"])
    try:
        fams = check_families(list(raw) if not isinstance(raw, str) and hasattr(raw, "__iter__") else raw)
    except ValueError as e:
        raise ConfigError(f"demo.task_families: {e}") from None
    if fams != ("sum",):
        if run_prompt_format(cfg) != "plain":
            raise ConfigError(f"demo.task_families: got {list(fams)} with demo.prompt_format "
                              f"{cfg.get('demo.prompt_format')!r}; the chat format covers ['sum'] only")
        if kind != "exact":
            raise ConfigError(f"demo.task_families: got {list(fams)} with demo.reward {cfg.get('demo.reward')!r}; "
                              "the steps reward covers ['sum'] only, allowed with other families: 'exact'")
    return fams


def run_reward(cfg: Any) -> str:
    """The run file's ``demo.reward`` (default ``exact``); a bad value is a ConfigError naming the key."""
    from nemo_rl_specdec.config.run import ConfigError

    kind = cfg.get("demo.reward", "exact")
    if kind not in REWARDS:
        raise ConfigError(f"demo.reward: got {kind!r}; allowed: {list(REWARDS)}")
    return kind


def run_problems(cfg: Any, n: int, seed: int) -> list[Problem]:
    """``n`` problems of the run file's ``demo.task_families`` (:func:`make_problems`)."""
    return make_problems(n, seed, run_task_families(cfg))


def run_requests(cfg: Any, tokenizer: Any, problems: list[Problem], samples: int) -> list:
    """``samples`` requests per problem, in order, prompted in the run file's ``demo.prompt_format``."""
    from nemo_rl_specdec.rollouts import Request

    fmt = run_prompt_format(cfg)
    return [Request(prompt_token_ids(tokenizer, p, fmt), problem_id=p.problem_id)
            for p in problems for _ in range(samples)]


def run_rewards(cfg: Any, tokenizer: Any, problems: list[Problem], rollouts: list, samples: int) -> list[float]:
    """The run file's ``demo.reward`` of each rollout of :func:`run_requests` (rollout i answers
    ``problems[i // samples]``)."""
    kind = run_reward(cfg)
    return [reward(problems[i // samples], tokenizer.decode(r.token_ids, skip_special_tokens=True), kind)
            for i, r in enumerate(rollouts)]


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
    if problem.family != "sum":
        raise ValueError(f"step credit covers the sum family only, got a {problem.family!r} problem")
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
