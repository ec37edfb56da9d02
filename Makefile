# retry-engine: the two commands a newcomer needs are `make run` and `make test`.
# Both create ./.venv and install what they need on first use.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONFIG ?= conf/retry-engine.toml
PYTEST_ARGS ?=

.PHONY: help venv check-env run demo test test-fast lint bench bench-quick bench-io clean

help:
	@echo "make run    - run the retry engine on the embedded default (local Spark, tables under ./data/lake)"
	@echo "make demo   - engine + producer + a flaky consumer on ./data/demo for about a minute"
	@echo "make test   - run the whole test suite (unit + integration + slow end-to-end)"
	@echo "make lint   - ruff and mypy"
	@echo "make bench  - the engine's benchmark table (ratios measured side by side; BENCH_ARGS=--quick for a smoke run)"

$(STAMP): setup.cfg pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "retry-engine needs Python 3.11 or newer (found %s)" % sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

check-env: venv
	@$(PY) -c 'from retry_engine.session import require_java; require_java()' || \
	  { echo "Java 17 or newer is required (Debian: apt-get install openjdk-17-jre-headless)"; exit 1; }

run: check-env
	$(PY) jobs/run_engine.py --config $(CONFIG)

demo: check-env
	$(VENV)/bin/retry-engine demo --lake ./data/demo

test: check-env
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: check-env
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check retry_engine schemas jobs tests bench
	$(VENV)/bin/mypy retry_engine schemas

BENCH_ARGS ?=

bench: check-env
	$(PY) bench/bench_engine.py $(BENCH_ARGS)

bench-quick: check-env
	$(PY) bench/bench_engine.py --quick

bench-io: check-env
	$(PY) bench/bench_delta_io.py

clean:
	rm -rf $(VENV) data build *.egg-info .pytest_cache .mypy_cache .ruff_cache

# Watching the engine (tables under engine.lake; no Spark session).
.PHONY: status plots bench-status

status: venv
	$(VENV)/bin/retry-engine status --config $(CONFIG)

plots: venv
	$(VENV)/bin/retry-engine plots --config $(CONFIG) --out data/plots

bench-status: venv
	$(PY) bench/bench_status.py
