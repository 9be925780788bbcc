# The two commands a newcomer runs: `make demo` and `make test`. Each sets itself up.
#
# `make demo` installs only what the demo runs (the gateway, the sample extension API server in
# samples/wardle, and their dependencies: not the kubernetes client, the `kube` extra that only kube
# mode imports); `make test` adds the test extra (which takes the kube extra: the tests run kube
# mode too) and the development extra. pip reads PIP_FIND_LINKS and PIP_NO_INDEX from the environment:
# .ci/run points both installs at one wheelhouse, so CI downloads each package once.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEMO_STAMP := $(VENV)/.demo-stamp
# The sample extension API server: a package of its own, never inside the gateway's wheel.
SAMPLE := samples/wardle
# The compiled HTTP/2 header callback (setup.py builds it into the package at install; optional:
# without a C compiler the install goes on and Python collects header blocks).
NATIVE := setup.py native/h2blocks.c native/h2blocks_build.py

.PHONY: demo test lint e2e bench clean

$(BIN)/python:
	@echo "make: creating $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)

# --no-compile: Python compiles what the demo imports when it first imports it, not every installed
# module up front.
$(DEMO_STAMP): pyproject.toml $(NATIVE) $(SAMPLE)/pyproject.toml | $(BIN)/python
	@echo "make demo: installing the gateway, the sample server and the packages they run into $(VENV) (the first time only)"
	$(BIN)/python -m pip install --disable-pip-version-check --no-compile -e . -e $(SAMPLE)
	@echo "make demo: installed"
	touch $@

$(STAMP): pyproject.toml $(NATIVE) $(SAMPLE)/pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,dev]' -e $(SAMPLE)
	touch $(DEMO_STAMP) $@

demo: $(DEMO_STAMP)
	$(BIN)/aggregator demo $(DEMO_ARGS)

# The suite runs on TEST_WORKERS processes (pytest-xdist), whole modules at a time, the longest
# first (tests/conftest.py). Most tests wait on sockets and subprocesses, so more workers than
# cores pays: see docs/development.md for the measurements behind the default.
# PYTHONDONTWRITEBYTECODE is dropped for the run: every worker and every gateway subprocess would
# otherwise compile (and assert-rewrite) the same modules again, about 5 s of CPU per worker.
TEST_WORKERS ?= 4

test: $(STAMP)
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check aggregator $(SAMPLE) tests benchmarks
	$(BIN)/mypy aggregator $(SAMPLE)/sample_apiserver tests benchmarks
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
