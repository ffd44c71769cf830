"""Ray Train on Spark as a peer: the same rank function (`train_rank`, DDP over gloo), model
(bench.scaling's compute-bound MLP), data (60,000 rows of Parquet) and ranks (2, one thread
each), launched by our barrier launcher vs by Ray Train's `TorchTrainer` on a Ray cluster that
`ray.util.spark.setup_ray_cluster` starts inside the same Spark application: how a pyspark user
runs Ray Train (Ray's "Ray on Spark" guide: `ray[default]`, a fixed-size cluster of one Ray
worker node per Spark task slot, then `ray.init()`).

Both cold: each measurement is a fresh process with its own `local[2]` session, timed from the
launch (ours: the barrier stage; Ray: `setup_ray_cluster`) to the trained result (Ray:
`TorchTrainer.fit` returning; the cluster's shutdown after it is not counted). The session's own
start is not in either. The epoch time is the median epoch of rank 0's records on both sides.

Ray is not part of `make setup`; install the bench extra first:

    .venv/bin/pip install -c requirements/constraints.txt -e '.[bench]'
    .venv/bin/python -m bench.ray_train
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from bench.common import Measured, alternate, cold_figures, entry, make_bench_importable, record, scratch_dir
from bench.loader import write_dataset
from bench.scaling import make_job

ROOT = Path(__file__).resolve().parents[1]
EPOCHS = 4  # about 13 s of training on 2 ranks here: start-up is not all there is to it


def ray_available() -> bool:
    try:
        import ray.train.torch
        import ray.util.spark  # noqa: F401
    except ImportError:
        return False
    return True


def median_epoch_s(records) -> float:
    return statistics.median(r.samples / r.samples_per_s for r in records)


def ours(spark, job) -> tuple[float, float]:
    from sparkml_dist.launch import TorchBackend, run_barrier
    from sparkml_dist.train.loop import train_rank

    t0 = time.perf_counter()
    results = run_barrier(spark, train_rank, job, 2, TorchBackend())
    return time.perf_counter() - t0, median_epoch_s(results[0].records)


def ray_rank(config: dict) -> None:
    """What each Ray Train worker runs: the same rank function, in the process group Ray Train
    made (gloo), with the rank layout from Ray Train's context."""
    import ray.train

    from sparkml_dist.launch.context import RankContext
    from sparkml_dist.train.loop import train_rank

    rt = ray.train.get_context()
    ctx = RankContext(
        rt.get_world_rank(),
        rt.get_world_size(),
        rt.get_local_rank(),
        rt.get_local_world_size(),
        rt.get_node_rank(),
        1,
        "127.0.0.1",
        os.environ.get("MASTER_ADDR", "127.0.0.1"),
        int(os.environ.get("MASTER_PORT", "0")),
    )
    result = train_rank(ctx, config["job"])
    if result.records:  # rank 0's; Ray Train keeps reported metrics only with a checkpoint, so a file
        Path(config["epoch_file"]).write_text(str(median_epoch_s(result.records)))
    ray.train.report({})


def on_ray(spark, job) -> tuple[float, float]:
    """Cold: the Ray cluster started for this job, then the job; timed from the cluster's start."""
    t0 = time.perf_counter()
    with ray_on_spark():
        print(
            f"SETUP {time.perf_counter() - t0:.3f}", flush=True
        )  # where Ray's time goes (docs/benchmarks.md)
        _, epoch = fit_on_ray(job)
        wall = time.perf_counter() - t0
    return wall, epoch


@contextmanager
def ray_on_spark():
    """A Ray cluster inside the active Spark application, as Ray's "Ray on Spark" guide starts it
    (two Ray worker nodes, each a long-running Spark task on a slot of its own), connected, and shut down on exit."""
    import ray
    from ray.util.spark import setup_ray_cluster, shutdown_ray_cluster

    setup_ray_cluster(max_worker_nodes=2)
    try:
        ray.init(runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}})
        yield
    finally:
        shutdown_ray_cluster()


def fit_on_ray(job) -> tuple[float, float]:
    """One `TorchTrainer.fit` of the rank function on the running Ray cluster: (s from the
    trainer's creation to fit returning, rank 0's median epoch s)."""
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    epoch_file = Path(job.checkpoint_dir) / "epoch_s"
    epoch_file.unlink(missing_ok=True)
    t0 = time.perf_counter()
    trainer = TorchTrainer(
        ray_rank,
        train_loop_config={"job": job, "epoch_file": str(epoch_file)},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
    )
    trainer.fit()
    return time.perf_counter() - t0, float(epoch_file.read_text())


def cold(kind: str, epochs: int, rows: int) -> tuple[float, float]:
    """One job in a fresh process (`--cold`): (wall s, median epoch s)."""
    figures = cold_figures("bench.ray_train", kind, epochs, rows)
    return figures["WALL"], figures["EPOCH"]


def one_cold_job(kind: str, epochs: int, rows: int) -> None:
    from sparkml_dist.config import SparkConfig
    from sparkml_dist.spark import build_session

    make_bench_importable()
    # Ray on Spark starts its nodes (in the driver and in Spark's Python workers) with the `ray`
    # script found on PATH: the venv's, as an activated venv has it, before the JVM starts
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    spark = build_session(SparkConfig(master="local[2]", app_name=f"bench-ray-{kind}"))
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        job = make_job(root, write_dataset(root, rows, row_group=2048), 2, epochs=epochs)
        job = replace(job, checkpoint_dir=scratch_dir())
        wall, epoch = ours(spark, job) if kind == "ours" else on_ray(spark, job)
    print(f"WALL {wall:.3f} EPOCH {epoch:.3f}", flush=True)
    spark.stop()


def warm_jobs(epochs: int, rows: int, rounds: int = 3) -> None:
    """Both sides warm, in this process: one session and one Ray cluster inside it
    brought up first, each side run once unrecorded, then `rounds` alternated jobs, each with
    fresh checkpoints; prints each side's (wall s, median epoch s) per job (`--warm`)."""
    from sparkml_dist.config import SparkConfig
    from sparkml_dist.spark import build_session

    make_bench_importable()
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    # Ray on Spark's worker nodes are Spark tasks that hold their slots while the cluster is up:
    # two slots more than local[2] for them, so our barrier stage gets its two (the Ray nodes idle
    # while ours trains, as our ranks are gone while Ray's train)
    spark = build_session(SparkConfig(master="local[4]", app_name="bench-ray-warm"))
    spark.sparkContext.setLogLevel("ERROR")
    runs: dict[str, list[tuple[float, float]]] = {"ours": [], "ray": []}
    with tempfile.TemporaryDirectory() as tmp, ray_on_spark():
        root = Path(tmp)
        job = make_job(root, write_dataset(root, rows, row_group=2048), 2, epochs=epochs)
        fresh = lambda: replace(job, checkpoint_dir=scratch_dir())  # noqa: E731 (no resuming a run before)
        alternate(
            lambda: _keep(runs["ours"], ours(spark, fresh())),
            lambda: _keep(runs["ray"], fit_on_ray(fresh())),
            rounds=rounds,
            warm_up=True,
        )
    # each list's first run is the warm-up, which alternate() ran through the same lambda
    print("WARM " + json.dumps({side: measured[1:] for side, measured in runs.items()}), flush=True)
    spark.stop()


def _setup(rows: int, epochs: int, how: str) -> str:
    """The rows' note: what both sides run, and how (cold, warm)."""
    return (
        f"same rank function, MLP 32-1024-1024-1, {rows:,} rows, 2 ranks x 1 thread, {epochs} epochs, {how}; "
        "Ray: setup_ray_cluster(max_worker_nodes=2) + TorchTrainer(num_workers=2)"
    )


def warm_rows(epochs: int, rows: int) -> list[dict]:
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "bench.ray_train", "--warm", "--epochs", str(epochs), "--rows", str(rows)],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=ROOT,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("WARM ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"bench.ray_train --warm failed: {done.stderr[-3000:]}")
    runs = json.loads(lines[-1].removeprefix("WARM "))

    def figures(side: str, which: int) -> Measured:  # which: 0 the wall time, 1 the median epoch
        return Measured([run[which] for run in runs[side]])

    warm = _setup(
        rows, epochs, "both warm: one session and one Ray cluster up first, each side once unrecorded"
    )
    return [
        entry(
            "train_vs_ray_train_warm",
            figures("ours", 0),
            figures("ray", 0),
            "s",
            "lower",
            0.9,
            note=f"{warm}; ours from run_barrier, Ray from TorchTrainer's creation to fit returning",
        ),
        entry(
            "train_vs_ray_train_warm_epoch",
            figures("ours", 1),
            figures("ray", 1),
            "s/epoch",
            "lower",
            1.0,
            note=f"{warm}; median epoch",
        ),
    ]


def main(rows: int = 60_000, epochs: int = EPOCHS) -> list[dict]:
    if not ray_available():
        print(
            "bench.ray_train: skipped (Ray is not installed: .venv/bin/pip install -c requirements/constraints.txt "
            "-e '.[bench]')",
            flush=True,
        )
        return []
    make_bench_importable()
    runs: dict[str, list[tuple[float, float]]] = {"ours": [], "ray": []}
    alternate(
        lambda: _keep(runs["ours"], cold("ours", epochs, rows)),
        lambda: _keep(runs["ray"], cold("ray", epochs, rows)),
    )
    setup = _setup(rows, epochs, "both cold")
    rows_out = [
        entry(
            "train_vs_ray_train",
            Measured([w for w, _ in runs["ours"]]),
            Measured([w for w, _ in runs["ray"]]),
            "s",
            "lower",
            0.75,
            note=f"{setup}; end to end",
        ),
        entry(
            "train_vs_ray_train_epoch",
            Measured([e for _, e in runs["ours"]]),
            Measured([e for _, e in runs["ray"]]),
            "s/epoch",
            "lower",
            None,
            note=f"{setup}; median epoch",
        ),
    ]
    rows_out += warm_rows(epochs, rows)
    record(rows_out)
    return rows_out


def _keep(runs: list, measured: tuple[float, float]) -> float:
    runs.append(measured)
    return measured[0]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--cold", choices=["ours", "ray"], help="run one job in this process and print WALL and EPOCH"
    )
    parser.add_argument(
        "--warm", action="store_true", help="run both sides warm in this process and print WARM lines"
    )
    parser.add_argument("--warm-only", action="store_true", help="measure and record only the warm rows")
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--rows", type=int, default=60_000)
    args = parser.parse_args()
    if args.cold:
        one_cold_job(args.cold, args.epochs, args.rows)
    elif args.warm:
        warm_jobs(args.epochs, args.rows)
    elif args.warm_only:
        record(warm_rows(args.epochs, args.rows))
    else:
        main(args.rows, args.epochs)
