"""Shared fixtures: one local[4] Spark session (4 slots: the 2x2 hybrid mesh; 2 cores, oversubscribed), a private MLflow store per test
(a copy of an empty store MLflow made once per session), the real Adult data preprocessed once, and a guard that fails any test that leaks environment variables."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

# Set before any session starts so they are part of the baseline the leak guard compares to.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYTHONWARNINGS", "ignore::ResourceWarning")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # offline tests; no session-id env churn
# The `java` launcher reads this variable, so it reaches every JVM the tests start (sessions, the
# jobs they run, standalone masters, workers, executors). Most live seconds on a few thousand rows,
# and C2's compile threads were a quarter of such a JVM's CPU on a 2-core machine (the Adult
# pipeline: 73-94 CPU-s against 51-68 with C1 only; a bare session 12-14 against 9-10), in a suite
# that is CPU-bound. MNIST's two-minute job used the same CPU either way. Jobs outside the tests
# (`make demo`, `make bench`, users') keep the full JIT.
# They also map the classes they load from the archive `make test` dumps
# (scripts/spark_class_archive.py): a session's tiny job took 5.5-8 CPU-s with it against 10.5.
# A JVM whose jars differ from the archive's runs without it, silently (-Xlog:cds*=off).
_CLASS_ARCHIVE = Path(sys.prefix) / "spark-classes.jsa"
os.environ.setdefault(
    "JDK_JAVA_OPTIONS",
    "-XX:TieredStopAtLevel=1"
    + (f" -XX:SharedArchiveFile={_CLASS_ARCHIVE} -Xlog:cds*=off" if _CLASS_ARCHIVE.is_file() else ""),
)
# Code under test must use the store its config names; anything that falls back to MLflow's
# process-global URI lands in this empty store instead of a developer's ./mlflow.db.
os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{tempfile.mkdtemp(prefix='stray-mlflow-')}/stray.db")
# Rank functions defined in test modules are pickled by reference: Spark's Python workers
# (children of this process in local mode) must be able to import them.
_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_TESTS, os.environ.get("PYTHONPATH")) if p)

ROOT = Path(__file__).resolve().parents[1]
ADULT_CONFIG = ROOT / "conf" / "adult.yaml"


# `make test` runs two pytest-xdist workers, each taking whole files: the longest files by the last
# measured times (tests/file_times.json, from tests/timing.py's report) go first, so that neither
# worker is left alone with one of them at the end while the other is idle.
pytest_plugins = ["timing"]


def pytest_collection_modifyitems(items):
    from timing import file_order

    items[:] = file_order(items)


@pytest.fixture(autouse=True)
def no_env_leaks():
    """Like Lightning's tests: code under test must restore the environment it changes."""
    before = dict(os.environ)
    yield
    after = dict(os.environ)
    leaked = {
        k: after.get(k) for k in set(before) ^ set(after) | {k for k in before if before[k] != after.get(k)}
    }
    # pytest's; torch sets the others once per process (the inductor cache; CUDA's lazy module
    # loading, at the first CUDA call where a GPU is)
    for owned_by_others in ("PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR", "CUDA_MODULE_LOADING"):
        leaked.pop(owned_by_others, None)
    assert not leaked, f"test leaked environment variables: {sorted(leaked)}"


@pytest.fixture(scope="session")
def spark():
    from sparkml_dist.config import SparkConfig
    from sparkml_dist.spark import build_session

    session = build_session(
        SparkConfig(master="local[4]", app_name="sparkml_dist-tests"),
        extra_conf={"spark.sql.shuffle.partitions": "4"},
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def adult_config(tmp_path: Path, *overrides: str):
    from stores import fresh_store

    from sparkml_dist.config import load_config

    return load_config(
        ADULT_CONFIG,
        [f"output.root={tmp_path / 'out'}", f"tracking.tracking_uri={fresh_store(tmp_path)}", *overrides],
    )


@pytest.fixture(scope="module")
def module_adult_config(tmp_path_factory):
    """Like make_adult_config, for fixtures shared by one module's tests (one output root and store)."""
    root = tmp_path_factory.mktemp("module")
    return lambda *overrides: adult_config(root, *overrides)


@pytest.fixture(scope="session")
def adult_config_path() -> Path:
    return ADULT_CONFIG


@pytest.fixture
def make_adult_config(tmp_path):
    """Adult config with outputs and the MLflow store inside this test's tmp dir."""
    return lambda *overrides: adult_config(tmp_path, *overrides)


@pytest.fixture(scope="session")
def adult_prep(spark, tmp_path_factory):
    """The real Adult data through the preprocess stage, once per test session."""
    from sparkml_dist.stages import preprocess

    root = tmp_path_factory.mktemp("adult")
    cfg = adult_config(root)
    return cfg, preprocess(spark, cfg)


@pytest.fixture(scope="session")
def adult_trained(spark, adult_prep, tmp_path_factory):
    """A model trained briefly (1 epoch, 1 rank) on the shared Adult splits and logged to a store
    of its own: (config, the train stage's result). Modules register it under names they choose."""
    from sparkml_dist.stages.train import train
    from sparkml_dist.tracking.client import tracked_run

    cfg = adult_config(tmp_path_factory.mktemp("trained"), "train.epochs=1", "train.num_ranks=1")
    with tracked_run(cfg.tracking, "train", {}) as run:
        return cfg, run, train(spark, cfg, adult_prep[1], run)
