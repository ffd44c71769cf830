"""Run a rank function on N ranks inside one Spark barrier stage.

No torchrun subprocess: each rank runs in its Spark Python worker. The driver checks slots
first (fail fast instead of Spark's 10-minute wait), and turns a failing rank into one
`RankFailure` that names the rank, the exception and the tail of its output.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from typing import Any, Callable

from pyspark.sql import SparkSession

from sparkml_dist.errors import RankFailure, SlotError
from sparkml_dist.launch.backend import Backend
from sparkml_dist.launch.context import RankContext, captured_output, env_scope, free_port, layout
from sparkml_dist.launch.isolation import run_forked
from sparkml_dist.launch.reports import decode_failures, encode_failure, is_peer_failure
from sparkml_dist.spark.session import task_slots

log = logging.getLogger(__name__)

RankFn = Callable[[RankContext, Any], Any]
PEER_FAILURE_GRACE_S = 5.0


def run_barrier(spark: SparkSession, fn: RankFn, payload: Any, num_ranks: int, backend: Backend) -> list[Any]:
    """Run `fn(ctx, payload)` on `num_ranks` ranks; return the results in rank order."""
    slots = task_slots(spark, wanted=num_ranks)
    if num_ranks > slots:
        raise SlotError(slots, num_ranks)
    driver_host = spark.sparkContext.getConf().get("spark.driver.host", "127.0.0.1")
    handle = backend.driver_start(num_ranks, driver_host)
    task = functools.partial(_rank_main, fn=fn, payload=payload, backend=backend, extra=dict(handle.extra))
    rdd = spark.sparkContext.parallelize(range(num_ranks), num_ranks).barrier().mapPartitions(task)
    log.info("launching %d ranks (backend %s) in a barrier stage", num_ranks, backend.name)
    try:
        results = rdd.collect()
    except Exception as exc:  # Py4JJavaError and friends: look for our rank reports
        reports = decode_failures(str(exc))
        raise RankFailure(reports, _first_python_error(str(exc))) from (None if reports else exc)
    finally:
        handle.stop()
    return [result for _, result in sorted(results, key=lambda pair: pair[0])]


def _first_python_error(text: str) -> str:
    """The Python exception line inside a Spark job failure (Java frames removed)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("at ")]
    errors = [ln for ln in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", ln)]
    return (errors or lines or ["(no message)"])[-1][:500]


def _rank_main(_partition, fn: RankFn, payload: Any, backend: Backend, extra: dict[str, str]):
    from pyspark import BarrierTaskContext

    task = BarrierTaskContext.get()
    rank = task.partitionId()
    addresses = [info.address for info in task.getTaskInfos()]
    gpus = tuple(task.resources()["gpu"].addresses) if "gpu" in task.resources() else ()
    info = layout(addresses, rank, gpus)
    port = free_port(info["host"]) if rank == 0 else 0
    master_port = int(task.allGather(str(port))[0])
    ctx = RankContext(master_port=master_port, extra=extra, **info)
    with captured_output() as tail, env_scope(backend.rank_env(ctx)):
        try:
            result = _run_with_backend(fn, ctx, payload, backend, tail)
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the driver by rank
            if is_peer_failure(exc):
                # A collective broke because another rank died: give that rank's own report
                # time to reach the driver first (Spark keeps the first task failure).
                time.sleep(PEER_FAILURE_GRACE_S)
            raise encode_failure(rank, ctx.host, exc, tail) from None
    yield rank, result


def _run_with_backend(fn: RankFn, ctx: RankContext, payload: Any, backend: Backend, tail) -> Any:
    if backend.needs_fresh_process:
        return run_forked(functools.partial(_init_run_shutdown, fn, ctx, payload, backend), tail)
    return _init_run_shutdown(fn, ctx, payload, backend)


def _init_run_shutdown(fn: RankFn, ctx: RankContext, payload: Any, backend: Backend) -> Any:
    backend.rank_init(ctx)
    try:
        return fn(ctx, payload)
    finally:
        try:
            backend.rank_shutdown()
        except Exception:  # noqa: BLE001 - never mask the rank's own error
            log.warning("rank %d: backend shutdown failed", ctx.rank, exc_info=True)
