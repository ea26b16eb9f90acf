# One entry point for people and CI alike. `make setup` is implied by every target.
VENV := .venv
BIN := $(VENV)/bin

# The test run's processes (pytest-xdist): most tests wait on agents, jobs and servers, so
# 4 keep even a 2-core machine busy (tests/conftest.py says which tests share a worker).
# PYTEST_WORKERS=0 runs them all in this one process.
PYTEST_WORKERS ?= 4

.PHONY: setup system demo test test-durations lint check bench clean

setup:
	@bash scripts/setup-venv

# System packages the tests and the bench need (OpenSSH's server for the SSH transport's
# tests, Chromium, Slurm and munge; rsync for the bench).
system:
	@bash scripts/setup-system

# The demo: train on the embedded local agent, stream the log, pull the SavedModel back.
demo: setup
	$(BIN)/gpuhop run --name digits-demo --pull gpuhop-artifacts/digits-demo examples/digits/train.py

test: setup system
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

# Measure how long each test module (or serial group) takes, into tests/durations.json: the
# order in which `make test` hands them out, the longest first. Run again when modules are
# added or change much; one a run does not list is counted at the median pace.
test-durations: setup system
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --write-durations $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check src tests examples bench
	$(BIN)/ruff format --check src tests examples bench
	$(BIN)/mypy src

check: lint test

bench: setup system
	$(BIN)/python bench/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build dist .pytest_cache .ruff_cache .mypy_cache gpuhop-artifacts
