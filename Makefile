# retry-engine: the two commands a newcomer needs are `make run` and `make test`.
# Both create ./.venv and install what they need on first use.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONFIG ?= conf/retry-engine.toml
PYTEST_ARGS ?=
# Test files run on two pytest-xdist workers, each file whole on one (its module fixtures, often one
# shared engine run, are not repeated): most of a streaming test is waiting on a trigger or a JVM,
# so two workers use the 2-core machine better: 17:26 in one process, 8:46-10:41 on two with the
# slowest files first (tests/conftest.py), 2026-11-29 (fresh clones). TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 2
MASTER ?= spark://127.0.0.1:7077
CRASH_KILLS ?= 40
CRASH_SEED ?=
SPARK_SUBMIT = $(shell $(PY) -c 'import pyspark, os; print(os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit"))' 2>/dev/null)

.PHONY: help venv check-env run demo test test-fast lint bench bench-quick bench-io bench-startup bench-s3 clean dist submit cluster-test crash-test soak soak-property mutation

help:
	@echo "make run    - run the retry engine on the embedded default (local Spark, tables under ./data/lake)"
	@echo "make demo   - engine + producer + a flaky consumer on ./data/demo for about a minute"
	@echo "make test   - run the whole test suite (unit + integration + slow end-to-end)"
	@echo "make lint   - ruff and mypy"
	@echo "make bench  - the engine's benchmark table (ratios measured side by side; BENCH_ARGS=--quick for a smoke run)"
	@echo "make bench-startup - where start-up time goes, cold and after a restart (STARTUP_ARGS='--rounds 3')"
	@echo "make bench-s3      - S3 requests and batch time per micro-batch on moto: checkpoint interval, kept tables, parallel commits (S3_ARGS)"
	@echo "make dist   - dist/retry_engine.zip, the --py-files zip for spark-submit"
	@echo "make submit MASTER=spark://host:7077 - spark-submit the engine to a cluster"
	@echo "make cluster-test - start a standalone master+worker on 127.0.0.1, submit the engine, check, stop"
	@echo "make crash-test   - SIGKILL the engine CRASH_KILLS times (default $(CRASH_KILLS)) and check every row"
	@echo "make mutation - mutation testing of the Spark-free core (mutmut; not in CI, 10-20 min): score and survivors"
	@echo "make soak   - the soak benchmark: 5,000 micro-batches with maintenance on, then off, ratios side by side (hours; SOAK_ARGS='--batches 300' or '--minutes 30')"
	@echo "make soak-property - the engine property test with the long profile (hundreds of random examples; SOAK_PROFILE=debug replays CI's and shrinks)"

$(STAMP): setup.cfg pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "retry-engine needs Python 3.11 or newer (found %s)" % sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

check-env: venv
	@$(PY) -c 'from retry_engine.delta.session import require_java; require_java()' || \
	  { echo "Java 17 or newer is required (Debian: apt-get install openjdk-17-jre-headless)"; exit 1; }
	@$(VENV)/bin/retry-engine prepare --if-missing || \
	  echo "warning: no JVM class archive (retry-engine prepare failed above): local Spark starts the slow way"

run: check-env
	$(PY) jobs/run_engine.py --config $(CONFIG)

demo: check-env
	$(VENV)/bin/retry-engine demo --lake ./data/demo

test: check-env
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

test-fast: check-env
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not slow" $(PYTEST_ARGS)

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

# Start-up (#14 part 3): `retry-engine run` to its first committed batch, cold and after a restart.
bench-startup: check-env
	$(PY) bench/bench_startup.py $(STARTUP_ARGS)

# S3 requests per micro-batch (#14 part 4): moto's server behind a counting proxy, two variants in one run.
S3_ARGS ?=

bench-s3: check-env
	$(PY) bench/bench_s3.py $(S3_ARGS)

dist: venv
	$(PY) -m retry_engine.ops.cli zip --output dist/retry_engine.zip

# Executors run PYSPARK_PYTHON: it must have pyarrow, pandas, deltalake and pydantic.
# PYTHONPATH: the driver JVM plans the deltars source in Python workers that do not see --py-files.
submit: dist
	PYSPARK_PYTHON=$${PYSPARK_PYTHON:-$(abspath $(PY))} PYTHONPATH=$(abspath dist/retry_engine.zip) \
	  $(SPARK_SUBMIT) --master $(MASTER) \
	  --py-files dist/retry_engine.zip --driver-java-options -Xss32m jobs/run_engine.py --config $(CONFIG)

cluster-test: check-env
	$(PY) -m pytest -s tests/integration/test_cluster.py $(PYTEST_ARGS)

crash-test: check-env
	RETRY_ENGINE_CRASH_KILLS=$(CRASH_KILLS) RETRY_ENGINE_CRASH_SEED=$(CRASH_SEED) \
	  $(PY) -m pytest -s --timeout=0 tests/integration/test_engine_crash.py $(PYTEST_ARGS)

# The soak benchmark (#14 part 2, bench/bench_soak.py; results in bench/RESULTS.md): the engine for
# --batches micro-batches (default 5,000) with table maintenance on, then off, in fresh JVMs.
SOAK_ARGS ?=

soak: check-env
	$(PY) bench/bench_soak.py $(SOAK_ARGS)

# The property tests: tests/integration/test_property_engine.py (CI: its "ci" profile, 12 examples,
# fixed seed, plus 4 pinned ones) and tests/integration/test_restart_machine.py (CI: one scripted
# sequence). `make soak-property` runs their "soak" profile: hundreds of examples and 25 random
# restart sequences, a new seed each time, printed on failure.
SOAK_PROFILE ?= soak

soak-property: check-env
	HYPOTHESIS_PROFILE=$(SOAK_PROFILE) $(PY) -m pytest -x --timeout=0 tests/integration/test_property_engine.py tests/integration/test_restart_machine.py $(PYTEST_ARGS)

# Mutation testing (#16) of decide, delays, names, packed, metrics and config against the unit tests
# listed in setup.cfg [mutmut]; not in CI (too slow). A fresh run each time (mutmut caches results in
# ./mutants); the report prints the score and every mutant neither killed nor accepted as equivalent
# (tests/mutation/equivalent.txt) and fails if there is one, or if less than 90% are killed; then
# the issue's eight hand mutations (tests/mutation/hand_mutations.py) must each fail their test.
MUTATION_STAMP := $(VENV)/.mutation-installed
MUTATION_CHILDREN ?= 2

$(MUTATION_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[test,mutation]'
	@touch $@

mutation: $(MUTATION_STAMP)
	rm -rf mutants
	@start=$$(date +%s); \
	$(VENV)/bin/mutmut run --max-children $(MUTATION_CHILDREN) || exit 1; \
	echo "mutmut run took $$(( $$(date +%s) - start )) s"; \
	$(PY) tests/mutation/report.py; score=$$?; \
	$(PY) tests/mutation/hand_mutations.py && exit $$score

clean:
	rm -rf $(VENV) data build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache mutants

# Watching the engine (tables under engine.lake; no Spark session).
.PHONY: status plots bench-status bench-retention bench-retention-ledger bench-compaction

status: venv
	$(VENV)/bin/retry-engine status --config $(CONFIG)

plots: venv
	$(VENV)/bin/retry-engine plots --config $(CONFIG) --out data/plots

bench-status: venv
	$(PY) bench/bench_status.py

bench-retention: venv
	$(PY) bench/bench_retention.py

bench-retention-ledger: venv
	$(PY) bench/bench_retention.py --table ledger

bench-compaction: venv
	$(PY) bench/bench_compaction.py

bench-catch-up: venv
	$(PY) bench/bench_catch_up.py
