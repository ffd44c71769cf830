"""Feature engineering throughput: our preprocess stage (ingest with rejects, impute/index/
one-hot/scale, split, Parquet for N ranks, manifest) vs a plain Spark CSV read + Parquet write
of the same generated Adult-shaped rows.

    .venv/bin/python -m bench.preprocess [--rows 1000000] [--rows 10000000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.common import alternate, entry, record

CONFIG = Path(__file__).resolve().parents[1] / "conf" / "adult.yaml"


def ours(spark, train_csv: str, test_csv: str, out: str) -> float:
    from sparkml_dist.config import load_config
    from sparkml_dist.stages import preprocess

    cfg = load_config(CONFIG, [f"data.train_path={train_csv}", f"data.test_path={test_csv}", f"output.root={out}"])
    t0 = time.perf_counter()
    result = preprocess(spark, cfg)
    seconds = time.perf_counter() - t0
    return sum(v["input"] for v in result.manifest.inputs.values()) / seconds


def plain_spark_io(spark, train_csv: str, test_csv: str, out: str) -> float:
    from sparkml_dist.config import load_config

    cols = load_config(CONFIG).data.columns
    schema = ", ".join(f"`{c.name}` {'int' if c.type == 'int' else 'string'}" for c in cols)
    t0 = time.perf_counter()
    rows = 0
    for name, path in (("train", train_csv), ("test", test_csv)):
        df = spark.read.csv(path, schema=schema, ignoreLeadingWhiteSpace=True)
        df.write.mode("overwrite").parquet(f"{out}/{name}")
        rows += spark.read.parquet(f"{out}/{name}").count()
    return rows / (time.perf_counter() - t0)


def main(sizes=(1_000_000,), spark=None) -> list[dict]:
    from sparkml_dist.config import SparkConfig
    from sparkml_dist.data.generate import adult_like, write_csv
    from sparkml_dist.spark import build_session

    spark = spark or build_session(SparkConfig(master="local[2]", app_name="bench-preprocess"))
    spark.sparkContext.setLogLevel("ERROR")
    rows_out = []
    for rows in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            train, test = f"{tmp}/train_csv", f"{tmp}/test_csv"
            write_csv(adult_like(spark, rows, seed=1), train, 8)
            write_csv(adult_like(spark, max(rows // 10, 1000), seed=2), test, 2)
            o, b = alternate(lambda: ours(spark, train, test, f"{tmp}/ours"),
                             lambda: plain_spark_io(spark, train, test, f"{tmp}/plain"))
        label = f"{rows // 1_000_000}m" if rows >= 1_000_000 else str(rows)
        rows_out.append(entry(f"preprocess_vs_spark_io_{label}", o, b, "rows/s", "higher", 0.5,
                              note=f"{rows:,} train + {max(rows // 10, 1000):,} test Adult-shaped rows"))
    record(rows_out)
    return rows_out


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, action="append")
    main(tuple(parser.parse_args().rows or [1_000_000]))
