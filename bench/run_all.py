"""Run every benchmark in this folder and write bench/results.json (see docs/benchmarks.md).

    make bench                                  # ~8 minutes on 2 cores
    .venv/bin/python -m bench.run_all --full    # adds preprocessing of 10M generated rows
"""

from __future__ import annotations

import argparse

from bench import allreduce, inference, loader, memory, parallel, preprocess, scaling, training
from bench.common import make_bench_importable


def main(full: bool = False) -> None:
    from sparkml_dist.config import SparkConfig
    from sparkml_dist.spark import build_session

    make_bench_importable()
    loader.main()
    training.main()
    spark = build_session(SparkConfig(master="local[2]", app_name="sparkml_dist-bench"))
    spark.sparkContext.setLogLevel("ERROR")
    inference.main(spark=spark)
    allreduce.main(spark=spark)
    scaling.main(spark=spark)
    memory.main(spark=spark)
    preprocess.main((1_000_000, 10_000_000) if full else (1_000_000,), spark=spark)
    spark.stop()
    parallel.main()  # its own local[4] session: the 2 x 2 hybrid mesh needs 4 task slots


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--full", action="store_true", help="also preprocess 10M generated rows")
    main(parser.parse_args().full)
