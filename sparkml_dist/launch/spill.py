"""A barrier task's share of a DataFrame, written once to the task's local disk.

The rows arrive as Arrow record batches from the stage's input; an epoch after the first must not
recompute the DataFrame (or hold it all in memory), so they go to an Arrow IPC file in the
executor's local directory (Spark's own scratch space, `spark.local.dir`), read back memory-mapped
by the rank's loader and removed when the task ends.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

SPILL_FILE = "partition.arrow"


@dataclass(frozen=True)
class Spill:
    path: str
    rows: int


def scratch_root() -> str | None:
    """The executor's local directory when running in a Spark task (None: the system temp dir)."""
    try:
        from pyspark import SparkFiles

        root = SparkFiles.getRootDirectory()
        return root if root and os.path.isdir(root) else None
    except Exception:
        return None


@contextmanager
def spilled_partition(batches: Iterable, directory: str | None = None) -> Iterator[Spill]:
    """Write `batches` (pyarrow RecordBatches of one schema) to a local Arrow file; remove it after."""
    import pyarrow as pa

    workdir = tempfile.mkdtemp(prefix="sparkml-dist-spill-", dir=directory or scratch_root())
    path = os.path.join(workdir, SPILL_FILE)
    rows = 0
    try:
        writer = None
        with pa.OSFile(path, "wb") as sink:
            for batch in batches:
                if writer is None:
                    writer = pa.ipc.new_file(sink, batch.schema)
                writer.write_batch(batch)
                rows += batch.num_rows
            if writer is not None:
                writer.close()
        yield Spill(path if rows else "", rows)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
