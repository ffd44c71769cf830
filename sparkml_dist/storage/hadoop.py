"""Atomic directory outputs written by Spark, through Spark's own Hadoop FileSystem.

Writers fill a staging directory next to the target; `commit` swaps it in with renames, so a
job killed mid-write leaves the previous good output in place and a re-run replaces it. Paths
are given as `storage.spark_path` makes them (a local path as file://).
"""

from __future__ import annotations

import uuid
from contextlib import contextmanager
from typing import Iterator

from pyspark.sql import SparkSession

from sparkml_dist.storage.store import spark_path


class HadoopFS:
    """The few FileSystem calls we need, resolved per path."""

    def __init__(self, spark: SparkSession):
        self._jvm = spark.sparkContext._jvm
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

    def siblings(self, path: str, prefix: str) -> list[str]:
        fs, p = self._fs(path)
        parent = p.getParent()
        if not fs.exists(parent):
            return []
        return [s.getPath().toString() for s in fs.listStatus(parent) if s.getPath().getName().startswith(prefix)]


def recover(fs: HadoopFS, final: str) -> None:
    """If a crash fell between the two renames of a commit, put the previous output back."""
    name = final.rstrip("/").rsplit("/", 1)[-1]
    old = sorted(fs.siblings(final, f"{name}.old-"))
    if old and not fs.exists(final):
        fs.rename(old[-1], final)
        old = old[:-1]
    for leftover in old + fs.siblings(final, f"{name}.staging-"):
        fs.delete(leftover)


def commit(fs: HadoopFS, staging: str, final: str) -> None:
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
    `final`, on error it is removed."""
    final = spark_path(final)
    fs = HadoopFS(spark)
    recover(fs, final)
    staging = f"{final.rstrip('/')}.staging-{uuid.uuid4().hex[:8]}"
    try:
        yield staging
    except BaseException:
        fs.delete(staging)
        raise
    commit(fs, staging, final)


def publish_for_executors(spark: SparkSession, local_dir: str, shared: str) -> str:
    """A directory on the driver's own disk, made readable by every executor: copied once to
    `shared` (under the output root) and that copy's path returned. Contents under one `shared`
    name never change (a model version's files), so an existing copy is reused; a copy is
    staged and renamed, so a crash mid-copy leaves nothing half-written in its place."""
    final = spark_path(shared)
    fs = HadoopFS(spark)
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
