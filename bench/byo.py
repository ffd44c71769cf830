"""Bring your own: the TorchDistributor-compatible API against pyspark's TorchDistributor, and
DataFrame-fed ranks against the Parquet path.

    .venv/bin/python -m bench.byo

- run_start_vs_torch_distributor: from `run()` to the user function's first optimizer step, 2
  ranks, both cold (a fresh SparkSession, so fresh Python workers, for every measurement).
- dataframe_fed_vs_parquet: the project's DDP rank loop, 2 ranks, 3 epochs over the same rows,
  the train rows dealt by the barrier stage (train.input=dataframe) vs read from Parquet by each
  rank: the median epoch time; dataframe_fed_launch_vs_parquet: the whole launch, deal included.
- dataframe_fed_vs_torch_distributor_df: the same user function body, 2 ranks, 3 epochs, fed by
  `run_on_dataframe` + `dataframe_loader` vs pyspark's `_train_on_dataframe` + its partition loader.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench.common import Measured, alternate, entry, make_bench_importable, record, scratch_dir
from bench.loader import DIM, write_dataset

ROWS = 60_000
BATCH = 512
EPOCHS = 3


def first_step() -> float:
    """A user's function: the process group from the environment, DDP, one step; when it happened."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    model = DistributedDataParallel(torch.nn.Linear(DIM, 1))
    model(torch.randn(64, DIM)).sum().backward()
    stepped = time.time()
    dist.destroy_process_group()
    return stepped


def _session():
    from sparkml_dist.config import SparkConfig
    from sparkml_dist.spark import build_session

    spark = build_session(SparkConfig(master="local[2]", app_name="bench-byo"))
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def cold_start(make_distributor) -> float:
    spark = _session()
    try:
        distributor = make_distributor(spark)
        t0 = time.time()
        return distributor.run(first_step) - t0
    finally:
        spark.stop()


def ours_distributor(spark):
    import sparkml_dist as sd

    return sd.TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, spark=spark)


def pyspark_distributor(spark):
    from pyspark.ml.torch.distributor import TorchDistributor

    return TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)


def _ddp_mlp():
    import torch
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(DIM, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    )
    return model, torch.optim.SGD(model.parameters(), lr=0.05), torch.nn.BCEWithLogitsLoss()


def train_on_our_frame(epochs: int) -> int:
    import torch.distributed as dist

    import sparkml_dist as sd

    dist.init_process_group("gloo")
    loader = sd.dataframe_loader(batch_size=BATCH, label="label")
    model, optimizer, loss_fn = _ddp_mlp()
    steps = 0
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss_fn(model(x).squeeze(-1), y).backward()
            optimizer.step()
            steps += 1
    dist.destroy_process_group()
    return steps


def train_on_pyspark_frame(epochs: int, rows_per_rank: int) -> int:
    import torch
    import torch.distributed as dist
    from pyspark.ml.torch.distributor import _get_spark_partition_data_loader

    dist.init_process_group("gloo")
    loader = _get_spark_partition_data_loader(rows_per_rank, BATCH, num_workers=0)
    model, optimizer, loss_fn = _ddp_mlp()
    steps = 0
    for _ in range(epochs):
        for features, label in loader:  # default collate: one [batch] tensor per array element
            x = torch.stack(features, dim=1).float() if isinstance(features, list) else features.float()
            optimizer.zero_grad()
            loss_fn(model(x).squeeze(-1), label.float()).backward()
            optimizer.step()
            steps += 1
    dist.destroy_process_group()
    return steps


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def rank_loop_launch(spark, job, frame, epoch_seconds: list[float] | None = None) -> float:
    """Wall time of one launch; each epoch's time (rows / throughput, from the run's own epoch
    records) is appended to `epoch_seconds`."""
    from sparkml_dist.launch.launcher import run_barrier
    from sparkml_dist.launch.torch_backend import TorchBackend
    from sparkml_dist.train.loop import train_rank

    job = replace(job, checkpoint_dir=scratch_dir(), frame_fed=frame is not None)
    t0 = time.perf_counter()
    results = run_barrier(spark, train_rank, job, 2, TorchBackend(device="cpu"), frame=frame)
    wall = time.perf_counter() - t0
    if epoch_seconds is not None:
        epoch_seconds.append(statistics.median(r.samples / r.samples_per_s for r in results[0].records))
    return wall


def main() -> list[dict]:
    from bench.scaling import make_job
    from sparkml_dist.methods.loop import training_frame

    make_bench_importable()  # Spark workers and torchrun children import this module by name
    rows_out = []
    o, b = alternate(lambda: cold_start(ours_distributor), lambda: cold_start(pyspark_distributor))
    rows_out.append(
        entry(
            "run_start_vs_torch_distributor",
            o,
            b,
            "s",
            "lower",
            0.3,
            note="run() to the first DDP step, 2 ranks, a fresh SparkSession per measurement (both cold)",
        )
    )
    spark = _session()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        groups = write_dataset(root, ROWS, row_group=2048)
        job = make_job(root, groups, 2, epochs=EPOCHS, hidden=(64,))
        frame = training_frame(spark, replace(job, frame_fed=True)).cache()
        frame.count()  # the DataFrame as a user would hand it over: computed, not re-read from files
        rank_loop_launch(spark, job, frame), rank_loop_launch(spark, job, None)  # warm both paths' workers
        fed_epochs: list[float] = []
        parquet_epochs: list[float] = []
        o, b = alternate(
            lambda: rank_loop_launch(spark, job, frame, fed_epochs),
            lambda: rank_loop_launch(spark, job, None, parquet_epochs),
        )
        what = f"DDP rank loop, 2 ranks, {EPOCHS} epochs of {ROWS:,} rows, MLP {DIM}-64-1"
        rows_out.append(
            entry(
                "dataframe_fed_vs_parquet",
                Measured(fed_epochs),
                Measured(parquet_epochs),
                "s/epoch",
                "lower",
                1.2,
                note=f"{what}; epoch time from the runs' epoch records, rows dealt by the barrier "
                f"stage (spilled, decoded once) vs read from Parquet by the ranks",
            )
        )
        rows_out.append(
            entry(
                "dataframe_fed_launch_vs_parquet",
                o,
                b,
                "s",
                "lower",
                None,
                note=f"{what}; the whole launch, the deal (a shuffle) and the spill included",
            )
        )
        user_frame = frame.repartition(2).cache()  # pyspark's path takes one partition per rank
        user_frame.count()
        ours = ours_distributor(spark)
        theirs = pyspark_distributor(spark)
        o, b = alternate(
            lambda: timed(lambda: ours.run_on_dataframe(train_on_our_frame, user_frame, EPOCHS)),
            lambda: timed(
                lambda: theirs._train_on_dataframe(train_on_pyspark_frame, user_frame, EPOCHS, ROWS // 2)
            ),
        )
        rows_out.append(
            entry(
                "dataframe_fed_vs_torch_distributor_df",
                o,
                b,
                "s",
                "lower",
                1.0,
                note=f"same DDP function body, 2 ranks, {EPOCHS} epochs of {ROWS:,} rows, batch {BATCH}; "
                f"run_on_dataframe + dataframe_loader vs pyspark's _train_on_dataframe + "
                f"its partition loader",
            )
        )
    spark.stop()
    record(rows_out)
    return rows_out


if __name__ == "__main__":
    main()
