"""Per-micro-batch outputs that make the stream exactly-once: batch N's scored rows go to
`<output>/scored/batch_id=N/` and its rejects to `<output>/rejects/batch_id=N/`, each written to
a staging directory and renamed into place. Spark records a micro-batch as done in the query's
checkpoint only after foreachBatch returns, and after a crash it runs the batch again on the same
input files; that run replaces the batch's directories instead of adding to them, so every input
row ends up in the outputs exactly once. Staging lives under `_staging/`, which Spark's readers
skip (a leading underscore), so a reader of `<output>/scored` never sees a half-written batch."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from sparkml_dist.storage.hadoop import output_fs
from sparkml_dist.storage.store import spark_path

SCORED, REJECTS, STAGING = "scored", "rejects", "_staging"
REPORTS = "_reports"  # what a Spark Connect server's foreachBatch counted, per query (`streaming.progress`)
BATCH_ID = "batch_id"


@dataclass(frozen=True)
class BatchSink:
    output: str  # a path or URI; `scored/` and `rejects/` are made under it

    def batch_dir(self, kind: str, batch_id: int) -> str:
        return f"{spark_path(self.output).rstrip('/')}/{kind}/{BATCH_ID}={batch_id}"

    def write(self, spark: SparkSession, batch_id: int, scored: DataFrame, rejects: DataFrame | None) -> int:
        """Write batch `batch_id`'s outputs in place of any earlier attempt's; the scored row count
        as written (read back: what a reader of the output will find)."""
        fs = output_fs(spark)
        staging = (
            f"{spark_path(self.output).rstrip('/')}/{STAGING}/{BATCH_ID}={batch_id}-{uuid.uuid4().hex[:8]}"
        )
        for dead in fs.siblings(
            staging, f"{BATCH_ID}={batch_id}-"
        ):  # a killed attempt's (one query per output)
            fs.delete(dead)
        try:
            scored.write.parquet(f"{staging}/{SCORED}")
            written = spark.read.parquet(f"{staging}/{SCORED}").count()
            if rejects is not None:
                rejects.coalesce(1).write.parquet(f"{staging}/{REJECTS}")
            for kind in (SCORED, REJECTS):
                final = self.batch_dir(kind, batch_id)
                fs.delete(final)  # an earlier attempt of this batch (killed before Spark committed it)
                if kind == SCORED or rejects is not None:
                    fs.rename(f"{staging}/{kind}", final)
        finally:
            fs.delete(staging)
        return written
