"""Where the clients' rows live between rounds, and how a round reaches only the sampled ones.

On a classic session each client is one cached RDD partition (`partitionBy` on the client's
index) and a round is one `runJob` over the sampled partitions only. A Spark Connect client has
no RDD API: there the (features, label, weight) rows stay a persisted DataFrame keyed by the
client's index, and a round is one `groupBy(index).applyInPandas` over the sampled clients' rows.
Either way a client's rows reach the client function in the same order in every pass of a round
(secure aggregation seals each key to a digest of the rows)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

import cloudpickle
import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkml_dist.data.sources import ROW_ID
from sparkml_dist.methods.federated.client import RoundTask

ClientFn = Callable[[int, Iterable, RoundTask], dict[str, Any]]

INDEX = "_client_index"
FEATURES, TARGET, WEIGHT_OF_ROW = "_features", "_label", "_weight"


class ClientRows(Protocol):
    """The clients' rows, cached where they are, one client per index."""

    count: int  # clients

    def on_clients(self, sampled: tuple[int, ...], fn: ClientFn, task: RoundTask) -> list[dict[str, Any]]:
        """`fn(index, rows, task)` for each sampled client, over its own rows only (results in
        `sampled`'s order)."""
        ...

    def release(self) -> None: ...


class RddClients:
    """One cached partition per client (classic sessions)."""

    def __init__(self, spark, rdd, count: int) -> None:
        self.spark, self.rdd, self.count = spark, rdd, count

    def on_clients(self, sampled: tuple[int, ...], fn: ClientFn, task: RoundTask) -> list[dict[str, Any]]:
        return on_partitions(self.spark, self.rdd, sampled, fn, task)

    def release(self) -> None:
        self.rdd.unpersist()


class FrameClients:
    """The clients' rows as a persisted DataFrame of (index, row id, features, label, weight)
    (Spark Connect). The task travels inside the function Spark ships (Connect has no broadcast)."""

    def __init__(self, frame: DataFrame, count: int) -> None:
        self.frame, self.count = frame.persist(), count

    def on_clients(self, sampled: tuple[int, ...], fn: ClientFn, task: RoundTask) -> list[dict[str, Any]]:
        def per_client(rows):  # a pandas DataFrame: one client's rows
            rows = rows.sort_values(ROW_ID)  # the same order in every pass (the shuffle's is not)
            index = int(rows[INDEX].iloc[0])
            payload = fn(index, zip(rows[FEATURES], rows[TARGET], rows[WEIGHT_OF_ROW]), task)
            return pd.DataFrame({"index": [index], "payload": [cloudpickle.dumps(payload)]})

        chosen = self.frame.where(F.col(INDEX).isin(list(sampled)))
        answers = chosen.groupBy(INDEX).applyInPandas(per_client, "index int, payload binary").collect()
        by_index = {row["index"]: cloudpickle.loads(row["payload"]) for row in answers}
        return [by_index[i] for i in sampled]

    def release(self) -> None:
        self.frame.unpersist()


def on_partitions(spark, rdd, sampled: tuple[int, ...], fn, task) -> list[Any]:
    """Run `fn(index, rows, task)` inside each sampled client's partition, and only there (results
    in `sampled`'s order). A task for a partition that is not sampled would leave its rows unread,
    and pyspark does not reuse a Python worker that left a cached partition's rows unread: each
    round started new workers, which imported torch again (3 rounds of 9 of Adult's 15 occupations
    took 40-52 s, 11 s with only the sampled partitions' tasks; tests/test_federated.py)."""
    broadcast = spark.sparkContext.broadcast(task)

    def per_partition(index, rows):
        yield fn(index, rows, broadcast.value)

    try:
        return spark.sparkContext.runJob(
            rdd.mapPartitionsWithIndex(per_partition), lambda results: results, list(sampled)
        )
    finally:
        broadcast.unpersist()
