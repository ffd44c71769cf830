"""Run the benchmarks in this folder and write bench/results.json (see docs/benchmarks.md).

make bench                                  # every benchmark below (Ray Train's with the bench extra)
.venv/bin/python -m bench.run_all --full    # adds raw-row scoring and the
                                            # model-parallel suite
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from contextlib import contextmanager

from bench import (
    allreduce,
    byo,
    gpu,
    growth,
    host_loss,
    inference,
    loader,
    memory,
    observe,
    parallel,
    preprocess,
    ray_train,
    scaling,
    scoring_raw,
    serving,
    spark_ml,
    streaming,
    training,
    tune,
)
from bench.common import make_bench_importable


@contextmanager
def timed(name: str):
    start = time.perf_counter()
    print(f"== bench.{name}", flush=True)
    yield
    print(f"== bench.{name}: {time.perf_counter() - start:.0f} s", flush=True)


def main(full: bool = False) -> None:
    from sparkml_dist.config import SparkConfig
    from sparkml_dist.spark import build_session

    make_bench_importable()
    start = time.perf_counter()
    with timed("loader"):
        loader.main()
    with timed("training"):
        training.main()
    with timed("gpu"):  # the loop against the bare eager step, on this machine's CPU (GPUs: make gpu-check)
        gpu.main(
            [
                "--size",
                "cpu-bench",
                "--devices",
                "cpu",
                "--out",
                "output/gpu_check_cpu_bench.json",
                "--record",
            ]
        )
    with timed("memory"):
        memory.main()  # its own session: Python workers that no other benchmark has grown
    with timed("byo"):
        byo.main()  # fresh sessions of its own: the start-up row measures both launchers cold
    with timed("ray_train"):
        ray_train.main()  # cold jobs in fresh processes; skipped (and says so) without the bench extra
    spark = build_session(SparkConfig(master="local[2]", app_name="sparkml_dist-bench"))
    spark.sparkContext.setLogLevel("ERROR")
    with timed("inference"):
        inference.main(spark=spark)
    with timed("allreduce"):
        allreduce.main(spark=spark)
    with timed("scaling"):
        scaling.main(spark=spark)
    with timed("observe"):
        observe.main(spark=spark)
    with timed("preprocess"):
        # Adult-shaped at both sizes, and wide (MNIST)
        preprocess.main((1_000_000, 10_000_000), spark=spark, mnist=True)
    with timed("growth"):  # cost per row at 1M and 10M rows (make bench-scale adds 100M)
        growth.main(spark=spark)
    with timed("tune"):
        tune.main(spark=spark)
    with timed("streaming"):
        streaming.main(spark=spark)
    with timed("serving"):
        serving.main(spark=spark)
    with timed("spark_ml"):
        spark_ml.main(spark=spark)  # Spark ML's own models on Adult and diamonds, end to end
    spark.stop()
    if os.geteuid() == 0 and shutil.which("ip"):  # the emulated hosts need root and iproute2
        with timed("host_loss"):
            host_loss.main()
    else:
        print("== bench.host_loss: skipped (needs root and iproute2 for the emulated hosts)", flush=True)
    if full:
        with timed("scoring_raw"):
            scoring_raw.main()
        with timed("parallel"):
            parallel.main()  # its own local[4] session: the 2 x 2 hybrid mesh needs 4 task slots
    print(f"all benchmarks: {time.perf_counter() - start:.0f} s; results in bench/results.json", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--full", action="store_true", help="also score raw rows and run the model-parallel suite"
    )
    main(parser.parse_args().full)
