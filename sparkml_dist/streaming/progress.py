"""Per-micro-batch progress: what foreachBatch counted (rows in, rejected, scored, the version)
joined with Spark's own progress event for the batch (its duration and rows/s), printed as one
line and logged to the stream's MLflow run at step = batch id."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from pyspark.sql.streaming import StreamingQueryListener

from sparkml_dist.tracking.client import RunHandle

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchReport:
    batch_id: int
    model_version: str
    input_rows: int
    rejected_rows: int
    scored_rows: int


@dataclass(frozen=True)
class BatchProgress:
    report: BatchReport
    seconds: float  # the trigger's whole execution, from Spark's progress event
    rows_per_second: float  # Spark's processedRowsPerSecond


class Reports:
    """What foreachBatch counted, by batch id, until the listener reports it; thread-safe (the
    listener runs on Spark's listener thread)."""

    def __init__(self) -> None:
        self._pending: dict[int, BatchReport] = {}
        self.done: list[BatchProgress] = []
        self._lock = threading.Condition()

    def add(self, report: BatchReport) -> None:
        with self._lock:
            self._pending[report.batch_id] = report

    def get(self, batch_id: int) -> BatchReport | None:
        with self._lock:
            return self._pending.get(batch_id)

    def finish(self, progress: BatchProgress) -> None:
        """The batch reported: no longer pending (one step, so `wait_reported` sees it in `done`)."""
        with self._lock:
            self._pending.pop(progress.report.batch_id, None)
            self.done.append(progress)
            self._lock.notify_all()

    def wait_reported(self, timeout_s: float) -> None:
        """Until every counted batch's progress event has arrived (they come asynchronously, the
        last one possibly after the query has stopped), or `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._pending and time.monotonic() < deadline:
                self._lock.wait(0.1)


class ProgressListener(StreamingQueryListener):
    """Spark's listener for the query named `query_name`: one line per micro-batch, and the
    batch's numbers as MLflow metrics `stream/...` at step = batch id."""

    def __init__(self, query_name: str, reports: Reports, run: RunHandle | None):
        self.query_name = query_name
        self.reports = reports
        self.run = run

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        progress = event.progress
        if progress.name != self.query_name:
            return
        report = self.reports.get(progress.batchId)
        if report is None:  # a trigger that found no new input
            return
        seconds = (progress.durationMs or {}).get("triggerExecution", 0) / 1000.0
        done = BatchProgress(report, seconds, float(progress.processedRowsPerSecond or 0.0))
        print(progress_line(done), flush=True)
        try:
            self._log(done)
        except Exception as exc:
            log.warning("stream: batch %d's metrics were not logged to MLflow: %s", report.batch_id, exc)
        self.reports.finish(done)

    def _log(self, done: BatchProgress) -> None:
        if self.run is None:
            return
        from mlflow.entities import Metric

        r = done.report
        now = int(time.time() * 1000)
        values = {
            "stream/input_rows": r.input_rows,
            "stream/rejected_rows": r.rejected_rows,
            "stream/scored_rows": r.scored_rows,
            "stream/batch_seconds": done.seconds,
            "stream/rows_per_second": done.rows_per_second,
        }
        if r.model_version.isdigit():
            values["stream/model_version"] = int(r.model_version)
        self.run.client().log_batch(
            self.run.run_id, metrics=[Metric(k, float(v), now, r.batch_id) for k, v in values.items()]
        )


def progress_line(done: BatchProgress) -> str:
    r = done.report
    return (
        f"stream: batch {r.batch_id}: {r.input_rows:,} rows in, {r.rejected_rows:,} rejected, "
        f"{r.scored_rows:,} scored by version {r.model_version or '-'} in {done.seconds:.2f} s "
        f"({done.rows_per_second:,.0f} rows/s)"
    )
