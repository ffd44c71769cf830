"""Distributed training: 2-rank scaling of a compute-bound model, and end-to-end wall time of our
barrier launcher vs pyspark's TorchDistributor running the same training.

    .venv/bin/python -m bench.scaling
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench.common import alternate, entry, make_bench_importable, record
from bench.loader import DIM, write_dataset

def compute_bound(hidden: tuple[int, ...] = (1024, 1024)):
    from sparkml_dist.models.spec import ModelSpec

    return ModelSpec("mlp", DIM, dropout=0.0, hidden=hidden)


def make_job(root: Path, groups, ranks: int, epochs: int = 1, hidden: tuple[int, ...] = (1024, 1024)):
    """The rank loop's payload under DDP, built as the ddp method builds it."""
    from sparkml_dist.methods import get_method
    from sparkml_dist.train.job import TrainJob

    ddp = get_method("ddp")
    cfg = ddp.config(num_ranks=ranks, epochs=epochs, batch_size=1024, threads_per_rank=1, device="cpu",
                     log_every_steps=10_000)
    return TrainJob(str(root), tuple(groups), tuple(groups[:1]), compute_bound(hidden), cfg, tempfile.mkdtemp(),
                    placement=ddp.placement)


def throughput(spark, job, ranks: int) -> float:
    from sparkml_dist.launch import TorchBackend, run_barrier
    from sparkml_dist.train.loop import train_rank

    job = replace(job, checkpoint_dir=tempfile.mkdtemp())  # a fresh run, not a resume
    return run_barrier(spark, train_rank, job, ranks, TorchBackend())[0].records[0].samples_per_s


def ours_wall(spark, job) -> float:
    from sparkml_dist.launch import TorchBackend, run_barrier
    from sparkml_dist.train.loop import train_rank

    t0 = time.perf_counter()
    run_barrier(spark, train_rank, replace(job, checkpoint_dir=tempfile.mkdtemp()), 2, TorchBackend())
    return time.perf_counter() - t0


def distributor_rank(job):
    """What TorchDistributor runs in each torchrun process: the same rank function."""
    import torch.distributed as dist

    from sparkml_dist.launch.context import RankContext
    from sparkml_dist.train.loop import train_rank

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ctx = RankContext(rank, world, rank, world, 0, 1, "127.0.0.1", os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    try:
        return train_rank(ctx, job).records
    finally:
        dist.destroy_process_group()


def distributor_wall(job) -> float:
    from pyspark.ml.torch.distributor import TorchDistributor

    t0 = time.perf_counter()
    TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
        distributor_rank, replace(job, checkpoint_dir=tempfile.mkdtemp()))
    return time.perf_counter() - t0


def main(rows: int = 60_000, spark=None) -> list[dict]:
    from sparkml_dist.config import SparkConfig
    from sparkml_dist.spark import build_session

    make_bench_importable()  # torchrun children of TorchDistributor import this module by name
    spark = spark or build_session(SparkConfig(master="local[2]", app_name="bench-scaling"))
    spark.sparkContext.setLogLevel("ERROR")
    rows_out = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        groups = write_dataset(root, rows, row_group=2048)
        one, two = make_job(root, groups, 1), make_job(root, groups, 2)
        o, b = alternate(lambda: throughput(spark, two, 2), lambda: 2 * throughput(spark, one, 1))
        rows_out.append(entry("train_scaling_2_ranks", o, b, "samples/s", "higher", 0.9,
                              note=f"MLP 32-1024-1024-1, {rows:,} rows, 1 thread per rank; baseline = 2 x one rank"))
        o, b = alternate(lambda: ours_wall(spark, two), lambda: distributor_wall(two))
        rows_out.append(entry("train_vs_torch_distributor", o, b, "s", "lower", 0.75,
                              note="same rank function and data, 1 epoch; TorchDistributor(num_processes=2, local_mode=False)"))
    record(rows_out)
    return rows_out


if __name__ == "__main__":
    main()
