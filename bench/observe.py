"""The cost of watching the cost: 2-rank DDP training with the run's observation on (system
samples every second, the step-time breakdown with its timed DDP comm hook, energy) vs all of it
off, on the same job, alternated. Small steps (an MLP 32-256-256-1, batch 256) are where a
per-step cost would show most.

    .venv/bin/python -m bench.observe
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from bench.common import alternate, entry, record, scratch_dir
from bench.loader import DIM, write_dataset

HIDDEN = (256, 256)


def job(root: Path, groups, observe):
    from sparkml_dist.methods import get_method
    from sparkml_dist.models.spec import ModelSpec
    from sparkml_dist.train.job import TrainJob

    ddp = get_method("ddp")
    cfg = ddp.config(
        num_ranks=2, epochs=2, batch_size=256, threads_per_rank=1, device="cpu", log_every_steps=10_000
    )
    return TrainJob(
        str(root),
        tuple(groups),
        tuple(groups[:1]),
        ModelSpec("mlp", DIM, 0.0, HIDDEN),
        cfg,
        scratch_dir(),
        placement=ddp.placement,
        observe=observe,
    )


def throughput(spark, payload) -> float:
    """Samples/s over both epochs (the second runs with every Python worker and hook warm)."""
    from sparkml_dist.launch import TorchBackend, run_barrier
    from sparkml_dist.train.loop import train_rank

    records = run_barrier(
        spark, train_rank, replace(payload, checkpoint_dir=scratch_dir()), 2, TorchBackend()
    )[0].records
    return sum(r.samples for r in records) / sum(r.samples / r.samples_per_s for r in records)


def main(rows: int = 200_000, spark=None) -> list[dict]:
    from sparkml_dist.config import ObserveConfig, SparkConfig
    from sparkml_dist.spark import build_session

    spark = spark or build_session(SparkConfig(master="local[2]", app_name="bench-observe"))
    on = ObserveConfig(system_metrics_interval_s=1.0)
    off = ObserveConfig(system_metrics_interval_s=0.0, step_breakdown=False)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        groups = write_dataset(root, rows)
        watched, plain = job(root, groups, on), job(root, groups, off)
        throughput(spark, plain)  # warm the Python workers for both
        o, b = alternate(lambda: throughput(spark, watched), lambda: throughput(spark, plain), rounds=5)
    rows_out = [
        entry(
            "observe_overhead_2_ranks",
            o,
            b,
            "samples/s",
            "higher",
            0.98,
            note=f"DDP, MLP 32-{'-'.join(map(str, HIDDEN))}-1, batch 256, {rows:,} rows x 2 epochs, 1 thread "
            "per rank; ours = system samples every 1 s + step breakdown + energy, baseline = all off",
        )
    ]
    record(rows_out)
    return rows_out


if __name__ == "__main__":
    main()
