"""Run handles and metric logging. Workers get a `RunHandle` (URI + run id) explicitly."""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sparkml_dist.config.schema import TrackingConfig
from sparkml_dist.errors import PrerequisiteError

log = logging.getLogger(__name__)

_MAX_PARAM = 6000  # MLflow's param value limit


@dataclass(frozen=True)
class RunHandle:
    tracking_uri: str
    run_id: str
    experiment_id: str

    def client(self):
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri)

    @staticmethod
    def existing(tracking_uri: str, run_id: str) -> RunHandle:
        """A handle on a run that already exists (e.g. the one a train stage recorded)."""
        from mlflow.tracking import MlflowClient

        run = MlflowClient(tracking_uri=tracking_uri).get_run(run_id)
        return RunHandle(tracking_uri, run_id, run.info.experiment_id)


_SQLITE = "sqlite:///"  # a sqlite store's URI: the prefix, then the file's path


def resolve_tracking_uri(cfg: TrackingConfig) -> str:
    """Config, then $MLFLOW_TRACKING_URI, then a sqlite file in the working directory.
    A relative sqlite path is made absolute so executors in other directories find it."""
    uri = cfg.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"{_SQLITE}mlflow.db"
    if uri.startswith(_SQLITE) and not uri[len(_SQLITE) :].startswith("/"):
        uri = _SQLITE + str(Path(uri[len(_SQLITE) :]).resolve())
    return uri


def check_tracking_store(cfg: TrackingConfig, timeout_s: float = 5.0) -> None:
    """The tracking server answers within `timeout_s`, asked once before any work: MLflow's own
    client retries an unreachable server for minutes before it fails with a traceback. Any HTTP
    answer counts (a proxy's 401 is a server that is there); a sqlite store's folder must be
    writable. Other stores (databricks, file) are left to their first call."""
    uri = resolve_tracking_uri(cfg)
    key = "tracking.tracking_uri" if cfg.tracking_uri else "MLFLOW_TRACKING_URI"
    if uri.startswith(("http://", "https://")):
        try:
            urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s).close()
        except urllib.error.HTTPError:
            return
        except OSError as exc:  # URLError, a refused connection, a timeout
            reason = getattr(exc, "reason", None) or exc
            raise PrerequisiteError(
                f"{key} {uri}: the tracking server does not answer ({reason}; waited at "
                f"most {timeout_s:g} s); start it (mlflow server ...) or set {key} to one "
                f"that answers"
            ) from None
    elif uri.startswith(_SQLITE):
        folder = Path(uri[len(_SQLITE) :]).parent
        existing = next(p for p in (folder, *folder.parents) if p.exists())  # MLflow makes the rest
        if not (existing.is_dir() and os.access(existing, os.W_OK)):
            raise PrerequisiteError(
                f"{key} {uri}: the sqlite store's folder {folder} cannot be written by this "
                f"job ({existing} is not a writable directory); set {key} to another store"
            )


def artifact_location(tracking_uri: str, experiment: str) -> str | None:
    """Where a new experiment keeps its runs' artifacts: beside a sqlite store, in
    `<the store's folder>/mlruns/<experiment>`. MLflow's own default is `./mlruns` under whatever
    directory the process that creates the experiment runs in: the same folder for the default
    `sqlite:///mlflow.db`, but a job started elsewhere with a store named by its path would leave
    the artifacts there. None for any other store: its own default (a tracking server's artifact
    root)."""
    if not tracking_uri.startswith(_SQLITE):
        return None
    folder = Path(tracking_uri[len(_SQLITE) :]).parent
    return str(folder / "mlruns" / _folder_name(experiment))


def _folder_name(experiment: str) -> str:
    """The experiment's name where it is a safe folder name; else the safe part and a hash of the
    whole name, so that two names that differ only in unsafe characters ("team/a b", "team a/b")
    never share a folder."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", experiment).strip("._")
    if safe == experiment:
        return safe
    return f"{safe or 'experiment'}-{hashlib.sha256(experiment.encode()).hexdigest()[:10]}"


def start_run(
    cfg: TrackingConfig, run_name: str, params: dict[str, str], tags: dict[str, str] | None = None
) -> RunHandle:
    from mlflow.tracking import MlflowClient

    uri = resolve_tracking_uri(cfg)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(cfg.experiment)
    experiment_id = (
        experiment.experiment_id
        if experiment
        else client.create_experiment(
            cfg.experiment, artifact_location=artifact_location(uri, cfg.experiment)
        )
    )
    run = client.create_run(experiment_id, run_name=run_name, tags=tags or {})
    handle = RunHandle(uri, run.info.run_id, experiment_id)
    log_params(handle, params)
    return handle


def log_params(handle: RunHandle, params: dict[str, str]) -> None:
    from mlflow.entities import Param

    items = [Param(k, str(v)[:_MAX_PARAM]) for k, v in sorted(params.items())]
    client = handle.client()
    for i in range(0, len(items), 100):
        client.log_batch(handle.run_id, params=items[i : i + 100])


def end_run(handle: RunHandle, ok: bool) -> None:
    handle.client().set_terminated(handle.run_id, status="FINISHED" if ok else "FAILED")


@contextmanager
def tracked_run(cfg: TrackingConfig, run_name: str, params: dict[str, str]) -> Iterator[RunHandle]:
    """A run that ends FINISHED when the block completes and FAILED when it raises."""
    handle = start_run(cfg, run_name, params, tags={"sparkml_dist.stage": run_name})
    try:
        yield handle
    except BaseException:
        end_run(handle, ok=False)
        raise
    end_run(handle, ok=True)


class RankTracker:
    """Metric logging from a rank. Buffered per call into one log_batch; retried briefly
    because several ranks may write to one sqlite store at the same moment."""

    def __init__(self, handle: RunHandle | None, rank: int):
        self.handle = handle
        self.rank = rank
        self._client = handle.client() if handle else None
        self._run_id = handle.run_id if handle else ""

    def connect(self) -> None:
        """Open the store's connection now rather than at the first log."""
        if self._client is not None:
            try:
                self._client.get_run(self._run_id)
            except Exception as exc:
                log.warning("rank %d: MLflow store not reachable yet: %s", self.rank, exc)

    def log(self, metrics: dict[str, float], step: int, per_rank: bool = False) -> None:
        if self._client is None:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        suffix = f"_rank{self.rank}" if per_rank else ""
        self._log_batch([Metric(f"{k}{suffix}", float(v), now, step) for k, v in metrics.items()])

    def log_system(self, samples) -> None:
        """System samples (`observe.system.SystemSample`), each at its own time, step = its index."""
        if self._client is None or not samples:
            return
        from mlflow.entities import Metric

        batch = [
            Metric(k, float(v), s.timestamp_ms, s.index) for s in samples for k, v in s.metric_names().items()
        ]
        for i in range(0, len(batch), 1000):  # MLflow's log_batch limit
            self._log_batch(batch[i : i + 1000])

    def _log_batch(self, batch) -> None:
        if self._client is None:
            return
        for attempt in range(5):
            try:
                self._client.log_batch(self._run_id, metrics=batch)
                return
            except Exception as exc:
                if attempt == 4:
                    log.warning("rank %d: could not log metrics to MLflow: %s", self.rank, exc)
                time.sleep(0.2 * (attempt + 1))


@dataclass(frozen=True)
class EpochLogger:
    """Where a training method sends each epoch's record as it completes: its metrics on the run,
    at step = epoch. Every method's records take this one path (`train.records.EpochRecord.metrics`
    names the keys): a driver-side method calls it; rank 0 of a barrier stage `open()`s it."""

    handle: RunHandle
    may_stop: bool = False  # it only logs

    def __call__(self, record) -> None:
        tracker = RankTracker(self.handle, 0)
        tracker.log(record.metrics(), record.epoch)
        tracker.log_system(record.system)

    def open(self) -> BackgroundEpochLog:
        return BackgroundEpochLog(self.handle)


class BackgroundEpochLog:
    """The same logging off the training thread, for rank 0 of a barrier stage: the other ranks
    would otherwise wait in the next epoch's first collective while rank 0 writes to the store.
    It connects to the store when opened, before training (a first sqlite connection takes about
    a second); `close()` waits for the records still queued."""

    def __init__(self, handle: RunHandle):
        self._tracker = RankTracker(handle, 0)
        self._tracker.connect()
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._drain, name="sparkml_dist-epoch-log", daemon=True)
        self._thread.start()

    def __call__(self, record) -> None:
        self._queue.put(record)

    def close(self, timeout_s: float = 120.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("epoch metrics still unwritten after %.0f s; giving up on them", timeout_s)

    def _drain(self) -> None:
        while (record := self._queue.get()) is not None:
            self._tracker.log(record.metrics(), record.epoch)
            self._tracker.log_system(record.system)
