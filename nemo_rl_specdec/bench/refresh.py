"""Bench suite `refresh`: the DAS drafter refresh at NeMo-RL scale, transport and rebuild, on Ray.

    nemo-rl-specdec bench configs/tiny_cpu.yaml --suite refresh --json OUT.json [bench.refresh.KEY=VALUE ...]

No model and no vLLM: ``engines`` Ray actors stand in for NeMo-RL's vLLM engines, each holding a real
:class:`~nemo_rl_specdec.drafters.machinery.store.RolloutStore` built from the run's ``suffix`` settings
(``window_steps``, ``scope``, ``max_tree_depth``, ``max_memory_mb``). Each step (one refit):

1. every engine "generates" its share of the step's synthetic rollouts (sample s of problem p on
   engine (p + s) mod engines: a problem's siblings land on different engines, as placement does);
2. transport, both ways side by side, every engine receiving the WHOLE step:
   - ``new``: each engine packs its share into a :class:`~nemo_rl_specdec.rollouts.RolloutBatch`
     (prompt tail ``max_tree_depth - 1``) and ``ray.put``\\ s it once; every engine gets the list of
     all refs, ``ray.get``\\ s them (numpy from the object store) and concatenates;
   - ``old``: the driver holds the step as dicts of Python int lists and sends them to every engine
     as actor-call arguments (what ``collective_rpc`` args cost: one pickle per engine call).
   Both are timed on the driver's clock from the first call until the last engine holds the step
   (``time.monotonic`` is system-wide on Linux); both are checked to round-trip exactly (a digest
   of every token, offset, prompt length, version and problem id, computed outside the timing);
3. every engine runs ``RolloutStore.rebuild(batch, version)`` at the same time; wall and CPU time
   (the actor thread's) are measured in the engine.

Reported per step: transport seconds old and new and their ratio, rebuild seconds per engine (max
and median, wall and CPU), store bytes per engine (``store.stats()``) against ``suffix.max_memory_mb``,
the share of the step the store kept, window and memory evictions, and refresh = new transport +
slowest rebuild (``refresh_s``). With fewer cores than
engines the engines' wall times include waiting for a core; the CPU column is what an engine
with a core of its own would take.

Synthetic rollouts (deterministic from ``seed``, step, problem and sample; vocabulary ``vocab``):
a global bank of short "phrases" (3-12 tokens, shared by all problems: boilerplate reasoning) and,
per problem, its own phrase bank and prompt. A problem's *template* response is a run of phrases
(70% from its own bank, 30% global). Each sample walks the template in segments of geometric
length (mean ``segment``): a segment is copied from the template with probability ``share`` (the
template cursor then drifts by a few tokens, so siblings re-align at shifted offsets), otherwise
replaced by fresh phrases (a branch); ``mutation`` of the tokens are then replaced at random.
Siblings of a problem therefore share long spans, different problems share only short phrases.
Problems differ from step to step.

Run-file knobs, under ``bench.refresh`` (all optional): ``rollouts`` (2048), ``problems`` (512;
must divide ``rollouts``), ``tokens`` (8000 response tokens per rollout), ``prompt_tokens`` (512),
``engines`` (4), ``steps`` (3, at least 2), ``vocab`` (32000), ``share`` (0.8), ``segment`` (160),
``mutation`` (0.005), ``seed`` (0), ``object_store_mb`` (2048).
"""
from __future__ import annotations

import functools
import hashlib
import os
import statistics
import time
from typing import Any

import numpy as np

from nemo_rl_specdec.bench import say, suite_options
from nemo_rl_specdec.config.run import ConfigError

# what every result dict carries (the dispatcher checks it; this suite measures no drafter)
REQUIRED = ("name", "transport_old_s", "transport_new_s", "transport_ratio", "rebuild_s_max",
            "rebuild_s_median", "store_bytes_per_engine", "max_memory_bytes", "refresh_s")
PHRASES_GLOBAL = 4096
PHRASES_PER_PROBLEM = 256
PHRASE_LEN = (3, 12)
OWN_BANK_P = 0.7

DEFAULTS = {"rollouts": 2048, "problems": 512, "tokens": 8000, "prompt_tokens": 512, "engines": 4, "steps": 3,
            "vocab": 32000, "share": 0.8, "segment": 160, "mutation": 0.005, "seed": 0,
            "object_store_mb": 2048}
INTS = ("rollouts", "problems", "tokens", "prompt_tokens", "engines", "steps", "vocab", "segment", "seed",
        "object_store_mb")


_say = functools.partial(say, "refresh")

def options(cfg) -> dict:
    """The suite's settings from ``bench.refresh`` (defaults above) and the run's ``suffix`` block."""
    b = suite_options(cfg, "refresh", f"a mapping of {sorted(DEFAULTS)}", known=DEFAULTS)
    o = {**DEFAULTS, **b}
    for k in INTS:
        if isinstance(o[k], bool) or not isinstance(o[k], int):
            raise ConfigError(f"bench.refresh.{k}: got {o[k]!r}; allowed: an int")
    for k in ("share", "mutation"):
        if isinstance(o[k], bool) or not isinstance(o[k], (int, float)):
            raise ConfigError(f"bench.refresh.{k}: got {o[k]!r}; allowed: a number")
        o[k] = float(o[k])
    lows = {"rollouts": 1, "problems": 1, "tokens": 1, "prompt_tokens": 0, "engines": 1, "steps": 2, "vocab": 2,
            "segment": 1, "seed": 0, "object_store_mb": 128}
    for k, lo in lows.items():
        if o[k] < lo:
            why = " (a second refresh is what includes eviction)" if k == "steps" else ""
            raise ConfigError(f"bench.refresh.{k}: got {o[k]}; allowed: >= {lo}{why}")
    if o["rollouts"] % o["problems"]:
        raise ConfigError(f"bench.refresh.rollouts: got {o['rollouts']} for {o['problems']} problems; allowed: a "
                          "multiple of bench.refresh.problems (every problem has the same number of samples)")
    for k in ("share", "mutation"):
        if not 0.0 <= o[k] <= 1.0:
            raise ConfigError(f"bench.refresh.{k}: got {o[k]}; allowed: 0 <= x <= 1")
    s = cfg.spec.suffix
    o["samples"] = o["rollouts"] // o["problems"]
    o["suffix"] = {"window_steps": s.window_steps, "scope": s.scope, "max_tree_depth": s.max_tree_depth,
                   "max_memory_mb": s.max_memory_mb}
    return o


# --------------------------------------------------------------------------- synthetic rollouts
class _Bank:
    """Phrases as one flat array plus offsets, so a run of phrases is one gather."""

    def __init__(self, rng: np.random.Generator, n: int, vocab: int):
        lens = rng.integers(PHRASE_LEN[0], PHRASE_LEN[1] + 1, n)
        self.flat = rng.integers(0, vocab, int(lens.sum()), dtype=np.int32)
        self.starts = np.concatenate([[0], np.cumsum(lens)])
        self.mean = float(lens.mean())


def _phrases(rng: np.random.Generator, n: int, own: _Bank, common: _Bank) -> np.ndarray:
    """`n` tokens of phrases, each from the problem's own bank with probability OWN_BANK_P."""
    out, total = [], 0
    while total < n:
        k = int((n - total) / min(own.mean, common.mean)) + 1
        mine = rng.random(k) < OWN_BANK_P
        for use_own in mine:
            b = own if use_own else common
            j = int(rng.integers(len(b.starts) - 1))
            ph = b.flat[b.starts[j]:b.starts[j + 1]]
            out.append(ph)
            total += len(ph)
            if total >= n:
                break
    return np.concatenate(out)[:n] if out else np.zeros(0, np.int32)


def common_bank(o: dict) -> _Bank:
    return _Bank(np.random.default_rng([o["seed"], 0xB0]), PHRASES_GLOBAL, o["vocab"])


def problem_template(o: dict, step: int, p: int, common: _Bank):
    """(problem id, prompt tokens, own bank, template response) of problem `p` at `step`."""
    from nemo_rl_specdec.rollouts import problem_id

    rng = np.random.default_rng([o["seed"], step, p])
    own = _Bank(rng, PHRASES_PER_PROBLEM, o["vocab"])
    prompt = rng.integers(0, o["vocab"], o["prompt_tokens"], dtype=np.int32)
    template = _phrases(rng, o["tokens"], own, common)
    return problem_id(prompt), prompt, own, template


def sample(o: dict, step: int, p: int, s: int, own: _Bank, common: _Bank, template: np.ndarray) -> np.ndarray:
    """Response of sample `s` of problem `p`: template segments kept (share) or branched, then mutated."""
    rng = np.random.default_rng([o["seed"], step, p, s, 1])
    n, parts, pos, total = o["tokens"], [], 0, 0
    while total < n:
        m = int(rng.geometric(1.0 / o["segment"]))
        if rng.random() < o["share"]:
            seg = template[pos:pos + m]
            if len(seg) < m:
                seg = np.concatenate([seg, _phrases(rng, m - len(seg), own, common)])
        else:
            seg = _phrases(rng, m, own, common)
        parts.append(seg)
        total += m
        pos = max(0, pos + m + int(rng.integers(-8, 9)))
    out = np.concatenate(parts)[:n].copy()
    hit = rng.random(n) < o["mutation"]
    out[hit] = rng.integers(0, o["vocab"], int(hit.sum()), dtype=np.int32)
    return out


def step_records(o: dict, step: int, shard: int, shards: int, common: _Bank | None = None) -> list:
    """RolloutRecords of `step` (policy version step - 1) that engine `shard` of `shards` generated.
    Rollout i is sample s = i // problems of problem p = i % problems and lands on engine (p + s) mod
    shards, so a problem's siblings are spread over the engines."""
    from nemo_rl_specdec.rollouts import RolloutRecord

    common = common or common_bank(o)
    recs, templates = [], {}
    for i in range(o["rollouts"]):
        p, s = i % o["problems"], i // o["problems"]
        if (p + s) % shards != shard:
            continue
        if p not in templates:
            templates[p] = problem_template(o, step, p, common)
        pid, prompt, own, template = templates[p]
        recs.append(RolloutRecord(pid, prompt, sample(o, step, p, s, own, common, template), step - 1))
    return recs


def digest(batch) -> str:
    """Digest of everything a batch carries (tokens, offsets, prompt lengths, versions, problem ids)."""
    h = hashlib.blake2b(digest_size=16)
    for a in (batch.tokens, batch.starts, batch.prompt_lens, batch.versions):
        h.update(np.ascontiguousarray(a).view(np.uint8))
    h.update("\0".join("" if p is None else p for p in batch.problem_ids).encode())
    return h.hexdigest()


def rows_to_batch(rows: list):
    """The old path's dicts of Python lists, as a RolloutBatch (for the round-trip digest only)."""
    from nemo_rl_specdec.rollouts import RolloutBatch

    return RolloutBatch.pack(rows)


# --------------------------------------------------------------------------- the engine actor
class EngineActor:
    """One engine process: produces its share of a step, receives the whole step, rebuilds its store."""

    def __init__(self, index: int, o: dict):
        from nemo_rl_specdec.drafters.machinery.store import RolloutStore

        s = o["suffix"]
        self.index, self.o = index, o
        self.store = RolloutStore(window_steps=s["window_steps"], scope=s["scope"],
                                  max_tree_depth=s["max_tree_depth"], max_memory_bytes=s["max_memory_mb"] * 2**20)
        self.common = common_bank(o)
        self.records: list = []
        self.batch = None

    def generate(self, step: int) -> int:
        self.records = step_records(self.o, step, self.index, self.o["engines"], self.common)
        self.batch = None
        return len(self.records)

    def lists(self) -> list:
        """This engine's share as the old adapter sent it: dicts of Python int lists."""
        return [{"problem_id": r.problem_id, "prompt_token_ids": r.prompt_token_ids.tolist(),
                 "token_ids": r.token_ids.tolist(), "policy_version": r.policy_version} for r in self.records]

    def put(self) -> list:
        """New path, producer side: pack once (prompt tail only), ray.put once. Returns [ref, seconds]."""
        import ray

        from nemo_rl_specdec.rollouts import RolloutBatch

        t0 = time.monotonic()
        ref = ray.put(RolloutBatch.pack(self.records, prompt_tail=self.store.prompt_tail))
        return [ref, time.monotonic() - t0]

    def get(self, refs: list) -> list:
        """New path, engine side: fetch every producer's batch, concatenate. Returns [done at, digest]."""
        import ray

        from nemo_rl_specdec.rollouts import RolloutBatch

        self.batch = RolloutBatch.concat(ray.get(refs))
        done = time.monotonic()
        return [done, digest(self.batch)]

    def take_lists(self, rows: list) -> list:
        """Old path, engine side: the rows arrived deserialized. Returns [arrived at, digest] (digest
        taken after the timestamp, with the prompts cut to the tail the store keeps)."""
        arrived = time.monotonic()
        tail = self.store.prompt_tail
        for r in rows:
            r["prompt_token_ids"] = r["prompt_token_ids"][max(0, len(r["prompt_token_ids"]) - tail):]
        return [arrived, digest(rows_to_batch(rows))]

    def rebuild(self, version: int) -> dict:
        t0, c0 = time.monotonic(), time.thread_time()
        added = self.store.rebuild(self.batch, version)
        wall, cpu = time.monotonic() - t0, time.thread_time() - c0
        st = self.store.stats()
        return {"engine": self.index, "added": added, "rebuild_s": wall, "rebuild_cpu_s": cpu, "stats": st,
                "rss_mb": _rss_mb()}

    def coverage(self, version: int) -> dict:
        """Per problem id: stored entries of `version`, in the problem tree and in any tree."""
        out: dict = {}
        for e in self.store.entries(version=version):
            c = out.setdefault(e.problem_id, [0, 0])
            c[0] += int(e.in_problem_tree)
            c[1] += 1
        return out

    def speculate(self, context: list, problem_id: str | None, k: int) -> list:
        d = self.store.speculate(np.asarray(context, dtype=np.int32), problem_id, k, 100.0, 0.0)
        return list(d.token_ids)


def _rss_mb() -> float:
    try:
        with open(f"/proc/{os.getpid()}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


# --------------------------------------------------------------------------- the run
def start_engines(o: dict):
    """Start Ray (if not running) and the engine actors."""
    import ray

    if not ray.is_initialized():
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = os.pathsep.join([root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        ray.init(num_cpus=max(1, o["engines"]), include_dashboard=False, log_to_driver=False,
                 object_store_memory=o["object_store_mb"] * 2**20,
                 runtime_env={"env_vars": {"PYTHONPATH": path, "OMP_NUM_THREADS": "1"}})
    cls = ray.remote(num_cpus=1)(EngineActor)
    return [cls.remote(i, o) for i in range(o["engines"])]


def refresh_step(engines: list, o: dict, step: int) -> dict:
    """One refit: generate, transport old and new (checked), rebuild everywhere. Returns the row."""
    import ray

    n = sum(ray.get([e.generate.remote(step) for e in engines]))
    shares = ray.get([e.lists.remote() for e in engines])
    rows = [r for share in shares for r in share]
    del shares
    expect = digest(rows_to_batch([{**r, "prompt_token_ids": r["prompt_token_ids"][
        max(0, len(r["prompt_token_ids"]) - (o["suffix"]["max_tree_depth"] - 1)):]} for r in rows]))

    # old: the whole step as call arguments, once per engine
    t0 = time.monotonic()
    got = ray.get([e.take_lists.remote(rows) for e in engines])
    old_s = max(t for t, _ in got) - t0
    old_ok = all(d == expect for _, d in got)
    del rows, got

    # new: one ray.put per producer, every engine gets every ref
    t0 = time.monotonic()
    put = ray.get([e.put.remote() for e in engines])
    refs = [r for r, _ in put]
    got = ray.get([e.get.remote(refs) for e in engines])
    new_s = max(t for t, _ in got) - t0
    new_ok = all(d == expect for _, d in got)
    if not (old_ok and new_ok):
        raise RuntimeError(f"refresh step {step}: transport did not round-trip (old ok={old_ok}, new ok={new_ok})")

    put_s = max(s for _, s in put)
    del refs, put
    reps = ray.get([e.rebuild.remote(step) for e in engines])
    walls = [r["rebuild_s"] for r in reps]
    cpus = [r["rebuild_cpu_s"] for r in reps]
    mem = [r["stats"]["bytes"] for r in reps]
    cap = o["suffix"]["max_memory_mb"] * 2**20
    kept = [r["stats"]["entries_by_version"].get(str(step - 1), 0) / n for r in reps]
    refresh_cpu = new_s + max(cpus)
    return {
        "name": f"refresh step {step}", "step": step, "policy_version": step, "rollouts": n,
        "tokens": n * o["tokens"], "engines": len(engines),
        "transport_old_s": old_s, "transport_new_s": new_s, "transport_ratio": old_s / new_s,
        "producer_put_s_max": put_s,
        "transport_roundtrip_ok": True,
        "rebuild_s_max": max(walls), "rebuild_s_median": statistics.median(walls),
        "rebuild_cpu_s_max": max(cpus), "rebuild_cpu_s_median": statistics.median(cpus),
        "store_bytes_max": max(mem), "store_bytes_per_engine": mem, "max_memory_bytes": cap,
        "memory_within_cap": all(m <= cap for m in mem),
        "kept_fraction_min": min(kept), "entries_max": max(r["stats"]["entries"] for r in reps),
        "evicted_window": max(r["stats"]["evicted_window"] for r in reps),
        "evicted_memory": max(r["stats"]["evicted_memory"] for r in reps),
        "rss_mb_max": max(r["rss_mb"] for r in reps),
        "refresh_s": refresh_cpu, "refresh_wall_s": new_s + max(walls),
        "per_engine": [{k: v for k, v in r.items() if k != "stats"} | {"bytes": r["stats"]["bytes"],
                                                                       "entries": r["stats"]["entries"]}
                       for r in reps],
    }


# (header, key): transport old/new seconds and ratio; rebuild wall/CPU seconds, slowest and median
# engine; store MB (largest engine) and cap; share of the step kept; evictions; refresh = new transport
# + slowest rebuild CPU (wall: + slowest rebuild wall, cores shared)
TABLE = [("step", "step"), ("n", "rollouts"), ("old s", "transport_old_s"), ("new s", "transport_new_s"),
         ("old/new", "transport_ratio"), ("rb max", "rebuild_s_max"), ("rb med", "rebuild_s_median"),
         ("cpu max", "rebuild_cpu_s_max"), ("cpu med", "rebuild_cpu_s_median"), ("MB", "store_mb_max"),
         ("cap MB", "cap_mb"), ("kept", "kept_fraction_min"), ("ev win", "evicted_window"),
         ("ev mem", "evicted_memory"), ("refresh", "refresh_s"), ("wall", "refresh_wall_s")]


def run(cfg, args, engines: Any = None) -> list:
    """Run the suite; `engines` (already started actors) is for tests that inspect the stores after."""
    import ray

    from nemo_rl_specdec.bench import print_table

    o = options(cfg)
    _say(f"{o['rollouts']} rollouts x {o['tokens']} tokens, {o['problems']} problems, {o['engines']} engines, "
         f"{o['steps']} steps; suffix {o['suffix']}")
    own = engines is None
    engines = start_engines(o) if own else engines
    results = []
    try:
        for step in range(1, o["steps"] + 1):
            row = refresh_step(engines, o, step)
            _say(f"step {step}: transport old {row['transport_old_s']:.2f}s new {row['transport_new_s']:.2f}s, "
                 f"rebuild max {row['rebuild_s_max']:.2f}s (cpu {row['rebuild_cpu_s_max']:.2f}s), "
                 f"store {row['store_bytes_max'] / 2**20:.0f} MB, kept {row['kept_fraction_min']:.1%}")
            results.append(row)
    finally:
        if own:
            for e in engines:
                ray.kill(e)
            ray.shutdown()
    for r in results:
        r["store_mb_max"] = r["store_bytes_max"] / 2**20
        r["cap_mb"] = r["max_memory_bytes"] / 2**20
    print_table([{h: r[k] for h, k in TABLE} for r in results], [h for h, _ in TABLE])
    return results
