"""Per-micro-batch progress: what foreachBatch counted (rows in, rejected, scored, the version)
joined with Spark's own progress event for the batch (its duration and rows/s), printed as one
line and logged to the stream's MLflow run at step = batch id."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Protocol

from pyspark.sql.streaming import StreamingQueryListener

from sparkml_dist.storage import store
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


class Reports(Protocol):
    """What foreachBatch counted, by batch id, until the listener reports it, and the versions
    the stream's model follower refused. `MemoryReports` where foreachBatch runs in this process
    (a classic session); `FileReports` where it runs in a Spark Connect server's Python worker."""

    done: list[BatchProgress]

    def add(self, report: BatchReport) -> None: ...

    def record_refused(self, refused: Mapping[str, str]) -> None: ...

    def get(self, batch_id: int) -> BatchReport | None: ...

    def finish(self, progress: BatchProgress) -> None: ...

    def wait_reported(self, timeout_s: float) -> None: ...

    def refused(self) -> dict[str, str]: ...

    def close(self) -> None: ...


class MemoryReports:
    """Reports kept in this process; thread-safe (the listener runs on Spark's listener thread)."""

    def __init__(self) -> None:
        self._pending: dict[int, BatchReport] = {}
        self._refused: dict[str, str] = {}
        self.done: list[BatchProgress] = []
        self._lock = threading.Condition()

    def add(self, report: BatchReport) -> None:
        with self._lock:
            self._pending[report.batch_id] = report

    def record_refused(self, refused: Mapping[str, str]) -> None:
        with self._lock:
            self._refused.update(refused)

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

    def refused(self) -> dict[str, str]:
        with self._lock:
            return dict(self._refused)

    def close(self) -> None:
        pass


REFUSED_FILE = "refused.json"


class FileReports:
    """Reports as small JSON files in `folder` (under the stream's output, where the client and
    the server both reach): on Spark Connect, foreachBatch runs in a Python worker of the server,
    which writes each batch's report (atomically) before the batch commits, and the client's
    listener reads it when Spark's progress event for the batch arrives. Picklable: the worker
    gets a copy with the folder; the client's copy keeps what it has reported."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.done: list[BatchProgress] = []
        self._refused: dict[str, str] = {}

    def _batch_file(self, batch_id: int) -> str:
        return store.join(self.folder, f"batch_id={batch_id}.json")

    def add(self, report: BatchReport) -> None:
        store.write_json(self._batch_file(report.batch_id), asdict(report))

    def record_refused(self, refused: Mapping[str, str]) -> None:
        if refused != self._refused:  # the worker writes only what changed
            store.write_json(store.join(self.folder, REFUSED_FILE), dict(refused))
            self._refused = dict(refused)

    def get(self, batch_id: int) -> BatchReport | None:
        path = self._batch_file(batch_id)
        if not store.exists(path):  # a trigger that found no new input
            return None
        self._read_refused()
        return BatchReport(**store.read_json(path))

    def finish(self, progress: BatchProgress) -> None:
        self.done.append(progress)

    def wait_reported(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self._unreported() and time.monotonic() < deadline:
            time.sleep(0.1)

    def _unreported(self) -> set[int]:
        written = {
            int(name.removeprefix("batch_id=").removesuffix(".json"))
            for name in (e.name for e in store.list_dir(self.folder))
            if name.startswith("batch_id=")
        }
        return written - {p.report.batch_id for p in self.done}

    def refused(self) -> dict[str, str]:
        self._read_refused()
        return dict(self._refused)

    def _read_refused(self) -> None:
        """The server's worker logs a refusal where the client does not see it: said here."""
        path = store.join(self.folder, REFUSED_FILE)
        now = store.read_json(path) if store.exists(path) else {}
        for version, reason in now.items():
            if self._refused.get(version) != reason:
                log.warning(
                    "stream: version %s is refused and does not score this stream: %s", version, reason
                )
        self._refused = dict(now)

    def close(self) -> None:
        store.delete(self.folder)


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
