# sparkml_dist: `make demo` sets up and runs the Adult pipeline; `make test` sets up and runs the tests.
SHELL := /bin/bash
export MLFLOW_DISABLE_TELEMETRY ?= true
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.sparkml_dist-installed
CONFIG ?= conf/adult.yaml

.PHONY: setup demo test test-fast bench clean check-java horovod

check-java:
	@scripts/check_java.sh

setup: check-java $(STAMP)

$(STAMP): pyproject.toml requirements/constraints.txt requirements/datasets.txt scripts/setup_env.sh scripts/build_horovod.sh
	@scripts/setup_env.sh "$(PYTHON)" "$(VENV)"
	@touch $@

demo: setup
	$(PY) -m sparkml_dist.cli pipeline --config $(CONFIG)

test: setup
	$(PY) -m pytest -q --durations=20

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

bench: setup
	$(PY) -m bench.run_all

clean:
	rm -rf output mlflow.db spark-warehouse .pytest_cache
