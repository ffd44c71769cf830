"""Continuous scoring: a Structured Streaming query over an input directory, every micro-batch
checked as batch ingest checks rows, scored with the model the registry alias names at that
moment, and written exactly once (`streaming.sink`).

The query runs until its input is drained (`stream.trigger: available_now`) or until `stop` is
set (the CLI sets it on SIGTERM): the micro-batch in progress is finished, then the query is
stopped. After a crash, running again with the same checkpoint continues where the last
committed micro-batch left off."""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pyspark
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from sparkml_dist import storage
from sparkml_dist.config.schema import JobConfig
from sparkml_dist.data.ingest import checked_rows, split_checked
from sparkml_dist.data.sources import RawRows, schema_of, with_types_of
from sparkml_dist.errors import DataError, PrerequisiteError, SparkMLDistError
from sparkml_dist.spark.kind import is_connect
from sparkml_dist.stages.score import scored_rows
from sparkml_dist.storage.hadoop import OutputLock, output_fs
from sparkml_dist.storage.paths import OutputPaths
from sparkml_dist.streaming.follow import ModelFollower
from sparkml_dist.streaming.progress import (
    BatchProgress,
    BatchReport,
    FileReports,
    MemoryReports,
    ProgressListener,
    Reports,
)
from sparkml_dist.streaming.sink import REPORTS, BatchSink
from sparkml_dist.streaming.source import read_stream
from sparkml_dist.tracking.client import resolve_tracking_uri, tracked_run

log = logging.getLogger(__name__)

MODEL_VERSION = "model_version"


@dataclass
class StreamResult:
    output: str  # <output>/scored/batch_id=N/ and <output>/rejects/batch_id=N/
    checkpoint: str
    run_id: str
    stopped: str  # why the query ended
    batches: list[BatchProgress] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # registry version -> why it was not used

    def total(self, name: str) -> int:
        return sum(getattr(b.report, name) for b in self.batches)


def stream(
    spark: SparkSession,
    cfg: JobConfig,
    input_path: str,
    output_path: str | None = None,
    checkpoint: str | None = None,
    model_uri: str | None = None,
    stop: threading.Event | None = None,
) -> StreamResult:
    # every version the stream loads is downloaded under one folder, removed when the stream ends
    with tempfile.TemporaryDirectory(prefix="sparkml_dist_stream_models_") as models:
        return _stream(spark, cfg, input_path, output_path, checkpoint, model_uri, stop, models)


def _stream(
    spark: SparkSession,
    cfg: JobConfig,
    input_path: str,
    output_path: str | None,
    checkpoint: str | None,
    model_uri: str | None,
    stop: threading.Event | None,
    models: str,
) -> StreamResult:
    if is_connect(spark) and (gap := connect_listener_gap(pyspark.__version__)):
        raise PrerequisiteError(gap)
    out = storage.absolute(output_path) if output_path else default_output(cfg)
    checkpoint = storage.absolute(checkpoint) if checkpoint else storage.join(out, "_checkpoint")
    uri = model_uri or cfg.stream.model_uri or f"models:/{cfg.tracking.registered_model}@champion"
    follower = ModelFollower(
        uri, resolve_tracking_uri(cfg.tracking), spark, OutputPaths.of(cfg).models, downloads=models
    )
    first = follower.current()  # a model that does not load stops the job before it starts
    # a typed source reads each feature with the type the model was trained on (a value that does
    # not cast is a reject), not the type Spark would infer from the files already there
    source = read_stream(
        spark, input_path, with_types_of(cfg.data, first.bundle.training_schema or {}), cfg.stream
    )
    follower.expect(schema_of(source.data))  # nor does one that cannot score this input
    log.info(
        "stream: %s -> %s, scoring with %s (version %s), checkpoint %s",
        input_path,
        out,
        uri,
        first.version or "-",
        checkpoint,
    )
    name = f"sparkml_dist_stream_{uuid.uuid4().hex[:8]}"
    # on Connect, foreachBatch runs in the server's Python worker: what it counts comes back as files
    reports: Reports = FileReports(storage.join(out, REPORTS, name)) if is_connect(spark) else MemoryReports()
    score_batch = BatchScorer(
        uri,
        first.version,
        follower.tracking_uri,
        follower.shared_dir,
        follower.schema or {},
        source.rows_of,
        BatchSink(out),
        reports,
        cfg.score.device,
        follower,
    )
    # one query per output: a second one would replace the first one's batch directories
    lock = OutputLock(output_fs(spark), storage.spark_path(out))
    lock.acquire()
    try:
        with tracked_run(
            cfg.tracking,
            "stream",
            {
                **cfg.flat_params(),
                "stream.input": input_path,
                "stream.output": out,
                "stream.checkpoint": checkpoint,
            },
        ) as run:
            writer = (
                source.frame.writeStream.queryName(name)
                .option("checkpointLocation", storage.spark_path(checkpoint))
                .foreachBatch(score_batch)
            )
            stopped = _run_query(
                spark, _with_trigger(writer, cfg), ProgressListener(name, reports, run), stop
            )
            reports.wait_reported(timeout_s=10.0)
            refused = reports.refused()
            _tag_run(run, stopped, refused)
    finally:
        reports.close()
        lock.release()
    return StreamResult(out, checkpoint, run.run_id, stopped, list(reports.done), refused)


@dataclass
class BatchScorer:
    """foreachBatch's function: check, score and write one micro-batch, and count it.

    On a classic session Spark calls it in this process, with the follower the stream started
    with. On Spark Connect the server runs it in a Python worker of its own, which unpickles it
    once per query: the follower is left behind (it holds this process's session and downloads)
    and the worker builds its own from the model URI, on the batch's session."""

    model_uri: str
    first_version: str  # what the stream started with, on the client
    tracking_uri: str
    shared_dir: str | None
    schema: Mapping[str, str]  # the stream's columns, that every version must fit
    rows_of: Callable[[DataFrame], RawRows]
    sink: BatchSink
    reports: Reports
    device: str
    follower: ModelFollower | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "follower": None}

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        spark = batch.sparkSession
        follower = self._follower(spark)
        model = follower.current()
        self.reports.record_refused(follower.refused)
        raw = self.rows_of(batch)
        checked = checked_rows(raw, require_label=False).persist()
        try:
            rows = split_checked(checked, raw.data)
            if rows.input_rows == 0:
                return
            scored = scored_rows(model.bundle, model.pipeline, rows.accepted, raw.data, device=self.device)
            written = self.sink.write(
                spark,
                batch_id,
                scored.withColumn(MODEL_VERSION, F.lit(model.version)),
                rows.rejects if rows.rejected_rows else None,
            )
            if written != rows.accepted_rows:
                raise DataError(
                    f"stream batch {batch_id} lost rows: {rows.accepted_rows} accepted, {written} written"
                )
            self.reports.add(
                BatchReport(batch_id, model.version, rows.input_rows, rows.rejected_rows, written)
            )
        finally:
            checked.unpersist()

    def _follower(self, spark: SparkSession) -> ModelFollower:
        if self.follower is None:  # in a Connect server's worker: the first batch of this query
            self.follower = ModelFollower(
                self.model_uri, self.tracking_uri, spark, self.shared_dir, downloads=_worker_downloads()
            )
            self.follower.expect(self.schema)
            self.follower.start_with(self.first_version)
        self.follower.spark = spark  # a Connect worker's session can change between batches
        return self.follower


_WORKER_DOWNLOADS = "sparkml_dist_stream_worker_"  # + the worker's pid


def _worker_downloads() -> str:
    """A Connect worker's folder for the versions it loads. The server stops a query's worker
    with SIGTERM, which skips `atexit` (and a handler that exits instead makes the worker's
    session call a server that is going away), so each new worker removes the folders of the
    workers that are gone."""
    import psutil  # a Connect worker's first micro-batch only

    for old in Path(tempfile.gettempdir()).glob(f"{_WORKER_DOWNLOADS}*"):
        pid = old.name.removeprefix(_WORKER_DOWNLOADS).split("_", 1)[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    folder = tempfile.mkdtemp(prefix=f"{_WORKER_DOWNLOADS}{os.getpid()}_")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def connect_listener_gap(client_version: str) -> str:
    """Why a Spark Connect client of this pyspark version cannot run the stream ("" when it can):
    before 4.0, Connect ran a query's listener on the server, where its progress lines and
    counts never reach the client."""
    if int(client_version.split(".")[0]) >= 4:
        return ""
    return (
        f"the stream job over Spark Connect needs a pyspark 4.0 or later client (this is "
        f"{client_version}, whose Connect runs the query's progress listener on the server): "
        f"upgrade the client, or run the stream from a classic session"
    )


def _run_query(spark: SparkSession, writer, listener: ProgressListener, stop: threading.Event | None) -> str:
    """Start the query with its listener and wait for it; the query never outlives this call."""
    spark.streams.addListener(listener)
    query = None
    try:
        query = writer.start()
        return _run_until_done(query, stop)
    finally:
        if query is not None and query.isActive:
            query.stop()
        spark.streams.removeListener(listener)


def _tag_run(run, stopped: str, refused: dict[str, str]) -> None:
    client = run.client()
    client.set_tag(run.run_id, "stream.stopped", stopped)
    for version, reason in refused.items():
        client.set_tag(run.run_id, f"stream.refused_version.{version}", reason[:5000])


def default_output(cfg: JobConfig) -> str:
    """`<output.root>/stream`. A stream spans run dates: with --run-date its outputs and checkpoint
    stay outside the date's directory, or every scheduled run would score every file again."""
    root = cfg.output.root
    if cfg.output.run_date:
        root = root.rstrip("/").removesuffix(f"/run_date={cfg.output.run_date}")
    return storage.join(storage.absolute(root), "stream")


def _with_trigger(writer, cfg: JobConfig):
    if cfg.stream.trigger == "available_now":
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=cfg.stream.interval)


def _run_until_done(query: StreamingQuery, stop: threading.Event | None) -> str:
    """Wait for the query; on `stop`, let the micro-batch in progress finish, then stop it."""
    while True:
        try:
            # seconds; pyspark's hint says int, its code takes any number (it sends int(timeout * 1000) ms)
            if query.awaitTermination(0.5):  # type: ignore[arg-type]
                return "the input is drained (available_now)"
        except Exception as exc:
            raise SparkMLDistError(f"the stream failed: {_first_cause(exc)}") from None
        if stop is not None and stop.is_set():
            _stop_between_batches(query)
            return "stopped on request (SIGTERM) after the micro-batch in progress"


def _stop_between_batches(query: StreamingQuery, patience_s: float = 600.0) -> None:
    deadline = time.monotonic() + patience_s
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.1)
    query.stop()


def _first_cause(exc: Exception) -> str:
    text = str(exc)
    for line in text.splitlines():  # the Python error raised in foreachBatch, where there is one
        if "Error:" in line and "StreamingQueryException" not in line:
            return line.strip()
    return text.splitlines()[0] if text else type(exc).__name__
