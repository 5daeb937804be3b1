# placeverify: the two commands of the README quick start, and the checks behind them.
#   make demo   create .venv, install placeverify, check a bundled example
#   make test   create .venv, install placeverify with its test, torch and docs extras, run the tests,
#               build the docs site with --strict
#   make docs   build the docs site (mkdocs.yml, docs/) with --strict into build/site
#   make docs-serve  serve the docs site at http://127.0.0.1:8000
#   make figures     run every benchmark with --docs: each writes its section of the Measured
#                    figures page (docs/figures/<script>.md; hours on a 2-core machine), with
#                    the models extra installed for peak_memory.py's transformers models

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TSTAMP := $(VENV)/.installed-test
MSTAMP := $(VENV)/.installed-models

.PHONY: demo test docs docs-serve figures figures-cuda lint typecheck bench clean

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
	$(BIN)/python -m pip install --quiet -e '.[dev,torch,docs]'
	@touch $@

# transformers (the models extra), for benchmarks/peak_memory.py's models placeverify did not
# write: the figures only, never the tests
$(MSTAMP): $(TSTAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev,torch,docs,models]'
	@touch $@

demo: $(STAMP)
	$(BIN)/placeverify check examples/zero-paper/zero3.place
	$(BIN)/placeverify compare examples/zero-paper/ddp.place examples/zero-paper/zero1.place \
		examples/zero-paper/zero2.place examples/zero-paper/zero3.place

test: $(TSTAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile
	$(BIN)/mkdocs build --strict --quiet

# The docs site: the CLI reference is generated from placeverify.cli (mkdocs-click) at build time.
docs: $(TSTAMP)
	$(BIN)/mkdocs build --strict

docs-serve: $(TSTAMP)
	$(BIN)/mkdocs serve --strict

lint: $(TSTAMP)
	$(BIN)/ruff check placeverify tests benchmarks

typecheck: $(TSTAMP)
	$(BIN)/mypy

bench: $(TSTAMP)
	$(BIN)/python benchmarks/check_latency.py
	$(BIN)/python benchmarks/verify_scaling.py
	$(BIN)/python benchmarks/prove_all.py
	$(BIN)/python benchmarks/measure_table.py

# The Measured figures page (docs/figures.md includes docs/figures/*.md). latency_ab.py compares
# two source trees and is not part of the page.
figures: $(MSTAMP)
	$(BIN)/python benchmarks/check_latency.py -n 3 --docs
	$(BIN)/python benchmarks/verify_scaling.py --docs
	$(BIN)/python benchmarks/prove_all.py --docs
	$(BIN)/python benchmarks/every_size.py --docs
	$(BIN)/python benchmarks/replay_wall_time.py -n 3 --docs
	$(BIN)/python benchmarks/emit_sweep.py --docs
	$(BIN)/python benchmarks/search.py --docs
	$(BIN)/python benchmarks/measure_table.py --docs
	$(BIN)/python benchmarks/step_time.py --shipped --docs
	$(BIN)/python benchmarks/peak_memory.py --docs
	$(BIN)/python benchmarks/peak_memory.py --repeat 29 examples/measure/zero3.place --docs \
		--docs-name zero3-29-runs
	$(BIN)/python benchmarks/budget.py --runs 5 --heap 3000000 --compare --docs
	$(BIN)/python benchmarks/import_sweep.py tests/importers --docs
	$(BIN)/python benchmarks/soundness.py --docs
	$(BIN)/python benchmarks/fuzz.py --count 10000 --seed 0 --budget 5 -j 2 --faults 0.02 --docs
	$(BIN)/python benchmarks/fuzz.py --count 10000 --seed 0 --budget 5 -j 2 --faults 0.02 --load \
		--docs --docs-name load

# The CUDA section of the page: needs a CUDA device.
figures-cuda: $(MSTAMP)
	$(BIN)/python benchmarks/peak_memory.py --device cuda --docs --docs-name cuda

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache .hypothesis
