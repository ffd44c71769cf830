"""Submitted by tests/test_gpu_profile.py to a standalone cluster whose worker advertises fake GPUs:
prints, per barrier rank, the GPU addresses Spark assigned and the device index the launcher picks."""

import json

from sparkml_dist.config import SparkConfig
from sparkml_dist.launch import TorchBackend, run_barrier
from sparkml_dist.spark import build_session


def report_gpus(ctx, _):
    from sparkml_dist.launch.backend import gpu_index

    return {"rank": ctx.rank, "gpus": list(ctx.gpus), "index": gpu_index(ctx, device_count=2)}


if __name__ == "__main__":
    spark = build_session(SparkConfig())
    print(f"MASTER {spark.sparkContext.master}")
    print(
        "GPU_ASSIGNMENT " + json.dumps(run_barrier(spark, report_gpus, None, 2, TorchBackend(device="cpu")))
    )
    spark.stop()
