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

.PHONY: demo test bench clean browser

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The package alone: all that `plan`, `estimate` and `catalog` need (no torch).
# pip >= 25 first: the pip that Python 3.11's venv brings (23.2) took 56 s to install the dev set uncompiled, most of it
# weighing every file of every release on the index pages (cProfile, 2026-12-07); pip 26.3 takes 21 s.
$(VENV)/.base: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade "pip>=25" || \
	  echo "make: pip >= 25 is not on your index; going on with $$($(BIN)/python -m pip --version) (slower to resolve)"
	$(BIN)/pip install -q -e .
	touch $@

# Tests and later subsystems: pinned torch plus the dev tools.
# --no-compile: pip would compile all 20,000 modules of this set on one core (46 s of CPU); the test and bench runs
# below write the bytecode of the 44% (by size) that they import, once, as they import it (measured 2026-12-07).
$(VENV)/.dev: pyproject.toml constraints-dev.txt $(VENV)/.base
	$(BIN)/pip install -q --no-compile $(TORCH_PIP_ARGS) "torch==$(TORCH_VERSION)"
	$(BIN)/pip install -q --no-compile -c constraints-dev.txt -e ".[dev]"
	# torchtitan's config classes for the recipe tests; without its deps (datasets pins fsspec below ours,
	# wandb, tensorboard): its config needs only tyro and spmd_types from the dev extra
	$(BIN)/pip install -q --no-compile --no-deps -c constraints-dev.txt torchtitan
	# ParallelCluster's own config schema for tests/test_emit_k8s.py; its dependencies (AWS CDK v1, jsii, Flask)
	# serve cluster creation, not loading a config: marshmallow (dev extra), boto3 and PyYAML are all it needs
	$(BIN)/pip install -q --no-compile --no-deps -c constraints-dev.txt aws-parallelcluster
	touch $@

demo: $(VENV)/.base
	$(BIN)/trainready plan --model llama-2-13b --method full --tokens 2e9 --top 5 --save demo-job.toml
	$(BIN)/trainready estimate --job demo-job.toml

# Headless Chromium for tests/test_html_reports.py (Debian's package; they skip, saying so, without one,
# or use TRAINREADY_CHROMIUM=/path/to/chrome). CI installs it before the tests; elsewhere run `make browser`.
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  { $(if $(filter 0,$(shell id -u)),,sudo) apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive $(if $(filter 0,$(shell id -u)),,sudo) apt-get install -y -qq chromium; } || \
	  echo "make browser: could not install chromium; the HTML page tests will skip and say why"

# One worker more than the cores, at most 4 (pytest-xdist): many tests wait (torchrun's start-up and shutdown, moto,
# a kill that waits for a step), and two workers left a third of 2 cores idle (157% CPU; 10 min 52 s, against
# 10 min 3 s with three, measured 2026-12-06). `pytest tests/x.py` alone still runs in one process.
# worksteal: a worker that runs out takes queued tests from the others, so the long torchrun tests do not leave
# a core idle at the end. --durations=10: every run lists its ten slowest tests, the ones to share or shorten.
XDIST_WORKERS = $(or $(shell $(BIN)/python -c 'import os; f = getattr(os, "sched_getaffinity", None); \
  print(min((len(f(0)) if f else os.cpu_count() or 1) + 1, 4))' 2>/dev/null),2)
# Bytecode is written as modules are imported, also where PYTHONDONTWRITEBYTECODE is set (CI images set it): there
# each of the ~300 Python processes the suite starts (launchers, torchrun agents, workers) compiled torch's modules
# again, about 4.5 s of CPU for a worker's imports. The files go to .venv and the checkout's __pycache__ (ignored).
WRITE_BYTECODE := PYTHONDONTWRITEBYTECODE=
test: $(VENV)/.dev $(if $(CI),browser)
	$(WRITE_BYTECODE) $(BIN)/python -m pytest -q -n $(XDIST_WORKERS) --dist worksteal --durations=10

bench: $(VENV)/.dev
	$(WRITE_BYTECODE) $(BIN)/python bench/plan_accuracy.py
	$(WRITE_BYTECODE) $(BIN)/python bench/track_record.py --check
	$(WRITE_BYTECODE) $(BIN)/python bench/plan_speed.py
	$(WRITE_BYTECODE) $(BIN)/python bench/ckpt_bench.py
	$(WRITE_BYTECODE) $(BIN)/python bench/report_html.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis demo-job.toml
