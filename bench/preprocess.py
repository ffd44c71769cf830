"""Feature engineering throughput: our preprocess stage (ingest with rejects, impute/index/
one-hot/scale, split, Parquet for N ranks, manifest) vs a plain Spark CSV read + Parquet write
of the same generated Adult-shaped rows; and the two-pass floor (`two_pass_floor`) against the
same copy, measured in turn with both: how near any plan that keeps rejects and fits statistics
can come to the copy on this machine. `--mnist`: the same for a wide table, MNIST's 785-column
Parquet (conf/mnist.yaml) against Spark's own Parquet-to-Parquet copy of its two files.

    .venv/bin/python -m bench.preprocess [--rows 1000000] [--rows 10000000] [--mnist]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.common import Measured, alternate, entry, in_turn, record

CONFIG = Path(__file__).resolve().parents[1] / "conf" / "adult.yaml"
MNIST_CONFIG = CONFIG.parent / "mnist.yaml"


def ours(spark, train_csv: str, test_csv: str, out: str, config: Path = CONFIG) -> float:
    from sparkml_dist.config import load_config
    from sparkml_dist.stages import preprocess

    cfg = load_config(
        config, [f"data.train_path={train_csv}", f"data.test_path={test_csv}", f"output.root={out}"]
    )
    t0 = time.perf_counter()
    result = preprocess(spark, cfg)
    seconds = time.perf_counter() - t0
    return sum(v["input"] for v in result.manifest.inputs.values()) / seconds


def adult_columns():
    from sparkml_dist.config import load_config

    return load_config(CONFIG).data.columns


def csv_schema(cols) -> str:
    """The DDL schema both baselines read the CSV with: Spark's own typed parse."""
    return ", ".join(f"`{c.name}` {'int' if c.type == 'int' else 'string'}" for c in cols)


def plain_spark_io(spark, train_csv: str, test_csv: str, out: str) -> float:
    schema = csv_schema(adult_columns())
    return copied_rows_per_s(
        spark,
        lambda path: spark.read.csv(path, schema=schema, ignoreLeadingWhiteSpace=True),
        train_csv,
        test_csv,
        out,
    )


def copied_rows_per_s(spark, read, train: str, test: str, out: str) -> float:
    """Spark's own copy: each input as `read` reads it, written as Parquet, then counted."""
    t0 = time.perf_counter()
    rows = 0
    for name, path in (("train", train), ("test", test)):
        read(path).write.mode("overwrite").parquet(f"{out}/{name}")
        rows += spark.read.parquet(f"{out}/{name}").count()
    return rows / (time.perf_counter() - t0)


def wide(spark, rounds: int = 3) -> dict:
    """MNIST (60,000 + 10,000 rows, 784 float pixels and the digit) as conf/mnist.yaml
    preprocesses it, against the copy; alternated in one session, so both sides run warm after
    the first round."""
    from sparkml_dist.data.examples import write_mnist

    with tempfile.TemporaryDirectory() as tmp:
        write_mnist(Path(tmp))
        train, test = f"{tmp}/mnist/train.parquet", f"{tmp}/mnist/test.parquet"
        o, b = alternate(
            lambda: ours(spark, train, test, f"{tmp}/ours", MNIST_CONFIG),
            lambda: copied_rows_per_s(spark, spark.read.parquet, train, test, f"{tmp}/copy"),
            rounds,
        )
    return entry(
        "preprocess_vs_spark_io_mnist",
        o,
        b,
        "rows/s",
        "higher",
        0.5,
        note="MNIST, 60,000 train + 10,000 test rows of 785 columns (Parquet), conf/mnist.yaml; "
        "baseline: Spark's Parquet-to-Parquet copy of both files",
    )


def two_pass_floor(spark, train_csv: str, test_csv: str, out: str) -> float:
    """The least a correct preprocess can do, as bare as Spark allows, not a stage anyone could use:
    pass 1 parses each file once with Spark's own typed CSV reader (a malformed row's line kept
    in Spark's corrupt-record column, the label checked, the file named) and writes its rows
    split into train, validation and rejects in one job (`partitionBy`); pass 2 reads the
    written training rows once for the fit's statistics (each numeric column's count, mean,
    variance and median; each categorical column's value counts). Left out, and all needed by
    a real stage: a reason per column, the encoding itself, equal files per rank, the fitted
    pipeline's save, the manifest."""
    from pyspark.sql import functions as F

    cols = adult_columns()
    schema = csv_schema(cols) + ", `_line` string"
    numeric = [c.name for c in cols if c.role == "numeric"]
    categorical = [c.name for c in cols if c.role == "categorical"]
    t0 = time.perf_counter()
    for name, path in (("train", train_csv), ("test", test_csv)):
        df = spark.read.csv(
            path,
            schema=schema,
            ignoreLeadingWhiteSpace=True,
            nullValue="?",
            mode="PERMISSIVE",
            columnNameOfCorruptRecord="_line",
        )
        label = F.regexp_replace("income", r"\.$", "")
        y = F.when(label == ">50K", 1).when(label == "<=50K", 0)
        row_id = F.monotonically_increasing_id()
        split = F.when(F.col("_line").isNotNull() | y.isNull(), "reject")
        split = split.when(F.abs(F.xxhash64(row_id, F.lit(7))) % 10 == 0, "val") if name == "train" else split
        split = split.otherwise(name)
        rows = df.select(
            row_id.alias("row_id"),
            *numeric,
            *categorical,
            y.alias("label"),
            "_line",
            F.input_file_name().alias("file"),
            split.alias("split"),
        )
        rows.write.mode("overwrite").partitionBy("split").parquet(f"{out}/{name}")
    train = spark.read.parquet(f"{out}/train").where("split = 'train'")
    train.agg(*[f(c) for c in numeric for f in (F.count, F.mean, F.var_samp, F.median)]).collect()
    pairs = F.create_map(*[x for c in categorical for x in (F.lit(c), F.col(c))])
    train.select(F.explode(pairs).alias("column", "value")).groupBy("column", "value").count().collect()
    rows = sum(spark.read.parquet(f"{out}/{name}").count() for name in ("train", "test"))
    return rows / (time.perf_counter() - t0)


def main(sizes=(1_000_000,), spark=None, rounds: int = 3, mnist: bool = False) -> list[dict]:
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
            measure = {
                "ours": lambda: ours(spark, train, test, f"{tmp}/ours"),
                "floor": lambda: two_pass_floor(spark, train, test, f"{tmp}/floor"),
                "copy": lambda: plain_spark_io(spark, train, test, f"{tmp}/plain"),
            }
            runs = {name: [] for name in measure}
            for i in range(rounds):
                for name in in_turn(list(measure), i):
                    runs[name].append(measure[name]())
        o, floor, b = (Measured(runs[name]) for name in measure)
        label = f"{rows // 1_000_000}m" if rows >= 1_000_000 else str(rows)
        shape = f"{rows:,} train + {max(rows // 10, 1000):,} test Adult-shaped rows"
        rows_out.append(entry(f"preprocess_vs_spark_io_{label}", o, b, "rows/s", "higher", 0.5, note=shape))
        rows_out.append(
            entry(
                f"preprocess_two_pass_floor_vs_spark_io_{label}",
                floor,
                b,
                "rows/s",
                "higher",
                None,
                note=f"{shape}; bench.preprocess.two_pass_floor: one typed parse and split write, "
                "one statistics pass, nothing else",
            )
        )
    if mnist:
        rows_out.append(wide(spark, rounds))
    record(rows_out)
    return rows_out


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, action="append", help="Adult-shaped rows (default 1,000,000)")
    parser.add_argument("--mnist", action="store_true", help="also MNIST's 785 columns (conf/mnist.yaml)")
    args = parser.parse_args()
    main(tuple(args.rows or ([] if args.mnist else [1_000_000])), mnist=args.mnist)
