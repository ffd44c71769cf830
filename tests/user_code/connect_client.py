"""A notebook's cells on Spark Connect, as a Databricks serverless user runs them: a Connect session
(here a local server, `SparkSession.builder.remote("local[2]")`), then this project's
TorchDistributor with the user's own functions. Prints one JSON line of what a test checks.

    python tests/user_code/connect_client.py
"""

from __future__ import annotations

import json
import logging

import numpy as np
from pyspark.ml.feature import VectorAssembler
from pyspark.sql import SparkSession
from sklearn.datasets import load_breast_cancer

import sparkml_dist as sd
from sparkml_dist.errors import RankFailure, SlotError
from user_code.breast_cancer import fail_on_rank, train, train_from_dataframe

CONNECT_PORT = 15002


def listening_on(port: int) -> list[str]:
    """The addresses a TCP listener on `port` is bound to (an IPv4 address that a dual-stack socket
    reports as IPv4-mapped IPv6, as itself)."""
    import psutil

    return sorted(
        c.laddr.ip.removeprefix("::ffff:")
        for c in psutil.net_connections(kind="tcp")
        if c.status == "LISTEN" and c.laddr.port == port
    )


class RankLines(logging.Handler):
    """The ranks' output lines, as the launcher logs them on this side."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def main() -> None:
    # the server pyspark starts for "local[...]" admits only this process's random token; bound to
    # loopback (its default is every address), on Connect's port 15002
    spark = (
        SparkSession.builder.config("spark.connect.grpc.binding.address", "127.0.0.1")
        # a barrier stage larger than the cluster is refused after 3 checks 1 s apart, not 40 x 15 s
        .config("spark.scheduler.barrier.maxConcurrentTasksCheck.interval", "1s")
        .config("spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures", "3")
        .remote("local[2]")
        .getOrCreate()
    )
    out: dict = {"session": type(spark).__module__, "listening": listening_on(CONNECT_PORT)}
    distributor = sd.TorchDistributor(num_processes=2, local_mode=False, use_gpu=False)
    out["is_remote"] = distributor.is_remote
    relayed = RankLines()
    logging.getLogger("sparkml_dist.ranks").addHandler(relayed)
    logging.getLogger("sparkml_dist.ranks").setLevel(logging.INFO)
    over_connect = distributor.run(train, 0.05, epochs=3)
    out["relayed"] = [line for line in relayed.lines if "epoch 2 loss" in line]
    on_driver = sd.TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(
        train, 0.05, epochs=3
    )
    out["world"] = over_connect["world"]
    out["accuracy"] = over_connect["accuracy"]
    out["max_param_diff"] = max(
        float(np.abs(np.asarray(a) - np.asarray(b)).max())
        for a, b in zip(over_connect["params"], on_driver["params"])
    )
    try:
        distributor.run(fail_on_rank, 1)
    except RankFailure as failure:
        report = {r.rank: r for r in failure.reports}[1]
        out["failure"] = {"type": report.exc_type, "message": report.message, "tail": report.output_tail}
    try:  # three ranks on two task slots: Spark refuses the barrier stage, named as such
        sd.TorchDistributor(num_processes=3, local_mode=False, use_gpu=False).run(train, 0.05, epochs=1)
    except SlotError as short:
        out["slots"] = str(short)
    x, y = load_breast_cancer(return_X_y=True)
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    names = [f"f{i}" for i in range(x.shape[1])]
    rows = [tuple(float(v) for v in r) + (int(label),) for r, label in zip(x, y)]
    raw = spark.createDataFrame(rows, [*names, "label"]).repartition(3)
    df = VectorAssembler(inputCols=names, outputCol="features").transform(raw).select("features", "label")
    fed = distributor.run_on_dataframe(train_from_dataframe, df, 0.2, epochs=10)
    out["dataframe"] = {"rows": sum(r["own_rows"] for r in fed["ranks"]), "accuracy": fed["accuracy"]}
    out["input_rows"] = len(rows)
    print("RESULT " + json.dumps(out), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
