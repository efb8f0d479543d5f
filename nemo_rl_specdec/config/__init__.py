"""Every config module, in one room, bottom to top (each imports only those above it in this list
and the package's lower layers; `tests/unit/test_import_graph.py`):

- `schema`: the block's primitives: `ConfigError`, `PathError`, `Strict` and its key-path error
  lines, the k-by-batch-size table and its lookup, the text cut;
- `yaml_loader`: YAML files with overrides (run files, simulator scenarios, NeMo-RL run files);
- `loader`: the one door for run files: `defaults:` composition, NeMo-RL's checkout found;
- `run`: the run file as validated (`RunConfig`, `load_run_config`) and its
  `speculative_decoding` block (`SpecDecConfig`), built from the drafter registry, with what it
  maps to (vLLM's `speculative_config`, the profile entry that prices it).

This file imports none of them: the drafters import `schema` while `run` imports the drafters.
"""
