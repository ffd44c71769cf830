"""Dump a class-data-sharing (AppCDS) archive of the JVM classes this project's Spark jobs load.

The test suite starts many short-lived JVMs (sessions, the CLI jobs it runs, standalone masters,
workers and executors), and each one parsed and verified the same ~14,000 Spark classes again.
With this archive a JVM maps them instead: a session running a tiny job took 5.5-8 s of CPU
against 10.5 without it (this project's 2-core CI machine). `make test` runs this once
(scripts/test_assets.sh; `make demo` does not), and `tests/conftest.py` hands the archive to
every JVM the tests start (`-XX:SharedArchiveFile`). A JVM whose jars differ from the archive's
(another pyspark, another JDK) does not use it and runs as before.

    .venv/bin/python scripts/spark_class_archive.py .venv/spark-classes.jsa

Only the driver JVM dumps (spark-submit's `--driver-java-options`), not the launcher JVM that
spark-submit runs first.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIN_ARCHIVE_BYTES = 32 << 20  # a dump of the launcher's classes alone is a few MB


def dump(archive: Path) -> Path:
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    partial.unlink(missing_ok=True)
    os.environ["PYSPARK_SUBMIT_ARGS"] = (
        f'--driver-java-options "-XX:ArchiveClassesAtExit={partial} -Xlog:cds*=off" pyspark-shell'
    )
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    with tempfile.TemporaryDirectory(prefix="spark-class-archive-") as tmp:
        _run_workload(Path(tmp))
        _stop_driver_jvm()
    if not partial.exists() or partial.stat().st_size < MIN_ARCHIVE_BYTES:
        raise SystemExit(
            f"{partial}: the driver JVM wrote no archive (or too small a one); the suite runs without it"
        )
    os.replace(partial, archive)
    return archive


def _run_workload(tmp: Path) -> None:
    """Adult's preprocess stage (CSV, Catalyst, Spark ML's feature stages, Parquet) and a barrier
    mapInArrow stage with a pandas UDF (what training, evaluation and scoring drive): most classes
    a job loads, in a third of the time a whole pipeline would take here."""
    from sparkml_dist.cli import main

    status = main(
        [
            "preprocess",
            "--config",
            str(ROOT / "conf" / "adult.yaml"),
            "--set",
            f"output.root={tmp / 'out'}",
            "--set",
            f"tracking.tracking_uri=sqlite:///{tmp / 'mlflow.db'}",
        ]
    )
    if status != 0:
        raise SystemExit(f"Adult's preprocess stage failed (exit {status}); no archive written")
    _barrier_arrow_and_pandas_udf()


def _barrier_arrow_and_pandas_udf() -> None:
    import pandas as pd
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = SparkSession.getActiveSession()

    def rank_sums(batches):
        from pyspark import BarrierTaskContext

        BarrierTaskContext.get().barrier()
        yield from batches

    def times_two(values):
        return values * 2.0

    times_two.__annotations__ = {
        "values": pd.Series,
        "return": pd.Series,
    }  # real types: this module's are strings
    doubled = F.pandas_udf(times_two, "double")

    frame = spark.range(0, 2000, numPartitions=2).withColumn("x", F.col("id").cast("double"))
    frame.mapInArrow(rank_sums, frame.schema, barrier=True).select(doubled("x").alias("y")).agg(
        F.sum("y")
    ).collect()


def _stop_driver_jvm() -> None:
    """The JVM dumps the archive as it exits, which it does when its stdin closes (pyspark's
    gateway watches it): close it and wait, so the archive is complete before we rename it."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    if session is not None:
        session.stop()
    gateway = SparkContext._gateway
    if gateway is None or getattr(gateway, "proc", None) is None:
        raise SystemExit("no pyspark gateway JVM was started by this process")
    gateway.proc.stdin.close()
    gateway.proc.wait(timeout=300)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    start = time.time()
    archive = dump(Path(argv[0]).resolve())
    print(
        f"[setup] Spark class archive: {archive} ({archive.stat().st_size >> 20} MiB, {time.time() - start:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
