# placeverify: the two commands of the README quick start, and the checks behind them.
#   make demo   create .venv, install placeverify, check a bundled example
#   make test   create .venv, install placeverify with its test and torch extras, run the tests

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TSTAMP := $(VENV)/.installed-test

.PHONY: demo test lint typecheck bench clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "placeverify needs Python 3.11 or newer"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Byte-compile the package: an editable install does not, and without .pyc files every run of
# placeverify recompiles it (PYTHONDONTWRITEBYTECODE environments never write them).
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e .
	$(BIN)/python -m compileall -q placeverify
	@touch $@

# torch is pinned: an unpinned torch pulls a multi-GB CUDA build.
$(TSTAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev,torch]'
	@touch $@

demo: $(STAMP)
	$(BIN)/placeverify check examples/zero-paper/zero3.place
	$(BIN)/placeverify compare examples/zero-paper/ddp.place examples/zero-paper/zero1.place \
		examples/zero-paper/zero2.place examples/zero-paper/zero3.place

test: $(TSTAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

lint: $(TSTAMP)
	$(BIN)/ruff check placeverify tests benchmarks

typecheck: $(TSTAMP)
	$(BIN)/mypy

bench: $(TSTAMP)
	$(BIN)/python benchmarks/check_latency.py
	$(BIN)/python benchmarks/verify_scaling.py
	$(BIN)/python benchmarks/prove_all.py
	$(BIN)/python benchmarks/measure_table.py

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache .hypothesis
