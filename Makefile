# The two commands a newcomer runs: `make demo` and `make test`. Each sets itself up.
#
# `make demo` installs only what the demo runs (the package and its dependencies); `make test` adds
# the test and development extras. pip reads PIP_FIND_LINKS and PIP_NO_INDEX from the environment:
# .ci/run points both installs at one wheelhouse, so CI downloads each package once.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO_STAMP := $(VENV)/.demo-stamp

.PHONY: demo test lint e2e bench clean

$(BIN)/python:
	@echo "make: creating $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)

# --no-compile: Python compiles what the demo imports when it first imports it; compiling every
# installed module up front (the kubernetes client alone is 126 MB, and local mode never imports it)
# made the install three times slower.
$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	@echo "make demo: installing the gateway and the packages it runs into $(VENV) (the first time only)"
	$(BIN)/python -m pip install --disable-pip-version-check --no-compile -e .
	@echo "make demo: installed"
	touch $@

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,dev]'
	touch $(DEMO_STAMP) $@

demo: $(DEMO_STAMP)
	$(BIN)/aggregator demo $(DEMO_ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check aggregator tests benchmarks
	$(BIN)/mypy aggregator
	$(BIN)/lint-imports --no-cache

# Needs wrk and nginx from Debian: apt-get install wrk nginx-light
bench: $(STAMP)
	@command -v wrk >/dev/null && command -v nginx >/dev/null || { echo "bench: install wrk and nginx (apt-get install wrk nginx-light)"; exit 1; }
	$(BIN)/python benchmarks/discovery.py
	$(BIN)/python benchmarks/proxy.py
	$(BIN)/python benchmarks/auth.py
	$(BIN)/python benchmarks/slow_clients.py
	$(BIN)/python benchmarks/watches.py
	$(BIN)/python benchmarks/scale.py --counts 100,1000
	$(BIN)/python benchmarks/resilience.py

clean:
	rm -rf $(VENV) build *.egg-info
