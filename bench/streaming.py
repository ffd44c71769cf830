"""Continuous scoring (`sparkml-dist stream`) against batch scoring (`sparkml-dist score`) of the
same files with the same champion, and the latency from a file's arrival to its scored output.

- stream_vs_batch_scoring: rows/s of a whole `stream.trigger=available_now` run (query start,
  the registry lookup, parsing, checks, scoring, the per-batch commit) against the batch score
  stage on the same CSV files, alternated. Target >= 0.8.
- stream_latency_p50 / _p95: a 100-row file is moved into the watched directory while the query
  runs with a 1 s trigger; the time until its rows are in `scored/`. The "baseline" column is
  the trigger interval, for scale (a file waits up to one interval for the next micro-batch).
- stream_over_connect_vs_classic: the stream command as a user runs it, cold, over a local Spark
  Connect server (`SPARK_REMOTE=local[2]`) against a classic local[2] session, alternated: its
  wall time, and (`..._batches`) the seconds of its micro-batches after the first (the model
  loaded on both sides: what each further micro-batch costs over Connect).

    .venv/bin/python -m bench.streaming [--rows 200000] [--files 20] [--only connect]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import yaml

from bench.common import Measured, alternate, entry, record
from bench.preprocess import CONFIG

TRIGGER_S = 1.0


def champion(spark, root: str, rows: int):
    """conf/adult.yaml's pipeline, trained 1 epoch on generated Adult-shaped rows, registered
    and made champion in a registry of its own; its config."""
    from sparkml_dist.config import load_config
    from sparkml_dist.data.generate import adult_like, write_csv
    from sparkml_dist.stages import preprocess, train
    from sparkml_dist.tracking.client import tracked_run
    from sparkml_dist.tracking.models import register

    write_csv(adult_like(spark, 50_000, seed=5), f"{root}/train", 2)
    cfg = load_config(
        CONFIG,
        [
            f"data.train_path={root}/train",
            f"data.test_path={root}/train",
            f"output.root={root}/out",
            f"tracking.tracking_uri=sqlite:///{root}/mlflow.db",
            "train.epochs=1",
            "train.num_ranks=1",
        ],
    )
    with tracked_run(cfg.tracking, "bench", {}) as run:
        trained = train(spark, cfg, preprocess(spark, cfg), run)
        version = register(run, trained.model_uri, cfg.tracking.registered_model, {})
        run.client().set_registered_model_alias(cfg.tracking.registered_model, "champion", version)
    return cfg


def throughput(spark, cfg, root: str, rows: int) -> tuple[float, float]:
    from sparkml_dist.data.generate import adult_like, write_csv
    from sparkml_dist.stages.score import score
    from sparkml_dist.stages.stream import stream

    write_csv(adult_like(spark, rows, seed=9), f"{root}/incoming", 8)
    runs = iter(range(1000))

    def streamed() -> float:
        out = f"{root}/stream-{next(runs)}"  # a fresh checkpoint: every file is new to it
        t0 = time.perf_counter()
        result = stream(spark, cfg.with_overrides("stream.trigger=available_now"), f"{root}/incoming", out)
        seconds = time.perf_counter() - t0
        assert result.total("input_rows") == rows, result
        return rows / seconds

    def batch() -> float:
        t0 = time.perf_counter()
        result = score(spark, cfg, None, f"{root}/incoming", f"{root}/batch")
        seconds = time.perf_counter() - t0
        assert result.input_rows == rows, result
        return rows / seconds

    return alternate(streamed, batch)


def latency(spark, cfg, root: str, files: int) -> list[float]:
    """Seconds from a 100-row file's arrival to its rows in the output, one file at a time, each
    dropped at a random phase of the trigger."""
    from sparkml_dist.stages.stream import stream

    incoming, staging, out = Path(root, "live"), Path(root, "live-staging"), Path(root, "live-out")
    incoming.mkdir()
    staging.mkdir()
    source = next(f for f in sorted(Path(root, "incoming").iterdir()) if f.name.startswith("part-"))
    lines = [line for line in source.read_text().splitlines() if line.strip()][: 100 * files]
    stop, failed = threading.Event(), []

    def run() -> None:
        try:
            stream(
                spark,
                cfg.with_overrides(f"stream.interval={TRIGGER_S} seconds"),
                str(incoming),
                str(out),
                stop=stop,
            )
        except BaseException as exc:
            failed.append(exc)

    query = threading.Thread(target=run, daemon=True)
    query.start()
    rng = random.Random(3)
    waits = []
    try:
        for i in range(files):
            time.sleep(rng.uniform(0.0, TRIGGER_S))
            staged = staging / f"f{i}.csv"
            staged.write_text("\n".join(lines[i * 100 : (i + 1) * 100]) + "\n")
            arrived = time.perf_counter()
            os.replace(staged, incoming / staged.name)
            while _scored_rows(out) < (i + 1) * 100:
                if failed:
                    raise failed[0]
                time.sleep(0.01)
            waits.append(time.perf_counter() - arrived)
    finally:
        stop.set()
        query.join(timeout=120)
    return waits


CONNECT_FILES_PER_BATCH = 2  # of the 8 input files: 4 micro-batches a run


def over_connect(cfg, root: str, rows: int) -> list[dict]:
    config = Path(root, "stream.yaml")
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_unset=True)))
    runs = iter(range(1000))
    later_batches: dict[bool, list[float]] = {True: [], False: []}

    def command(remote: bool) -> float:
        env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
        if remote:
            env["SPARK_REMOTE"] = "local[2]"
        sets = [
            "stream.trigger=available_now",
            f"stream.max_files_per_trigger={CONNECT_FILES_PER_BATCH}",
            "spark.master=local[2]",
        ]
        t0 = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "sparkml_dist.cli", "stream", "--config", str(config)]
            + ["--input", f"{root}/incoming", "--output", f"{root}/cmd-{next(runs)}"]
            + [arg for o in sets for arg in ("--set", o)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            cwd=root,
        )
        wall = time.perf_counter() - t0
        seconds = [float(s) for s in re.findall(r"^stream: batch \d+: .* in ([\d.]+) s", done.stdout, re.M)]
        assert f"{rows:,} scored" in done.stdout and len(seconds) > 1, done.stdout[-2000:]
        later_batches[remote].append(sum(seconds[1:]))
        return wall

    o, b = alternate(lambda: command(True), lambda: command(False))
    batches, classic_batches = (Measured(later_batches[side]) for side in (True, False))
    note = (
        f"`SPARK_REMOTE=local[2] python -m sparkml_dist.cli stream --input <8 CSV files, {rows:,} "
        f"Adult-shaped rows> --set stream.trigger=available_now --set "
        f"stream.max_files_per_trigger={CONNECT_FILES_PER_BATCH}` against the same command on a classic "
        "local[2] session, both cold, from the command's start to its exit"
    )
    return [
        entry("stream_over_connect_vs_classic", o, b, "s", "lower", None, note=note),
        entry(
            "stream_over_connect_vs_classic_batches",
            batches,
            classic_batches,
            "s",
            "lower",
            None,
            note="the same runs: the seconds of the micro-batches after the first (Spark's trigger "
            "durations), medians; the first loads the model (over Connect, in the server's worker)",
        ),
    ]


def _scored_rows(out: Path) -> int:
    scored = out / "scored"
    if not scored.is_dir():
        return 0
    return sum(pq.read_metadata(f).num_rows for f in scored.glob("batch_id=*/*.parquet"))


def main(rows: int = 200_000, files: int = 20, spark=None, only: str | None = None) -> list[dict]:
    from sparkml_dist.config import SparkConfig
    from sparkml_dist.data.generate import adult_like, write_csv
    from sparkml_dist.spark import build_session

    spark = spark or build_session(SparkConfig(master="local[2]", app_name="bench-streaming"))
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory() as root:
        cfg = champion(spark, root, rows)
        if only == "connect":  # the session's model and files; no other row
            write_csv(adult_like(spark, rows, seed=9), f"{root}/incoming", 8)
            rows_out = over_connect(cfg, root, rows)
            record(rows_out)
            return rows_out
        ours, baseline = throughput(spark, cfg, root, rows)
        waits = latency(spark, cfg, root, files)
        connect = over_connect(cfg, root, rows)
    p50, p95 = statistics.median(waits), statistics.quantiles(waits, n=20)[-1]
    out = [
        entry(
            "stream_vs_batch_scoring",
            ours,
            baseline,
            "rows/s",
            "higher",
            0.8,
            note=f"{rows:,} Adult-shaped rows in 8 CSV files, conf/adult.yaml's model; stream.trigger=available_now "
            f"(a fresh checkpoint per round) vs the score stage, both end to end",
        ),
        entry(
            "stream_latency_p50",
            p50,
            TRIGGER_S,
            "s",
            "lower",
            None,
            note=f"{files} files of 100 rows, each moved in at a random phase of a {TRIGGER_S:g} s trigger; "
            f"arrival to rows readable in scored/; baseline column: the trigger interval",
        ),
        entry(
            "stream_latency_p95",
            p95,
            TRIGGER_S,
            "s",
            "lower",
            None,
            note=f"as stream_latency_p50; {len(waits)} files",
        ),
        *connect,
    ]
    record(out)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--only", choices=["connect"], help="only the Spark Connect rows")
    args = parser.parse_args()
    main(args.rows, args.files, only=args.only)
