"""Run a rank function on N ranks inside one Spark barrier stage.

No torchrun subprocess: each rank runs in its Spark Python worker. The driver checks slots
first (fail fast instead of Spark's 10-minute wait), and turns a failing rank into one
`RankFailure` that names the rank, the exception and the tail of its output.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession

from sparkml_dist.errors import PrerequisiteError, RankFailure, SlotError
from sparkml_dist.launch.backend import Backend
from sparkml_dist.launch.context import PartitionData, RankContext, captured_output, env_scope, layout
from sparkml_dist.launch.coordinator import CoordinatorAddress, LaunchCoordinator, all_gather
from sparkml_dist.launch.deal import deal
from sparkml_dist.launch.gateway import LocalForwarder, StoreGateway
from sparkml_dist.launch.isolation import run_forked
from sparkml_dist.launch.pg_guard import process_groups_outlive_the_call
from sparkml_dist.launch.ports import driver_ports
from sparkml_dist.launch.relay import OutputRelay, RelayAddress, RelaySink, log_rank_line
from sparkml_dist.launch.reports import crash_reports, decode_failures, encode_failure, is_peer_failure
from sparkml_dist.launch.spill import Spill, spilled_partition
from sparkml_dist.spark.capacity import slot_gap
from sparkml_dist.spark.session import is_connect, job_phase, task_slots

log = logging.getLogger(__name__)

RankFn = Callable[[RankContext, Any], Any]
PEER_FAILURE_GRACE_S = 5.0
# launches of one stage when every rank that reports failed to join the process group (like torchrun's
# rendezvous retry): the failed ranks never ran their function, and the others cannot have got past
# their first collective (each waits in init until all have joined: TorchBackend's TORCH_DIST_INIT_BARRIER)
RENDEZVOUS_ATTEMPTS = 2


@dataclass(frozen=True)
class RankOptions:
    """What every rank of one launch needs from the driver besides its payload: where to meet the
    coordinator, the backend's settings, where its output goes, and the launch's secret (travels to
    every rank with the task)."""

    # the driver's listener for the ranks' all-gather and end barrier (launch.coordinator); None on
    # Spark Connect, whose client no executor can reach: Spark's own BarrierTaskContext.allGather
    coordinator: CoordinatorAddress | None
    extra: dict[str, str] = field(default_factory=dict)  # the backend's, from `driver_start`
    relay: RelayAddress | None = None  # stream output lines to the driver's log
    echo: bool = True  # also write them to the worker's own stdout
    secret: bytes = b""  # this launch's rendezvous secret: fresh random bytes (launch.gateway)


@dataclass(frozen=True)
class _RankReturn:
    """What a rank's task sends back: its function's result and the last lines of its output
    (which only a Spark Connect client, with no relay, shows)."""

    rank: int
    result: Any
    output_tail: tuple[str, ...] = ()


def run_barrier(
    spark: SparkSession,
    fn: RankFn,
    payload: Any,
    num_ranks: int,
    backend: Backend,
    *,
    stream_output: bool = False,
    frame: DataFrame | None = None,
    description: str | None = None,
) -> list[Any]:
    """Run `fn(ctx, payload)` on `num_ranks` ranks; return the results in rank order.

    `stream_output`: every rank's output lines are logged on the driver as they are written.
    `frame`: the ranks are the tasks of a barrier stage over this DataFrame, split into
    `num_ranks` shares; each rank finds its share spilled to local disk at `ctx.partition`.
    `description`: what the Spark UI shows for the barrier job (default: the ranks and backend)."""
    description = (
        description
        or f"{getattr(fn, '__name__', 'rank program')}: {num_ranks} ranks ({backend.name}, barrier stage)"
    )
    for attempt in range(1, RENDEZVOUS_ATTEMPTS + 1):
        try:
            return _launch_when_placeable(
                spark,
                fn,
                payload,
                num_ranks,
                backend,
                stream_output,
                frame,
                description if attempt == 1 else f"{description}, rendezvous attempt {attempt}",
            )
        except RankFailure as failure:
            if not failure.in_rendezvous or attempt == RENDEZVOUS_ATTEMPTS:
                raise
            log.warning(
                "the ranks could not form their process group, launching the stage again (%d/%d): %s",
                attempt + 1,
                RENDEZVOUS_ATTEMPTS,
                str(failure).splitlines()[0],
            )
    raise AssertionError("unreachable")


# Spark's own refusal of a barrier stage that has more tasks than the cluster has slots right now
_SLOTS_GONE = re.compile(r"BarrierJobSlotsNumberCheckFailed|SPARK-24819")


def _launch_when_placeable(
    spark: SparkSession,
    fn: RankFn,
    payload: Any,
    num_ranks: int,
    backend: Backend,
    stream_output: bool,
    frame: DataFrame | None,
    description: str,
) -> list[Any]:
    """`_launch` once the cluster has the slots. An executor lost between the check and the launch
    is waited for once more: a failed barrier stage can take an executor down a second after it
    (Spark exits an executor whose task it killed inside `barrier()`), and the replacement takes seconds."""
    # imported here, not at the top: it pulls in the config schema (pydantic, about 0.3 s), which a
    # rank's worker would otherwise import, cold, when it unpickles the rank function

    if is_connect(spark):
        return _launch_over_connect(spark, fn, payload, num_ranks, backend, frame)
    for check in range(2):
        slots = task_slots(spark, wanted=num_ranks)
        if num_ranks > slots:
            raise SlotError(slots, num_ranks, slot_gap(spark))
        try:
            return _launch(spark, fn, payload, num_ranks, backend, stream_output, frame, description)
        except _SlotsGone:
            if check == 1:
                raise SlotError(task_slots(spark), num_ranks, slot_gap(spark)) from None
            log.warning("an executor left between the slot check and the launch; waiting for its slots again")
    raise AssertionError("unreachable")


class _SlotsGone(Exception):
    """Spark refused the barrier stage: fewer slots than ranks at submission (launch.launcher only)."""


def _launch(
    spark: SparkSession,
    fn: RankFn,
    payload: Any,
    num_ranks: int,
    backend: Backend,
    stream_output: bool,
    frame: DataFrame | None,
    description: str,
) -> list[Any]:
    """One barrier stage of `num_ranks` ranks, with its own secret, store and output relay."""

    driver_host = spark.sparkContext.getConf().get("spark.driver.host", "127.0.0.1")
    secret = secrets.token_bytes(32)  # this launch's only: handed to its tasks inside the task
    ports = driver_ports(spark)
    handle = backend.driver_start(num_ranks, driver_host, secret, ports=ports)
    relay = coordinator = None
    try:
        relay = OutputRelay(driver_host, ports=ports) if stream_output else None
        coordinator = LaunchCoordinator(driver_host, num_ranks, ports)
    except BaseException:  # e.g. no free port in the range: stop what already listens
        for started in (relay, handle):
            if started is not None:
                started.stop()
        raise
    options = RankOptions(
        coordinator.address,
        dict(handle.extra),
        relay.address if relay else None,
        echo=not (relay and str(spark.sparkContext.master).startswith("local")),
        secret=secret,
    )
    log.info("launching %d ranks (backend %s) in a barrier stage", num_ranks, backend.name)
    try:
        with job_phase(spark, description):
            if frame is None:
                task = functools.partial(_rank_main, fn=fn, payload=payload, backend=backend, options=options)
                results = (
                    spark.sparkContext.parallelize(range(num_ranks), num_ranks)
                    .barrier()
                    .mapPartitions(task)
                    .collect()
                )
            else:
                results = _barrier_rows(
                    deal(frame, num_ranks),
                    functools.partial(
                        _frame_rank_main, fn=fn, payload=payload, backend=backend, options=options
                    ),
                )
    except Exception as exc:  # Py4JJavaError and friends: look for our rank reports
        reports = decode_failures(str(exc)) or crash_reports(str(exc))
        if not reports and _SLOTS_GONE.search(str(exc)):
            raise _SlotsGone() from exc
        raise RankFailure(
            reports, _first_python_error(str(exc)) + _missing_module_advice(spark, str(exc))
        ) from (None if reports else exc)
    finally:
        coordinator.stop()
        handle.stop()
        if relay is not None:
            relay.stop()
    return [r.result for r in sorted(results, key=lambda r: r.rank)]


def _launch_over_connect(
    spark: SparkSession, fn: RankFn, payload: Any, num_ranks: int, backend: Backend, frame: DataFrame | None
) -> list[Any]:
    """One barrier stage from a Spark Connect client: the ranks meet through Spark's own
    `allGather` (no listener on this side, which the executors cannot reach), a range of
    `num_ranks` rows makes the tasks when no DataFrame does, and results come back as rows. No
    relay streams a rank's output to the client: each rank's last lines come back with its result
    and are logged here, as the relay logs them, once the ranks are done."""
    if not backend.hosts_store:  # its rendezvous is the driver's (driver_start): not a Connect client's
        raise PrerequisiteError(
            f"the {backend.name} backend runs its rendezvous server on the driver, which a Spark Connect "
            f"client is not: on Connect, train with the torch backend (train.backend=torch)"
        )
    options = RankOptions(None, secret=secrets.token_bytes(32))
    task = functools.partial(
        _frame_rank_main, fn=fn, payload=payload, backend=backend, options=options, spill=frame is not None
    )
    source = deal(frame, num_ranks) if frame is not None else spark.range(num_ranks, numPartitions=num_ranks)
    log.info("launching %d ranks (backend %s) in a barrier stage over Spark Connect", num_ranks, backend.name)
    try:
        results = _barrier_rows(source, task)
    except Exception as exc:  # pyspark.errors.exceptions.connect.*: the executor's error text
        reports = decode_failures(str(exc)) or crash_reports(str(exc))
        if not reports and _SLOTS_GONE.search(str(exc)):
            raise SlotError(None, num_ranks, " (Spark refused the barrier stage)") from None
        raise RankFailure(reports, _first_python_error(str(exc))) from (None if reports else exc)
    returned = sorted(results, key=lambda r: r.rank)
    for r in returned:
        for line in r.output_tail:
            log_rank_line(r.rank, line)
    return [r.result for r in returned]


def _barrier_rows(source: DataFrame, task) -> list[_RankReturn]:
    """What `task` returns over `source`'s partitions as one barrier stage: `source` has an
    explicit partition count (a deal or a range), which adaptive execution keeps."""
    rows = source.mapInArrow(task, "rank int, result binary, output array<string>", barrier=True).collect()
    return [_RankReturn(row["rank"], cloudpickle.loads(row["result"]), tuple(row["output"])) for row in rows]


def _missing_module_advice(spark: SparkSession, text: str) -> str:
    """A worker that cannot import this package (or torch) usually runs another Python."""
    if "ModuleNotFoundError" not in text:
        return ""
    import os

    python = (
        spark.sparkContext.getConf().get("spark.pyspark.python")
        or os.environ.get("PYSPARK_PYTHON")
        or "python3 (Spark's default)"
    )
    return (
        f". The executors run {python}: point spark.pyspark.python (or PYSPARK_PYTHON) at a Python that "
        f"has sparkml_dist and torch installed, or ship the package with --py-files / addPyFile"
    )


def _first_python_error(text: str) -> str:
    """The Python exception line inside a Spark job failure (Java frames removed)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("at ")]
    errors = [ln for ln in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", ln)]
    return (errors or lines or ["(no message)"])[-1][:500]


def _rank_main(_partition, fn: RankFn, payload: Any, backend: Backend, options: RankOptions):
    yield _run_rank(fn, payload, backend, options, spill=None)


def _frame_rank_main(
    batches, fn: RankFn, payload: Any, backend: Backend, options: RankOptions, spill: bool = True
):
    """A rank over a barrier mapInArrow: its share of the DataFrame spilled to local disk (`spill`),
    or, over a range that only makes the tasks, nothing."""
    import pyarrow as pa

    if spill:
        with spilled_partition(batches) as spilled:
            returned = _run_rank(fn, payload, backend, options, spill=spilled)
    else:
        for _ in batches:  # the range's ids: read, so that the task's input is done with
            pass
        returned = _run_rank(fn, payload, backend, options, spill=None)
    yield pa.RecordBatch.from_pydict(
        {
            "rank": [returned.rank],
            "result": [cloudpickle.dumps(returned.result)],
            "output": [list(returned.output_tail)],
        },
        schema=pa.schema([("rank", pa.int32()), ("result", pa.binary()), ("output", pa.list_(pa.string()))]),
    )


def _run_rank(
    fn: RankFn, payload: Any, backend: Backend, options: RankOptions, spill: Spill | None
) -> _RankReturn:
    from pyspark import BarrierTaskContext

    backend.preload()  # before any wait on another rank: cold ranks import torch side by side, not in turn
    task = BarrierTaskContext.get()
    rank = task.partitionId()
    addresses = [info.address for info in task.getTaskInfos()]
    gpus = tuple(task.resources()["gpu"].addresses) if "gpu" in task.resources() else ()
    info = layout(addresses, rank, gpus)
    store = gateway = None
    if rank == 0 and backend.hosts_store:  # on loopback; other hosts reach it through the gateway
        store = backend.rendezvous_server(len(addresses))
        gateway = StoreGateway(info["host"], store.port, options.secret)
    try:
        # one round trip: rank 0's rendezvous port, and every rank's share of the DataFrame
        gathered = [
            json.loads(m)
            for m in _all_gather(
                task,
                options,
                "start",
                json.dumps({"port": gateway.port if gateway else 0, "rows": spill.rows if spill else 0}),
            )
        ]
        partition = PartitionData(spill.path, tuple(g["rows"] for g in gathered)) if spill else None
        ctx = RankContext(
            master_port=int(gathered[0]["port"]),
            extra=options.extra,
            partition=partition,
            secret=options.secret,
            **info,
        )
        result, tail = _run_reporting(fn, ctx, payload, backend, options)
        if backend.hosts_store:
            # rank 0 keeps the store until every rank is done with it: a rank's last store traffic
            # (e.g. RPC's shutdown barrier) may still be on its way when rank 0's own function returns
            _all_gather(task, options, "end", "")
        return _RankReturn(rank, result, tail)
    finally:
        if gateway is not None:
            gateway.close()
        if store is not None:
            store.close()


def _all_gather(task, options: RankOptions, step: str, value: str) -> list[str]:
    """Every rank's `value`, in rank order. Through the driver's coordinator: Spark's own
    `allGather` sleeps a second before it looks for the answer (launch.coordinator); over Spark
    Connect, whose client the ranks cannot reach, through that one."""
    if options.coordinator is None:
        return list(task.allGather(value))
    return all_gather(options.coordinator, step, task.partitionId(), value)


def _run_reporting(
    fn: RankFn, ctx: RankContext, payload: Any, backend: Backend, options: RankOptions
) -> tuple[Any, tuple[str, ...]]:
    """Run the rank: its result and the last lines of its output, which is captured (and
    relayed); a failure is encoded for the driver."""
    sink = RelaySink(options.relay, ctx.rank) if options.relay else None
    try:
        with captured_output(on_line=sink, echo=options.echo) as tail, env_scope(backend.rank_env(ctx)):
            try:
                result = _run_with_backend(fn, ctx, payload, backend, tail, options.secret)
                return result, (() if sink else tuple(tail))
            except BaseException as exc:
                if is_peer_failure(exc):
                    # A collective broke because another rank died: give that rank's own report
                    # time to reach the driver first (Spark keeps the first task failure).
                    time.sleep(PEER_FAILURE_GRACE_S)
                raise encode_failure(ctx.rank, ctx.host, exc, tail) from None
    finally:
        if sink is not None:
            sink.close()


def _run_with_backend(
    fn: RankFn, ctx: RankContext, payload: Any, backend: Backend, tail, secret: bytes
) -> Any:
    run = functools.partial(_init_run_shutdown, fn, ctx, payload, backend, secret)
    return run_forked(run, tail) if backend.needs_fresh_process else run()


def _init_run_shutdown(fn: RankFn, ctx: RankContext, payload: Any, backend: Backend, secret: bytes) -> Any:
    # in the process that runs the rank (a forked child's threads are its own): the forwarder
    # admits only this process's store clients
    with (
        rendezvous_client(ctx, backend, secret),
        process_groups_outlive_the_call(),
    ):  # a torch 2.13 deadlock otherwise (launch.pg_guard)
        backend.rank_init(ctx)
        try:
            return fn(ctx, payload)
        finally:
            try:
                backend.rank_shutdown()
            except Exception:
                log.warning("rank %d: backend shutdown failed", ctx.rank, exc_info=True)


@contextlib.contextmanager
def rendezvous_client(ctx: RankContext, backend: Backend, secret: bytes):
    """The backend's rendezvous address (MASTER_ADDR/PORT, Horovod's rendezvous) points at a
    forwarder for this process that proves the launch's secret to the gateway (launch.gateway)."""
    forwarder = LocalForwarder(*backend.rendezvous_gateway(ctx), secret)
    try:
        with env_scope(backend.rendezvous_env(forwarder.port)):
            yield forwarder
    finally:
        forwarder.close()
