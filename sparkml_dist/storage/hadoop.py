"""Atomic directory outputs written by Spark, through Spark's own Hadoop FileSystem.

Writers fill a staging directory next to the target; `commit` swaps it in with renames, so a
job killed mid-write leaves the previous good output in place and a re-run replaces it. Paths
are given as `storage.spark_path` makes them (a local path as file://). A Spark Connect client
has no JVM on its side: there the same calls go through `storage.store` (pyarrow) instead
(`StoreFS`), which reaches the same paths when the client shares the cluster's storage.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pyspark.sql import SparkSession

from sparkml_dist.errors import OutputInUseError
from sparkml_dist.spark.kind import is_connect
from sparkml_dist.storage import store
from sparkml_dist.storage.store import spark_path

log = logging.getLogger(__name__)


class HadoopFS:
    """The few FileSystem calls we need, resolved per path."""

    def __init__(self, spark: SparkSession):
        self._jvm: Any = spark.sparkContext._jvm  # py4j: untyped
        self._conf = spark.sparkContext._jsc.hadoopConfiguration()

    def _fs(self, path: str):
        jpath = self._jvm.org.apache.hadoop.fs.Path(path)
        return jpath.getFileSystem(self._conf), jpath

    def exists(self, path: str) -> bool:
        fs, p = self._fs(path)
        return bool(fs.exists(p))

    def delete(self, path: str) -> None:
        fs, p = self._fs(path)
        if fs.exists(p):
            fs.delete(p, True)

    def rename(self, src: str, dst: str) -> None:
        fs, s = self._fs(src)
        _, d = self._fs(dst)
        fs.mkdirs(d.getParent())
        if not fs.rename(s, d):
            raise OSError(f"could not rename {src} -> {dst}")

    def copy_from_local(self, local: str, dst: str) -> None:
        fs, d = self._fs(dst)
        fs.copyFromLocalFile(False, True, self._jvm.org.apache.hadoop.fs.Path(f"file://{local}"), d)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create `path` holding `data`; False, and nothing written, when it already exists."""
        local = _local(path)
        if local is not None:
            return _create_local_exclusive(local, data)
        fs, p = self._fs(path)
        try:
            out = fs.create(p, False)  # HDFS: atomic create-if-absent
        except Exception as exc:
            if "AlreadyExists" in str(exc) or fs.exists(p):
                return False
            raise
        try:
            out.write(bytearray(data))
        finally:
            out.close()
        return True

    def read_text(self, path: str) -> str:
        local = _local(path)
        if local is not None:
            with open(local, encoding="utf-8") as fh:
                return fh.read()
        fs, p = self._fs(path)
        stream = fs.open(p)
        try:
            reader = self._jvm.java.io.BufferedReader(self._jvm.java.io.InputStreamReader(stream, "UTF-8"))
            return "\n".join(iter(reader.readLine, None))
        finally:
            stream.close()

    def siblings(self, path: str, prefix: str) -> list[str]:
        fs, p = self._fs(path)
        parent = p.getParent()
        if not fs.exists(parent):
            return []
        return [
            s.getPath().toString() for s in fs.listStatus(parent) if s.getPath().getName().startswith(prefix)
        ]


class StoreFS:
    """HadoopFS's calls through `storage.store`, for a Spark Connect client (no JVM here). A local
    path's renames are the OS's (atomic); on an object store a directory rename copies."""

    def exists(self, path: str) -> bool:
        return store.exists(path)

    def delete(self, path: str) -> None:
        store.delete(path)

    def rename(self, src: str, dst: str) -> None:
        source, target = store.locate(src), store.locate(dst)
        if source.is_local:
            os.makedirs(os.path.dirname(target.path), exist_ok=True)
            os.rename(source.path, target.path)
            return
        source.remote.create_dir(target.path.rsplit("/", 1)[0], recursive=True)
        source.remote.move(source.path, target.path)

    def copy_from_local(self, local: str, dst: str) -> None:
        target = store.locate(dst)
        if target.is_local:
            shutil.copytree(local, target.path)
            return
        for root, _, files in os.walk(local):
            for name in files:
                path = os.path.join(root, name)
                store.upload(Path(path), store.join(dst, os.path.relpath(path, local)))

    def create_exclusive(self, path: str, data: bytes) -> bool:
        local = _local(path)
        if local is not None:
            return _create_local_exclusive(local, data)
        if store.exists(path):  # an object store has no create-if-absent: checked, then written
            return False
        store.write_bytes(path, data)
        return True

    def read_text(self, path: str) -> str:
        return store.read_text(path)

    def siblings(self, path: str, prefix: str) -> list[str]:
        parent = path.rstrip("/").rsplit("/", 1)[0]
        return [e.uri for e in store.list_dir(parent) if e.name.startswith(prefix)]


def output_fs(spark: SparkSession) -> HadoopFS | StoreFS:
    """The file system outputs are committed through: Spark's own, or pyarrow's on Connect."""
    return StoreFS() if is_connect(spark) else HadoopFS(spark)


def _create_local_exclusive(local: str, data: bytes) -> bool:
    """O_EXCL: atomic, where Hadoop's local create checks then creates."""
    os.makedirs(os.path.dirname(local), exist_ok=True)
    try:
        fd = os.open(local, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return True


def _local(path: str) -> str | None:
    parsed = urlparse(path)
    return parsed.path if parsed.scheme in ("", "file") else None


@dataclass(frozen=True)
class Writer:
    """Who holds an output's lock: enough to tell a live writer from a crashed one on its host."""

    host: str
    pid: int
    process_start: str  # /proc start time: a reused pid is not the same writer
    since: str

    @staticmethod
    def me() -> Writer:
        return Writer(
            socket.gethostname(),
            os.getpid(),
            _process_start(os.getpid()),
            time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        )

    def is_gone(self) -> bool:
        """True only when provably dead: the same host, and no live process with its pid and start."""
        return self.host == socket.gethostname() and _process_start(self.pid) != self.process_start


def _process_start(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


class OutputLock:
    """`<output>.lock`, created exclusively: one writer per output at a time. A second live writer
    is refused (`OutputInUseError`) instead of deleting the first one's staging directory; the
    lock of a writer that crashed on this host is taken over, so a re-run after a crash works."""

    def __init__(self, fs: HadoopFS | StoreFS, final: str):
        self.fs = fs
        self.final = final
        self.path = f"{final.rstrip('/')}.lock"
        self.me = Writer.me()

    def acquire(self) -> None:
        data = json.dumps(asdict(self.me)).encode()
        if self.fs.create_exclusive(self.path, data):
            return
        owner = self._owner()
        if owner is not None and owner.is_gone():
            log.warning(
                "%s: taking over the lock of a writer that is gone (pid %d on %s since %s)",
                self.final,
                owner.pid,
                owner.host,
                owner.since,
            )
            self.fs.delete(self.path)
            if self.fs.create_exclusive(self.path, data):
                return
            owner = self._owner()
        who = f"pid {owner.pid} on host {owner.host}, since {owner.since}" if owner else "an unknown writer"
        raise OutputInUseError(
            f"{self.final} is being written by another job ({who}); this job is refused so that neither "
            f"destroys the other's output. Wait for that job to finish, or give this one another output "
            f"(output.root). If that job is no longer running, delete {self.path} and re-run."
        )

    def release(self) -> None:
        if self._owner() == self.me:  # never remove a lock someone took over meanwhile
            self.fs.delete(self.path)

    def _owner(self) -> Writer | None:
        try:
            return Writer(**json.loads(self.fs.read_text(self.path)))
        except Exception:
            return None


def recover(fs: HadoopFS | StoreFS, final: str) -> None:
    """If a crash fell between the two renames of a commit, put the previous output back.
    Called with the output's lock held: every staging directory left is a dead writer's."""
    name = final.rstrip("/").rsplit("/", 1)[-1]
    old = sorted(fs.siblings(final, f"{name}.old-"))
    if old and not fs.exists(final):
        fs.rename(old[-1], final)
        old = old[:-1]
    for leftover in old + fs.siblings(final, f"{name}.staging-"):
        fs.delete(leftover)


def commit(fs: HadoopFS | StoreFS, staging: str, final: str) -> None:
    backup = f"{final.rstrip('/')}.old-{uuid.uuid4().hex[:8]}"
    had_previous = fs.exists(final)
    if had_previous:
        fs.rename(final, backup)
    fs.rename(staging, final)
    if had_previous:
        fs.delete(backup)


@contextmanager
def atomic_dir(spark: SparkSession, final: str) -> Iterator[str]:
    """Yield a staging path (in Spark's form, see `storage.spark_path`); on success it replaces
    `final`, on error it is removed. One writer at a time (`OutputLock`)."""
    final = spark_path(final)
    fs = output_fs(spark)
    lock = OutputLock(fs, final)
    lock.acquire()
    try:
        recover(fs, final)
        staging = f"{final.rstrip('/')}.staging-{uuid.uuid4().hex[:8]}"
        try:
            yield staging
        except BaseException:
            fs.delete(staging)
            raise
        commit(fs, staging, final)
    finally:
        lock.release()


def publish_for_executors(spark: SparkSession, local_dir: str, shared: str) -> str:
    """A directory on the driver's own disk, made readable by every executor: copied once to
    `shared` (under the output root) and that copy's path returned. Contents under one `shared`
    name never change (a model version's files), so an existing copy is reused; a copy is
    staged and renamed, so a crash mid-copy leaves nothing half-written in its place."""
    final = spark_path(shared)
    fs = output_fs(spark)
    if not fs.exists(final):
        staging = f"{final.rstrip('/')}.staging-{uuid.uuid4().hex[:8]}"
        try:
            fs.copy_from_local(local_dir, staging)
            fs.rename(staging, final)
        except BaseException:
            fs.delete(staging)
            if not fs.exists(final):  # another job may have published the same files meanwhile
                raise
    return final
