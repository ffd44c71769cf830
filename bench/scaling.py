"""Distributed training: 2-rank scaling of a compute-bound model, and end-to-end wall time of our
barrier launcher vs pyspark's TorchDistributor running the same training, both cold, on a
1-epoch job and on one with over a minute of training; and a job large in data (2,000,000 rows):
our rank loop against a TorchDistributor function that reads the Parquet with its own
DataLoader, as that API's users write one; and what a launch and the whole
pipeline cost over Spark Connect.

    .venv/bin/python -m bench.scaling [--only scaling|distributor|data|connect]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench.common import (
    Measured,
    alternate,
    cold_figures,
    entry,
    in_turn,
    make_bench_importable,
    record,
    scratch_dir,
)
from bench.loader import DIM, write_dataset

# 2 ranks train this compute-bound MLP at 22,000-44,000 samples/s on the machines this ran on
# (2026-12-01 and 2026-12-02): 48 epochs of 60,000 rows are over a minute of training on either
LONG_EPOCHS = 48
# the scaling rows differ by a few percent and single runs here by up to 10%: more rounds than the
# other benchmarks' three (about 21 s a round here)
SCALING_ROUNDS = 7


def compute_bound(hidden: tuple[int, ...] = (1024, 1024)):
    from sparkml_dist.models.spec import ModelSpec

    return ModelSpec("mlp", DIM, dropout=0.0, hidden=hidden)


def make_job(
    root: Path,
    groups,
    ranks: int,
    epochs: int = 1,
    hidden: tuple[int, ...] = (1024, 1024),
    allreduce: str = "shared_memory",
):
    """The rank loop's payload under DDP, built as the ddp method builds it."""
    from sparkml_dist.methods import get_method
    from sparkml_dist.train.job import TrainJob

    ddp = get_method("ddp")
    cfg = ddp.config(
        num_ranks=ranks,
        epochs=epochs,
        batch_size=1024,
        threads_per_rank=1,
        device="cpu",
        log_every_steps=10_000,
        intra_host_allreduce=allreduce,
    )
    return TrainJob(
        str(root),
        tuple(groups),
        tuple(groups[:1]),
        compute_bound(hidden),
        cfg,
        scratch_dir(),
        placement=ddp.placement,
    )


def throughput(spark, job, ranks: int) -> float:
    """Samples/s of the job's last epoch: the first pays one-off costs (DDP's bucket rebuild, the
    allocator's first touch) over as many steps as its ranks split the rows into, so a 2-rank epoch
    would pay them over half the steps that one rank or the no-communication pair does."""
    from sparkml_dist.launch import TorchBackend, run_barrier
    from sparkml_dist.train.loop import train_rank

    job = replace(job, checkpoint_dir=scratch_dir())  # a fresh run, not a resume
    return run_barrier(spark, train_rank, job, ranks, TorchBackend())[0].records[-1].samples_per_s


def independent_rank(ctx, job):
    """One of two ranks that train at once without communicating: each is a world of one (its own
    rank 0, no DDP, no allreduce) over the whole dataset, with its own checkpoints. The pair's
    throughput is the ceiling this machine leaves two ranks before any communication."""
    from sparkml_dist.train.loop import train_rank

    alone = replace(ctx, rank=0, world_size=1)
    return train_rank(alone, replace(job, checkpoint_dir=f"{job.checkpoint_dir}/rank{ctx.rank}"))


def no_comm_throughput(spark, job) -> float:
    """Samples/s of two ranks training at once with no communication, summed."""
    from sparkml_dist.launch import TorchBackend, run_barrier

    job = replace(job, checkpoint_dir=scratch_dir())
    return sum(
        r.records[-1].samples_per_s for r in run_barrier(spark, independent_rank, job, 2, TorchBackend())
    )


def lockstep_rank(ctx, job):
    """DDP's rank exactly as it trains, except that its gradient hook only meets the other ranks
    at the shared-memory barrier and keeps its own gradients: the ranks keep in step at every
    bucket and exchange nothing. Against the no-communication pair, what keeping in step alone
    costs on this machine; against it, what moving the gradients costs (the replicas drift
    apart, which a timing does not mind). The hook is restored after, since Spark reuses the
    Python worker for later tasks."""
    from sparkml_dist.train import shm_allreduce
    from sparkml_dist.train.loop import train_rank

    averaging = shm_allreduce.SharedMemoryAllreduce.allreduce

    def meet_only(state, bucket):
        state._barrier()
        return shm_allreduce._done(bucket.buffer())

    shm_allreduce.SharedMemoryAllreduce.allreduce = meet_only
    try:
        return train_rank(ctx, job)
    finally:
        shm_allreduce.SharedMemoryAllreduce.allreduce = averaging


def lockstep_throughput(spark, job) -> float:
    """Samples/s of DDP's two ranks keeping in step without exchanging gradients."""
    from sparkml_dist.launch import TorchBackend, run_barrier

    job = replace(job, checkpoint_dir=scratch_dir())
    return run_barrier(spark, lockstep_rank, job, 2, TorchBackend())[0].records[-1].samples_per_s


def ours_wall(spark, job) -> float:
    from sparkml_dist.launch import TorchBackend, run_barrier
    from sparkml_dist.train.loop import train_rank

    t0 = time.perf_counter()
    run_barrier(spark, train_rank, replace(job, checkpoint_dir=scratch_dir()), 2, TorchBackend())
    return time.perf_counter() - t0


def distributor_rank(job):
    """What TorchDistributor runs in each torchrun process: the same rank function."""
    import torch.distributed as dist

    from sparkml_dist.launch.context import RankContext
    from sparkml_dist.train.loop import train_rank

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ctx = RankContext(
        rank, world, rank, world, 0, 1, "127.0.0.1", os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    )
    try:
        return train_rank(ctx, job).records
    finally:
        dist.destroy_process_group()


def distributor_wall(job) -> float:
    from pyspark.ml.torch.distributor import TorchDistributor

    t0 = time.perf_counter()
    TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
        distributor_rank, replace(job, checkpoint_dir=scratch_dir())
    )
    return time.perf_counter() - t0


# the data-heavy job: a small model, so that the rows (reading, shuffling, batching) are the work
DATA_ROWS = 2_000_000
DATA_EPOCHS = 2
DATA_HIDDEN = (64,)
DATA_BATCH = 1024


def user_dataloader_rank(train_dir: str, epochs: int) -> int:
    """What a TorchDistributor user writes for data in Parquet (pyspark's docs: the function builds
    its own DataLoader): every process reads the files into one float32 matrix, a TensorDataset
    with a DistributedSampler and a DataLoader, DDP over gloo, the same model, loss, optimizer and
    batch as our rank loop, one thread a rank (two ranks on two cores). Returns the samples trained."""
    import numpy as np
    import pyarrow.dataset as ds
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from sparkml_dist.models.factory import build_model

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    table = ds.dataset(train_dir, format="parquet").to_table(columns=["features", "label"])
    features = table["features"].combine_chunks().flatten().to_numpy().reshape(-1, DIM)
    x = torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32))
    y = torch.from_numpy(table["label"].to_numpy().astype(np.float32))
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=DATA_BATCH, sampler=sampler)
    torch.manual_seed(0)
    model = DistributedDataParallel(build_model(compute_bound(DATA_HIDDEN)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    seen = 0
    try:
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for xb, yb in loader:
                opt.zero_grad()
                loss_fn(model(xb), yb).backward()
                opt.step()
                seen += len(xb)
    finally:
        dist.destroy_process_group()
    return seen


def data_job_wall(kind: str, epochs: int, rows: int) -> float:
    """One data-heavy job in this process, with a session of its own: the dataset is written
    first, not timed; the wall is from the launch to the result."""
    from sparkml_dist.config import SparkConfig
    from sparkml_dist.spark import build_session

    spark = build_session(SparkConfig(master="local[2]", app_name=f"bench-data-{kind}"))
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        groups = write_dataset(root, rows)
        if kind == "ours_data":
            job = make_job(root, groups, 2, epochs=epochs, hidden=DATA_HIDDEN)
            return ours_wall(spark, job)
        from pyspark.ml.torch.distributor import TorchDistributor

        t0 = time.perf_counter()
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(
            user_dataloader_rank, str(root / "train"), epochs
        )
        return time.perf_counter() - t0


def connect_session():
    """A Spark Connect client of a local server (`local[2]`, started by pyspark in this process's
    JVM), as a Databricks notebook's session is a Connect client of its cluster."""
    import sys

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the server's Python workers: this venv
    return (
        SparkSession.builder.config("spark.connect.grpc.binding.address", "127.0.0.1")
        .remote("local[2]")
        .getOrCreate()
    )


def cold_wall(kind: str, epochs: int, rows: int) -> float:
    """One 2-rank job in a fresh process with its own Spark session: every Python process it
    trains in starts cold, ours (Spark's Python workers) as TorchDistributor's (torchrun's). The
    time is from the job's start to its end; the session's start is not in it."""
    return cold_figures("bench.scaling", kind, epochs, rows)["WALL"]


def one_cold_job(kind: str, epochs: int, rows: int) -> None:
    from sparkml_dist.config import SparkConfig
    from sparkml_dist.spark import build_session

    make_bench_importable()
    if kind in ("ours_data", "dataloader"):
        print(f"WALL {data_job_wall(kind, epochs, rows):.3f}", flush=True)
        return
    if kind == "ours_connect":
        spark = connect_session()
    else:
        spark = build_session(SparkConfig(master="local[2]", app_name=f"bench-cold-{kind}"))
        spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        job = make_job(root, write_dataset(root, rows, row_group=2048), 2, epochs=epochs)
        wall = distributor_wall(job) if kind == "distributor" else ours_wall(spark, job)
    print(f"WALL {wall:.3f}", flush=True)
    spark.stop()


def main(
    rows: int = 60_000, spark=None, long_epochs: int = LONG_EPOCHS, only: str | None = None
) -> list[dict]:
    """Every row; `only="scaling"` or `"distributor"` for one half (the second is 12 cold jobs)."""
    from sparkml_dist.config import SparkConfig
    from sparkml_dist.spark import build_session

    make_bench_importable()  # torchrun children of TorchDistributor import this module by name
    rows_out = []
    if only in (None, "scaling"):
        spark = spark or build_session(SparkConfig(master="local[2]", app_name="bench-scaling"))
        spark.sparkContext.setLogLevel("ERROR")
        rows_out += scaling_rows(spark, rows)
    if only in (None, "distributor"):
        rows_out += distributor_rows(rows, long_epochs)
    if only in (None, "data"):
        rows_out += data_rows()
    if only in (None, "connect"):
        rows_out += connect_rows(rows)
    record(rows_out)
    return rows_out


def scaling_rows(spark, rows: int, rounds: int = SCALING_ROUNDS) -> list[dict]:
    """DDP's 2 ranks against twice one rank, against the same two processes with no communication
    (the machine's ceiling), and against the two keeping in step with no gradients (the ceiling of
    any synchronous data parallelism here): all five measured in turn, the order reversed every
    other round, since the machine drifts between rounds."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        groups = write_dataset(root, rows, row_group=2048)
        one, two = make_job(root, groups, 1, epochs=2), make_job(root, groups, 2, epochs=2)
        two_gloo = make_job(root, groups, 2, epochs=2, allreduce="process_group")
        measure = {
            "ddp": lambda: throughput(spark, two, 2),
            "gloo": lambda: throughput(spark, two_gloo, 2),
            "ideal": lambda: 2 * throughput(spark, one, 1),
            "ceiling": lambda: no_comm_throughput(spark, one),
            "lockstep": lambda: lockstep_throughput(spark, two),
        }
        runs = {name: [] for name in measure}
        for i in range(rounds):
            for name in in_turn(list(measure), i):
                runs[name].append(measure[name]())
    ddp, gloo, ideal, ceiling, lockstep = (Measured(runs[name]) for name in measure)
    model = (
        f"MLP 32-1024-1024-1, {rows:,} rows, batch 1024 per rank, 1 thread per rank, the second epoch's rate"
    )
    return [
        entry(
            "train_scaling_2_ranks",
            ddp,
            ideal,
            "samples/s",
            "higher",
            0.9,
            note=f"{model}; baseline = 2 x one rank",
        ),
        entry(
            "train_scaling_2_ranks_no_comm_ceiling",
            ceiling,
            ideal,
            "samples/s",
            "higher",
            None,
            note=f"{model}; two ranks training at once with no communication vs 2 x one rank: what this machine "
            "leaves two ranks",
        ),
        entry(
            "train_scaling_2_ranks_vs_no_comm_ceiling",
            ddp,
            ceiling,
            "samples/s",
            "higher",
            0.95,
            note=f"{model}; DDP's 2 ranks vs the same two processes with no communication",
        ),
        entry(
            "train_scaling_2_ranks_lockstep_vs_no_comm_ceiling",
            lockstep,
            ceiling,
            "samples/s",
            "higher",
            None,
            note=f"{model}; DDP's 2 ranks meeting at the barrier at every gradient bucket but exchanging no "
            "gradients vs the no-communication pair: what keeping in step alone costs here",
        ),
        entry(
            "train_scaling_2_ranks_vs_lockstep_ceiling",
            ddp,
            lockstep,
            "samples/s",
            "higher",
            0.95,
            note=f"{model}; DDP's 2 ranks vs the same ranks keeping in step without gradients: what moving "
            "the gradients costs",
        ),
        entry(
            "train_scaling_2_ranks_gloo_vs_no_comm_ceiling",
            gloo,
            ceiling,
            "samples/s",
            "higher",
            None,
            note=f"{model}; DDP's 2 ranks averaging through gloo's allreduce "
            "(train.intra_host_allreduce=process_group) vs the same ceiling",
        ),
    ]


def distributor_rows(rows: int, long_epochs: int) -> list[dict]:
    setup = "same rank function and data, both cold (a fresh process each); TorchDistributor(num_processes=2, local_mode=False)"
    o, b = alternate(lambda: cold_wall("ours", 1, rows), lambda: cold_wall("distributor", 1, rows))
    out = [entry("train_vs_torch_distributor_1_epoch", o, b, "s", "lower", None, note=f"{setup}; 1 epoch")]
    o, b = alternate(
        lambda: cold_wall("ours", long_epochs, rows), lambda: cold_wall("distributor", long_epochs, rows)
    )
    out.append(
        entry(
            "train_vs_torch_distributor",
            o,
            b,
            "s",
            "lower",
            0.5,
            note=f"{setup}; {long_epochs} epochs (over a minute of training)",
        )
    )
    return out


def connect_rows(rows: int) -> list[dict]:
    """What a launch costs over Spark Connect: the same 1-epoch job, both cold, launched through
    a Connect client (the ranks meet through Spark's allGather) and through a classic session."""
    o, b = alternate(lambda: cold_wall("ours_connect", 1, rows), lambda: cold_wall("ours", 1, rows))
    note = (
        f"run_barrier of the same rank function (DDP, MLP 32-1024-1024-1, {rows:,} rows, 1 epoch, 2 ranks), "
        "both cold (a fresh process each), timed from the launch to the result: over a Spark Connect "
        "client of a local server vs a classic local[2] session"
    )
    return [
        entry("train_over_connect_vs_classic_1_epoch", o, b, "s", "lower", None, note=note),
        pipeline_over_connect_row(),
    ]


PIPELINE_EPOCHS = 2


def pipeline_wall(remote: bool, stage_seconds: list[dict[str, float]]) -> float:
    """The Adult pipeline as a user runs it (`python -m sparkml_dist.cli pipeline --config
    conf/adult.yaml`), cold, timed from the command's start to its exit (the session's start in it),
    over a local Spark Connect server (`SPARK_REMOTE=local[2]`) or a classic `local[2]` session.
    Its stages' own seconds (summary.json) are appended to `stage_seconds`."""
    import json
    import subprocess
    import sys

    config = Path(__file__).resolve().parents[1] / "conf" / "adult.yaml"
    with tempfile.TemporaryDirectory() as tmp:
        sets = [
            f"output.root={tmp}/out",
            f"tracking.tracking_uri=sqlite:///{tmp}/mlflow.db",
            f"train.epochs={PIPELINE_EPOCHS}",
            "spark.master=local[2]",
        ]
        env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
        if remote:
            env["SPARK_REMOTE"] = "local[2]"
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "sparkml_dist.cli", "pipeline", "--config", str(config)]
            + [arg for o in sets for arg in ("--set", o)],
            env=env,
            check=True,
            capture_output=True,
            cwd=tmp,
        )
        wall = time.perf_counter() - t0
        stage_seconds.append(json.loads(Path(tmp, "out", "summary.json").read_text())["seconds"])
    return wall


def pipeline_over_connect_row() -> dict:
    """The whole pipeline over Spark Connect against a classic session, alternated, both cold."""
    connect: list[dict[str, float]] = []
    classic: list[dict[str, float]] = []
    o, b = alternate(lambda: pipeline_wall(True, connect), lambda: pipeline_wall(False, classic))

    def medians(runs: list[dict[str, float]]) -> str:
        return ", ".join(f"{k} {sorted(r[k] for r in runs)[len(runs) // 2]:.1f}" for k in runs[0])

    note = (
        f"`SPARK_REMOTE=local[2] python -m sparkml_dist.cli pipeline --config conf/adult.yaml` ({PIPELINE_EPOCHS} "
        "epochs, 2 DDP ranks) against the same command on a classic local[2] session, both cold, from the "
        f"command's start to its exit; median stage seconds over Connect: {medians(connect)}; classic: "
        f"{medians(classic)}"
    )
    return entry("pipeline_over_connect_vs_classic", o, b, "s", "lower", None, note=note)


def data_rows(rows: int = DATA_ROWS, epochs: int = DATA_EPOCHS) -> list[dict]:
    o, b = alternate(
        lambda: cold_wall("ours_data", epochs, rows), lambda: cold_wall("dataloader", epochs, rows)
    )
    note = (
        f"{rows:,} rows x {DIM} in Parquet, MLP {DIM}-{'-'.join(map(str, DATA_HIDDEN))}-1, batch {DATA_BATCH} "
        f"per rank, {epochs} epochs, 2 ranks x 1 thread, both cold (a fresh process each): our rank loop "
        "(run_barrier, the Parquet streamed by ShardLoader) vs TorchDistributor(num_processes=2, local_mode=False) "
        "running a function that reads the files into a TensorDataset with a DistributedSampler and a DataLoader"
    )
    return [entry("train_vs_torch_distributor_dataloader_2m", o, b, "s", "lower", 1.0, note=note)]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--cold",
        choices=["ours", "distributor", "ours_data", "dataloader", "ours_connect"],
        help="run one job in this process and print WALL s",
    )
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--rows", type=int, default=60_000)
    parser.add_argument(
        "--only", choices=["scaling", "distributor", "data", "connect"], help="one part of the rows"
    )
    args = parser.parse_args()
    one_cold_job(args.cold, args.epochs, args.rows) if args.cold else main(args.rows, only=args.only)
