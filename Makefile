# Quick start: `make demo` (set-up + the main job) and `make test` (set-up + all tests).
# Only Python 3.11+ and pip are needed; everything else goes into .venv.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# Dev/CI pin: the CPU build of this release installs from local disk on our machines.
TORCH_VERSION := 2.13.0
# Point pip at a CPU-only index elsewhere (e.g. https://download.pytorch.org/whl/cpu) to
# avoid the multi-GB CUDA build; pip's own settings (PIP_INDEX_URL, pip.conf) also apply.
TORCH_INDEX_URL ?=
TORCH_PIP_ARGS := $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL) --extra-index-url https://pypi.org/simple,)

.PHONY: demo test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The package alone: all that `plan`, `estimate` and `catalog` need (no torch).
$(VENV)/.base: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

# Tests and later subsystems: pinned torch plus the dev tools.
$(VENV)/.dev: pyproject.toml constraints-dev.txt $(VENV)/.base
	$(BIN)/pip install -q $(TORCH_PIP_ARGS) "torch==$(TORCH_VERSION)"
	$(BIN)/pip install -q -c constraints-dev.txt -e ".[dev]"
	# torchtitan's config classes for the recipe tests; without its deps (datasets pins fsspec below ours,
	# wandb, tensorboard): its config needs only tyro and spmd_types from the dev extra
	$(BIN)/pip install -q --no-deps -c constraints-dev.txt torchtitan
	touch $@

demo: $(VENV)/.base
	$(BIN)/trainready plan --model llama-2-13b --method full --tokens 2e9 --top 5 --save demo-job.toml
	$(BIN)/trainready estimate --job demo-job.toml

test: $(VENV)/.dev
	$(BIN)/python -m pytest -q

bench: $(VENV)/.dev
	$(BIN)/python bench/plan_accuracy.py
	$(BIN)/python bench/plan_speed.py
	$(BIN)/python bench/ckpt_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis demo-job.toml
