"""Run every benchmark in this folder and write bench/results.json (see docs/benchmarks.md).

    make bench        # or: .venv/bin/python -m bench.run_all
"""

from __future__ import annotations

from bench import allreduce, inference, loader, training


def main() -> None:
    from sparkml_dist.config import SparkConfig
    from sparkml_dist.spark import build_session

    loader.main()
    training.main()
    spark = build_session(SparkConfig(master="local[2]", app_name="sparkml_dist-bench"))
    spark.sparkContext.setLogLevel("ERROR")
    inference.main(spark=spark)
    allreduce.main(spark=spark)
    spark.stop()


if __name__ == "__main__":
    main()
