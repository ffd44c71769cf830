# sparkml_dist: `make demo` sets up and runs the Adult pipeline; `make test` sets up and runs the tests.
SHELL := /bin/bash
export MLFLOW_DISABLE_TELEMETRY ?= true
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.sparkml_dist-installed
CONFIG ?= conf/adult.yaml

.PHONY: setup test-setup demo test test-fast lint bench bench-scale gpu-check clean check-java horovod

check-java:
	@scripts/check_java.sh

setup: check-java $(STAMP)

$(STAMP): pyproject.toml requirements/constraints.txt requirements/datasets.txt scripts/setup_env.sh scripts/build_horovod.sh
	@scripts/setup_env.sh "$(PYTHON)" "$(VENV)"
	@touch $@

# What only the tests need (scripts/test_assets.sh): the oldest supported pyspark's wheel, the JVMs' class archive,
# Airflow in its own venv.
TEST_STAMP := $(VENV)/.sparkml_dist-test-assets
test-setup: setup $(TEST_STAMP)

$(TEST_STAMP): $(STAMP) scripts/test_assets.sh scripts/spark_class_archive.py requirements/oldest-supported.txt requirements/airflow-constraints.txt
	@scripts/test_assets.sh "$(VENV)"
	@touch $@

demo: setup
	$(PY) -m sparkml_dist.cli pipeline --config $(CONFIG)

# Two workers (pytest-xdist), each taking whole files: a file's module fixtures are built once, and
# the tests that share a fixed port or the emulated hosts' namespaces each sit in one file.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# Budgets (minutes) under CI's 90 for a fresh clone, lint's minute included: each stage fails by
# name when it overruns. A fresh clone's setup took 3-5 minutes here (Horovod's wheel cached).
SETUP_BUDGET ?= 15
TEST_BUDGET ?= 72
test:
	@scripts/within_budget.sh setup $(SETUP_BUDGET) $(MAKE) --no-print-directory test-setup
	@$(MAKE) --no-print-directory lint
	@scripts/within_budget.sh tests $(TEST_BUDGET) $(PYTEST) --durations=20

# Lint, format and types (pyproject.toml's [tool.ruff] and [tool.mypy]): `ruff format .` fixes what
# the second line finds.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test-fast: test-setup
	$(PYTEST) -m "not slow"

bench: setup
	$(PY) -m bench.run_all

# The growth curves up to 100M rows (docs/benchmarks.md, "Growth"): about 10 GB of generated CSV
# under $$TMPDIR, hours on 2 cores.
bench-scale: setup
	$(PY) -m bench.growth --rows 100000000

# The GPU check (docs/gpu.md): the training loop and scoring on every visible GPU and the CPU,
# beside bare ceilings. It needs torch, pyarrow, numpy and pydantic, not Java or Spark: without
# the venv it runs on $(PYTHON) (a GPU machine's own torch).
GPU_PY := $(if $(wildcard $(VENV)/bin/python),$(VENV)/bin/python,$(PYTHON))
GPU_CHECK_OUT ?= output/gpu_check.json
gpu-check:
	$(GPU_PY) -m bench.gpu --out $(GPU_CHECK_OUT)

clean:
	rm -rf output mlflow.db spark-warehouse .pytest_cache
