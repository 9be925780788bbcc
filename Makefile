# The two commands a newcomer runs: `make demo` and `make test`. Each sets itself up.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint e2e bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,dev]'
	touch $(STAMP)

demo: $(STAMP)
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

clean:
	rm -rf $(VENV) build *.egg-info
