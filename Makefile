# Two commands on a fresh machine: `make demo` and `make test`. Both create or refresh .venv
# (CPU torch first where no NVIDIA GPU is present), install mixdiag with its extras, then run.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup system-deps vllm-env test test-fast demo clean-venv

$(STAMP): pyproject.toml setup.py scripts/setup_env.sh
	PY=$(PY) bash scripts/setup_env.sh
	touch $(STAMP)

setup: $(STAMP)

# Debian packages the integration tests drive for real: prometheus, chromium, chromium-driver.
system-deps:
	bash scripts/setup_system.sh

# A real vLLM 0.32 (CPU) in .venv-vllm plus the small offline Llama it serves; the real-vLLM tests
# (tests/vllm) need it. Idempotent: scripts/setup_vllm.sh keeps a stamp (about 4.5 min, 3.4 GB once).
vllm-env:
	PY=$(PY) bash scripts/setup_vllm.sh

test: system-deps vllm-env $(STAMP)
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not browser and not prometheus"

demo: $(STAMP)
	$(BIN)/mixdiag demo --out runs/demo

clean-venv:
	rm -rf $(VENV)
