"""Growth curves: the cost per row of preprocessing and of scoring as the data grows tenfold at a
time (generated Adult-shaped CSV: 1M and 10M training rows, 100M with `--rows 100000000`), beside
Spark's own CSV-to-Parquet copy of the same files as the reference for what reading and writing
alone cost per row at each size.

At each size the three are measured in turn (`in_turn`), `rounds` times, in one session:

- preprocess: the stage as `conf/adult.yaml` runs it on N training + N/10 test rows (rejects,
  fit, encoding, Parquet for the ranks, manifest);
- score: the score stage with a model trained once at the start (Adult, one epoch) over the N
  training rows as raw input (ingest with rejects, the compiled features, the model in the
  Python workers, predictions written and counted);
- copy: Spark reads both CSV inputs with their schema and writes them as Parquet.

`--ranks` (root on Linux: the emulated cluster of sparkml_dist.services.hosts, a master host and
two worker hosts of two cores each): training throughput at 1, 2 and 4 ranks, `jobs/train.py` on
300,000 generated rows, the median of each run's epochs after the first; `growth_train_<n>_ranks`
puts n ranks' samples/s against n times one rank's.

Rows: `growth_<part>_<size>` (microseconds per row, ours against the copy at the same size, with
the size in `rows` for the plot) and `growth_<part>_per_row_<size>_vs_<smaller>` (our cost per row
at one size against the size ten times smaller: the 1.3 target says it may not grow by more).
`python -m bench.report --write` draws them as docs/img/growth.png.

    .venv/bin/python -m bench.growth                        # 1M and 10M rows (make bench)
    .venv/bin/python -m bench.growth --rows 100000000       # adds 100M rows (make bench-scale)
    .venv/bin/python -m bench.growth --ranks --no-sizes     # only the ranks (root)
"""

from __future__ import annotations

import argparse
import itertools
import re
import tempfile
import time
from dataclasses import dataclass

from bench.common import Measured, entry, in_turn, record
from bench.preprocess import CONFIG, ours, plain_spark_io

SIZES = (1_000_000, 10_000_000)
RANKS = (1, 2, 4)
TRAIN_ROWS, TRAIN_EPOCHS = 300_000, 3
MIN_SCALING = 0.8  # n ranks' rate against n times one rank's
PARTS = ("preprocess", "score")
MAX_GROWTH = 1.3  # cost per row at 10x the rows, against the smaller size


@dataclass(frozen=True)
class Point:
    """One size's medians, in microseconds per input row."""

    rows: int
    preprocess: Measured
    score: Measured
    copy: Measured


def label(rows: int) -> str:
    return f"{rows // 1_000_000}m" if rows % 1_000_000 == 0 else f"{rows // 1000}k"


def trained_model(spark, root: str):
    """The config the stages run with and a model to score with: Adult, one epoch."""
    from sparkml_dist.config import load_config
    from sparkml_dist.stages import preprocess, train
    from sparkml_dist.tracking.client import tracked_run

    cfg = load_config(
        CONFIG,
        [f"output.root={root}/model", f"tracking.tracking_uri=sqlite:///{root}/mlflow.db", "train.epochs=1"],
    )
    prepared = preprocess(spark, cfg)
    with tracked_run(cfg.tracking, "bench-growth", cfg.flat_params()) as run:
        return cfg, train(spark, cfg, prepared, run).model_uri


def scored_us_per_row(spark, cfg, model_uri: str, rows_csv: str, out: str) -> float:
    from sparkml_dist.stages import score

    t0 = time.perf_counter()
    result = score(spark, cfg, model_uri, input_path=rows_csv, output_path=out)
    return (time.perf_counter() - t0) * 1e6 / result.input_rows


def measure(spark, cfg, model_uri: str, rows: int, rounds: int, root: str) -> Point:
    from sparkml_dist.data.generate import adult_like, write_csv

    train, test = f"{root}/train_csv", f"{root}/test_csv"
    write_csv(adult_like(spark, rows, seed=1), train, 8)
    write_csv(adult_like(spark, max(rows // 10, 1000), seed=2), test, 2)
    sides = {
        "preprocess": lambda: 1e6 / ours(spark, train, test, f"{root}/ours"),
        "score": lambda: scored_us_per_row(spark, cfg, model_uri, train, f"{root}/scored"),
        "copy": lambda: 1e6 / plain_spark_io(spark, train, test, f"{root}/copy"),
    }
    runs: dict[str, list[float]] = {name: [] for name in sides}
    for i in range(rounds):
        for name in in_turn(list(sides), i):
            runs[name].append(sides[name]())
            print(
                f"[growth] {label(rows)} rows, round {i + 1}/{rounds}: {name} {runs[name][-1]:.2f} µs/row",
                flush=True,
            )
    return Point(rows, **{name: Measured(r) for name, r in runs.items()})


def rows_of(points: list[Point]) -> list[dict]:
    out = []
    for p in points:
        for part in PARTS:
            row = entry(
                f"growth_{part}_{label(p.rows)}",
                getattr(p, part),
                p.copy,
                "µs/row",
                "lower",
                None,
                note=f"{p.rows:,} generated Adult-shaped rows; baseline: Spark's CSV-to-Parquet copy "
                "of the same files",
            )
            out.append({**row, "rows": p.rows})
    for smaller, larger in itertools.pairwise(points):
        for part in PARTS:
            out.append(
                entry(
                    f"growth_{part}_per_row_{label(larger.rows)}_vs_{label(smaller.rows)}",
                    getattr(larger, part),
                    getattr(smaller, part),
                    "µs/row",
                    "lower",
                    MAX_GROWTH,
                    note=f"our {part} cost per row at {larger.rows:,} rows against {smaller.rows:,}",
                )
            )
    return out


@dataclass(frozen=True)
class RankRun:
    """One training run's median samples/s over its epochs after the first, and its last epoch's
    mean step by part (data, compute, comm, optimizer, total), in ms, over its ranks."""

    samples_per_s: float
    step_ms: dict[str, float]


def train_rates(spark, rounds: int) -> dict[int, list[RankRun]]:
    """Each of `RANKS` on the emulated cluster, `rounds` runs, the rank counts taken in turn."""
    import sys

    from bench.host_loss import ROOT, SHARED, WORKDIR, submit
    from sparkml_dist.data.generate import adult_like, write_csv
    from sparkml_dist.services.hosts import create_hosts, start_spark

    train_csv, test_csv = SHARED / "growth_train_csv", SHARED / "growth_test_csv"
    cluster = create_hosts(WORKDIR, 3, SHARED, keep=[str(ROOT), sys.prefix])
    try:
        start_spark(cluster, cores=2)
        write_csv(adult_like(spark, TRAIN_ROWS, seed=1), str(train_csv), 8)
        write_csv(adult_like(spark, TRAIN_ROWS // 10, seed=2), str(test_csv), 2)
        data = [f"data.train_path={train_csv}", f"data.test_path={test_csv}", f"train.num_ranks={max(RANKS)}"]
        _run_job(cluster, submit(cluster, "jobs/preprocess.py", *data))
        runs: dict[int, list[RankRun]] = {n: [] for n in RANKS}
        for i in range(rounds):
            for n in in_turn(list(RANKS), i):
                job = submit(
                    cluster, "jobs/train.py", *data, f"train.num_ranks={n}", f"train.epochs={TRAIN_EPOCHS}"
                )
                # one 1-core executor a rank, two on each worker host: 1g each fits the workers' 4g
                job[1:1] = ["--conf", f"spark.cores.max={max(RANKS)}", "--conf", "spark.executor.memory=1g"]
                _run_job(cluster, job)
                runs[n].append(_last_run(SHARED / "mlflow.db"))
    finally:
        cluster.stop()
    return runs


def _run_job(cluster, argv: list[str]) -> None:
    from bench.host_loss import SHARED

    done = cluster.run(0, argv, capture_output=True, text=True, cwd=SHARED, timeout=1800)
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "Error" in line or "error:" in line]
        raise RuntimeError("\n".join(errors[-20:]) or done.stderr[-3000:])


def _last_run(db) -> RankRun:
    """The newest run's rate (start-up excluded) and where its steps' time went."""
    import statistics

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{db}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    run = client.search_runs(experiments, order_by=["attributes.start_time DESC"], max_results=1)[0]
    history = sorted(client.get_metric_history(run.info.run_id, "samples_per_s"), key=lambda m: m.step)
    by_part: dict[str, list[float]] = {}
    for key, value in run.data.metrics.items():  # step_<part>_ms_rank<N>: the last epoch's
        part = re.fullmatch(r"step_(data|compute|comm|optimizer|total)_ms_rank\d+", key)
        if part:
            by_part.setdefault(part.group(1), []).append(value)
    return RankRun(
        statistics.median(m.value for m in history[1:] or history),
        {part: round(statistics.mean(values), 2) for part, values in sorted(by_part.items())},
    )


def train_rows(runs: dict[int, list[RankRun]]) -> list[dict]:
    """`growth_train_<n>_ranks`: n ranks' samples/s against n x one rank's, with the median run's
    step breakdown (`step_ms`), which says whether compute or communication took the time."""
    one = [r.samples_per_s for r in runs[min(runs)]]
    rows = []
    for n, measured in sorted(runs.items()):
        rate = Measured([r.samples_per_s for r in measured])
        median_run = min(measured, key=lambda r: abs(r.samples_per_s - rate))
        row = entry(
            f"growth_train_{n}_ranks",
            rate,
            Measured([n * r for r in one]),
            "samples/s",
            "higher",
            MIN_SCALING if n > 1 else None,
            note=f"jobs/train.py, {TRAIN_ROWS:,} generated Adult-shaped rows, the median epoch after "
            f"the first; {n} ranks on the emulated cluster (2 worker hosts x 2 cores) against "
            f"{n} x one rank; mean ms a step: "
            + ", ".join(f"{part} {ms:g}" for part, ms in median_run.step_ms.items()),
        )
        rows.append({**row, "ranks": n, "step_ms": median_run.step_ms})
    return rows


def main(sizes=SIZES, spark=None, rounds: int = 2, ranks: bool = False) -> list[dict]:
    from sparkml_dist.config import SparkConfig
    from sparkml_dist.spark import build_session

    spark = spark or build_session(SparkConfig(master="local[2]", app_name="bench-growth"))
    spark.sparkContext.setLogLevel("ERROR")
    rows_out = []
    if sizes:
        with tempfile.TemporaryDirectory() as tmp:
            cfg, model_uri = trained_model(spark, tmp)
            points = []
            for rows in sorted(sizes):
                with tempfile.TemporaryDirectory(dir=tmp) as root:
                    points.append(measure(spark, cfg, model_uri, rows, rounds, root))
        rows_out += rows_of(points)
    if ranks:
        rows_out += train_rows(train_rates(spark, rounds))
    record(rows_out)
    return rows_out


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, action="append", help="a size beyond 1M and 10M rows")
    parser.add_argument("--no-sizes", action="store_true", help="skip preprocessing and scoring")
    parser.add_argument("--ranks", action="store_true", help="training at 1, 2, 4 ranks (root)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    sizes = () if args.no_sizes else tuple(sorted({*SIZES, *(args.rows or [])}))
    main(sizes, rounds=args.rounds, ranks=args.ranks)
