"""The vLLM process patches that need no engine: the benign-warning filter on vLLM's loggers."""
import json
import logging

import pytest

from nemo_rl_specdec.engine import vllm_compat


def _records(logger: logging.Logger) -> list:
    seen: list = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    logger.addHandler(Keep())
    return seen


def test_benign_warnings_are_dropped_and_others_kept():
    lg = logging.getLogger("vllm.specdec_test_compat")
    seen = _records(lg)
    vllm_compat.quiet_benign_vllm_warnings()
    vllm_compat.quiet_benign_vllm_warnings()  # idempotent: one filter per logger
    lg.warning("%s for layer 3", vllm_compat.BENIGN_VLLM_WARNINGS[0])
    lg.warning("KV cache is full")
    assert seen == ["KV cache is full"]
    assert sum(isinstance(f, vllm_compat._BenignVllmWarnings) for f in lg.filters) == 1


def test_loggers_outside_vllm_are_untouched():
    lg = logging.getLogger("specdec_test_not_vllm")
    seen = _records(lg)
    vllm_compat.quiet_benign_vllm_warnings()
    lg.warning(vllm_compat.BENIGN_VLLM_WARNINGS[0])
    assert seen == [vllm_compat.BENIGN_VLLM_WARNINGS[0]]


COMPILED_THEN_REGISTER = (
    "import numba\n"
    "numba.njit(lambda x: x + 1)(1)  # llvmlite.binding.ffi is now in sys.modules\n"
    "from vllm.platforms import current_platform as p\n"
    "{patch}"
    "p.register_triton_kernel_overrides()\n"
    "print('REGISTERED')\n"
)


def _run(code: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)


def test_kernel_registration_survives_a_process_where_numba_has_compiled():
    """vLLM's registration scans every module and crashes on llvmlite's ffi `lib` (what numba leaves
    in sys.modules once it compiled: vLLM's n-gram matcher, our n-gram proposer); an engine started
    after that in the same process (a test session, a bench) failed at start."""
    bare = _run(COMPILED_THEN_REGISTER.format(patch=""))
    ours = _run(COMPILED_THEN_REGISTER.format(
        patch="from nemo_rl_specdec.engine import vllm_compat\nvllm_compat.register_cpu_kernels_once()\n"))
    assert "REGISTERED" in ours.stdout, ours.stderr[-2000:]
    if "REGISTERED" in bare.stdout:
        print("this vLLM's registration no longer trips over llvmlite: the guard is not needed")
    else:
        assert "_lib_fn_wrapper" in bare.stderr, bare.stderr[-2000:]


# --------------------------------------------------------------------------- the hybrid drafter's runner patch

class _Batch:
    def __init__(self, rows: int, width: int = 16):
        import numpy as np

        self.req_ids = [f"r{i}" for i in range(rows)]
        self.vocab_size = 100
        self.token_ids_cpu = np.zeros((rows, width), dtype=np.int32)
        self.num_tokens_no_spec = np.array([3] * rows, dtype=np.int32)


class _Hybrid:
    def __init__(self):
        self.calls = []

    def propose(self, call_model, sched, sampled, counts):
        self.calls.append((sampled, list(counts), call_model()))
        return [[7]] * len(sampled)


def test_drafting_beside_the_model_is_per_runner_and_undone():
    """`draft_beside` routes one runner's drafting through the proposer beside the model's (vLLM's own
    method becomes its model part), leaves the class and other runners as they were, and its undo
    takes it away."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    class Runner(GPUModelRunner):  # vLLM's method on the class, a stand-in for its body
        def __init__(self):
            self.use_async_scheduling, self.input_batch, self.seen = False, _Batch(2), []

        def propose_draft_token_ids(self, *a, **kw):
            self.seen.append(a)
            return "vllm's"

    original = GPUModelRunner.propose_draft_token_ids
    runner, other = Runner(), Runner()
    undo = vllm_compat.draft_beside(runner, _Hybrid())
    assert getattr(runner, vllm_compat.BESIDE).calls == [] and getattr(other, vllm_compat.BESIDE, None) is None
    # after bookkeeping (lists): the proposer beside decides, vLLM's method is its model part
    assert runner.propose_draft_token_ids("sched", [[5], [6]], "more") == [[7], [7]]
    assert getattr(runner, vllm_compat.BESIDE).calls == [([[5], [6]], [3, 3], "vllm's")]
    assert runner.seen == [("sched", [[5], [6]], "more")]
    assert other.propose_draft_token_ids("sched", [[1]]) == "vllm's" and other.seen == [("sched", [[1]])]
    assert GPUModelRunner.propose_draft_token_ids is original and Runner.propose_draft_token_ids is not None
    runner.use_async_scheduling = True
    with pytest.raises(RuntimeError, match="synchronous scheduling"):
        runner.propose_draft_token_ids("sched", [[5], [6]])
    undo()
    assert "propose_draft_token_ids" not in vars(runner) and getattr(runner, vllm_compat.BESIDE) is None
    runner.use_async_scheduling = False
    assert runner.propose_draft_token_ids("s", [[1]]) == "vllm's"


def test_verified_tokens_are_parsed_as_the_bookkeeping_parses_them_and_written_ahead():
    from types import SimpleNamespace

    import numpy as np
    import torch
    from vllm.v1.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID

    batch = _Batch(3)
    discard = SimpleNamespace(np=np.array([False, False, True]))  # row 2: a partial prefill
    runner = SimpleNamespace(input_batch=batch, discard_request_mask=discard)
    p = PLACEHOLDER_TOKEN_ID
    sampled = torch.tensor([[11, 12, 13], [21, p, p], [31, 32, p]])
    lists, counts = vllm_compat.verified_tokens(runner, sampled)
    assert lists == [[11, 12, 13], [21], []]
    assert counts.tolist() == [6, 4, 3] and batch.num_tokens_no_spec.tolist() == [3, 3, 3]  # left to vLLM
    assert batch.token_ids_cpu[0, 3:6].tolist() == [11, 12, 13] and batch.token_ids_cpu[1, 3:5].tolist() == [21, 0]
    one, _ = vllm_compat.verified_tokens(runner, torch.tensor([[4], [5], [6]]))  # a step without drafts
    assert one == [[4], [5], []]


def _spec(**block):
    from nemo_rl_specdec.config.run import SpecDecConfig

    return SpecDecConfig.model_validate({"enabled": True, **block})


def test_the_installed_vllms_facts_are_read_from_its_speculative_config():
    """The real SpeculativeConfig of the vLLM in this Python, in-process and from the source run alone."""
    import subprocess
    import sys

    from vllm.config.speculative import SpeculativeConfig

    facts = vllm_compat.speculative_facts()
    assert "vllm_error" not in facts and facts["python"] == sys.executable
    assert set(facts["fields"]) == set(SpeculativeConfig.__dataclass_fields__)
    assert {"ngram", "draft_model", "suffix"} <= set(facts["methods"])
    script = vllm_compat.SPECULATIVE_FACTS_SOURCE + "\nimport json; print(json.dumps(speculative_facts()))"
    alone = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert json.loads(alone.stdout.splitlines()[-1]) == facts


FACTS_0_20 = {"vllm": "0.20.0", "python": "/venv/bin/python",
              "methods": ["draft_model", "eagle3", "ngram", "suffix"],
              "fields": ["method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"]}


def test_the_engine_fit_refuses_what_the_vllm_lacks_by_key_path():
    from nemo_rl_specdec.config.run import ConfigError

    with pytest.raises(ConfigError, match=r"^policy\.generation\.speculative_decoding\.suffix\.backend: got 'das'.*"
                                          r"vLLM 0\.20\.0 \(/venv/bin/python\) has no custom_class.*0\.25\.1 or later"):
        vllm_compat.fit_speculative_config({"method": "custom_class"}, FACTS_0_20, _spec(drafter="suffix"))
    logged: list = []
    out = vllm_compat.fit_speculative_config(
        {"method": "draft_model", "model": "d", "num_speculative_tokens": 4, "draft_sample_method": "probabilistic"},
        FACTS_0_20, _spec(drafter="draft_model", draft_model={"model": "d"}), log=logged.append)
    assert out == {"method": "draft_model", "model": "d", "num_speculative_tokens": 4}
    assert len(logged) == 1 and "no draft_sample_method: drafts are greedy" in logged[0]
    with pytest.raises(ConfigError, match=r"speculative_decoding: speculative_config would carry \['surprise'\]"):
        vllm_compat.fit_speculative_config({"method": "ngram", "surprise": 1}, FACTS_0_20, _spec(drafter="ngram"))
