"""Serving the champion with MLflow's own tools (README "Serve the champion", docs/serving.md).

- serve_latency_1_row_p50/_p95, serve_latency_100_rows_p50/_p95: a real `mlflow models serve`
  (one worker, `--env-manager local`) answering raw-row JSON requests, timed at the client.
  The "baseline" column is the same request's rows scored in-process by the same pyfunc
  (`mlflow.pyfunc.load_model(...).predict`): the ratio is what HTTP, JSON and the server add.
- pyfunc_raw_vs_spark_scorer: rows/s of the raw-row pyfunc on a pandas DataFrame against this
  project's Spark scorer (compiled feature columns, mapInArrow) on the same rows, one core each
  (one torch thread; one Spark partition, hence one task). Reported, no target.

    .venv/bin/python -m bench.serving [--requests 200] [--rows 200000]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.common import alternate, entry, record, unused_port
from bench.streaming import champion


def _serve(root: str, name: str) -> tuple[subprocess.Popen, int]:
    port = unused_port()
    venv_bin = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{root}/mlflow.db",
        "PATH": os.pathsep.join([venv_bin, os.environ.get("PATH", "")]),
    }
    server = subprocess.Popen(
        [
            f"{venv_bin}/mlflow",
            "models",
            "serve",
            "-m",
            f"models:/{name}@champion",
            "--env-manager",
            "local",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2):
                return server, port
        except OSError:
            time.sleep(0.5)
    os.killpg(server.pid, signal.SIGTERM)
    raise RuntimeError("mlflow models serve did not come up in 180 s")


def _request_ms(port: int, body: bytes) -> float:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/invocations", data=body, headers={"Content-Type": "application/json"}
    )
    t0 = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()
    return (time.perf_counter() - t0) * 1000


def latency(port: int, model, frame, rows: int, requests: int) -> tuple[list[float], list[float]]:
    """(server ms, in-process ms) per request of `rows` rows, `requests` times after a warm-up."""
    body = json.dumps(
        {"dataframe_split": json.loads(frame.head(rows).to_json(orient="split", index=False))}
    ).encode()
    served, local = [], []
    for i in range(requests + 5):
        s = _request_ms(port, body)
        t0 = time.perf_counter()
        model.predict(frame.head(rows))
        if i >= 5:
            served.append(s)
            local.append((time.perf_counter() - t0) * 1000)
    return served, local


def _p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1]


def throughput(spark, cfg, model, frame, csv: str, rows: int) -> tuple[float, float]:
    import torch

    from sparkml_dist.data.ingest import ingest
    from sparkml_dist.stages.score import load_pipeline, scored_rows
    from sparkml_dist.tracking.client import resolve_tracking_uri
    from sparkml_dist.tracking.models import load_bundle

    torch.set_num_threads(1)
    bundle = load_bundle(
        f"models:/{cfg.tracking.registered_model}@champion", resolve_tracking_uri(cfg.tracking)
    )
    pipeline = load_pipeline(bundle)
    with ingest(spark, csv, cfg.data, require_label=False) as raw:
        accepted = raw.accepted.repartition(1).cache()  # one partition: one task, one core
        accepted.count()

        def pyfunc() -> float:
            t0 = time.perf_counter()
            model.predict(frame)
            return rows / (time.perf_counter() - t0)

        def spark_scorer() -> float:
            t0 = time.perf_counter()
            scored_rows(bundle, pipeline, accepted, raw.data).write.format("noop").mode("overwrite").save()
            return rows / (time.perf_counter() - t0)

        result = alternate(pyfunc, spark_scorer)
        accepted.unpersist()
    return result


def raw_frame(csv_dir: str, cfg):
    """The generated rows as a service receives them: the feature columns, numbers as float."""
    import pandas as pd

    columns = [c for c in cfg.data.columns]
    frames = [
        pd.read_csv(f, header=None, names=[c.name for c in columns], skipinitialspace=True, na_values=["?"])
        for f in sorted(Path(csv_dir).glob("part-*"))
    ]
    frame = pd.concat(frames, ignore_index=True)
    features = [c.name for c in columns if c.role in ("numeric", "categorical")]
    frame = frame[features]
    for c in columns:
        if c.role == "numeric":
            frame[c.name] = frame[c.name].astype(float)
        elif c.role == "categorical":
            frame[c.name] = frame[c.name].astype(object).where(frame[c.name].notna(), None)
    return frame


def main(requests: int = 200, rows: int = 200_000, spark=None) -> list[dict]:
    import mlflow.pyfunc

    from sparkml_dist.config import SparkConfig
    from sparkml_dist.data.generate import adult_like, write_csv
    from sparkml_dist.spark import build_session
    from sparkml_dist.tracking.client import resolve_tracking_uri
    from sparkml_dist.tracking.models import resolve_registry_uri

    spark = spark or build_session(SparkConfig(master="local[2]", app_name="bench-serving"))
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory() as root:
        cfg = champion(spark, root, rows)
        name = cfg.tracking.registered_model
        model = mlflow.pyfunc.load_model(
            resolve_registry_uri(f"models:/{name}@champion", resolve_tracking_uri(cfg.tracking))
        )
        write_csv(adult_like(spark, rows, seed=11), f"{root}/rows", 4)
        frame = raw_frame(f"{root}/rows", cfg)
        server, port = _serve(root, name)
        try:
            one, one_local = latency(port, model, frame, 1, requests)
            hundred, hundred_local = latency(port, model, frame, 100, requests)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
        ours, baseline = throughput(spark, cfg, model, frame, f"{root}/rows", rows)
    note = f"mlflow models serve, 1 worker, --env-manager local; {requests} requests after 5 warm-up ones"
    out = [
        entry(
            "serve_latency_1_row_p50",
            statistics.median(one),
            statistics.median(one_local),
            "ms",
            "lower",
            None,
            note=note + "; baseline: the same rows through the pyfunc in-process",
        ),
        entry("serve_latency_1_row_p95", _p95(one), _p95(one_local), "ms", "lower", None, note=note),
        entry(
            "serve_latency_100_rows_p50",
            statistics.median(hundred),
            statistics.median(hundred_local),
            "ms",
            "lower",
            None,
            note=note,
        ),
        entry(
            "serve_latency_100_rows_p95", _p95(hundred), _p95(hundred_local), "ms", "lower", None, note=note
        ),
        entry(
            "pyfunc_raw_vs_spark_scorer",
            ours,
            baseline,
            "rows/s",
            "higher",
            None,
            note=f"{rows:,} Adult-shaped raw rows, one core each: the pyfunc on a pandas DataFrame (1 torch "
            f"thread) vs the Spark scorer over one cached partition",
        ),
    ]
    record(out)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rows", type=int, default=200_000)
    args = parser.parse_args()
    main(args.requests, args.rows)
