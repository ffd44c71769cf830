#!/usr/bin/env bash
# What only the tests need, after scripts/setup_env.sh (make test runs both; make demo only the
# first): a cached wheel of the oldest supported pyspark for tests/test_install.py, and the class
# archive the tests' JVMs share (scripts/spark_class_archive.py, read by tests/conftest.py), and
# Apache Airflow in a venv of its own ($venv/airflow) for tests/test_workflow.py, installed as
# Airflow asks: with a constraints file (requirements/airflow-constraints.txt).
set -euo pipefail
venv=${1:-.venv}
cd "$(dirname "$0")/.."
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
step() { echo "[test-setup] $*"; }
fail() { echo "[test-setup] FAILED: $*" >&2; exit 1; }

wheels=${SPARKML_DIST_CACHE:-$HOME/.cache/sparkml_dist}/wheels
oldest_pyspark=$(grep -E '^pyspark==' requirements/oldest-supported.txt)
if ! ls "$wheels/pyspark-${oldest_pyspark#pyspark==}-"*.whl >/dev/null 2>&1; then
  step "caching a $oldest_pyspark wheel for tests/test_install.py in $wheels (once; its sdist is ~320 MB)"
  "${pip[@]}" wheel -q --no-deps -w "$wheels" "$oldest_pyspark" || fail "pip wheel $oldest_pyspark"
fi
# The archive's JVM and Airflow's pip (one core) run side by side: setup is shorter by the shorter of the two.
step "dumping the Spark class archive the tests' JVMs share (log: $venv/spark-class-archive.log)"
"$venv/bin/python" scripts/spark_class_archive.py "$venv/spark-classes.jsa" >"$venv/spark-class-archive.log" 2>&1 &
archive=$!
trap 'kill "$archive" 2>/dev/null || true' EXIT  # a failed step below leaves no JVM behind
airflow=$venv/airflow
if [[ ! -x $airflow/bin/airflow ]] || ! cmp -s requirements/airflow-constraints.txt "$airflow/constraints.txt"; then
  step "installing Apache Airflow 3.2.2 in $airflow with requirements/airflow-constraints.txt"
  rm -rf "$airflow"
  "$venv/bin/python" -m venv "$airflow" || fail "python -m venv $airflow"
  "$airflow/bin/python" -m pip install -q \
    -c requirements/airflow-constraints.txt apache-airflow==3.2.2 || fail "pip install apache-airflow==3.2.2"
  cp requirements/airflow-constraints.txt "$airflow/constraints.txt"
fi
wait "$archive" || fail "no Spark class archive (see $venv/spark-class-archive.log)"
