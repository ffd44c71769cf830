"""A source format defined outside the built-ins (tests/test_sources.py, the example in
docs/architecture.md): XML files, one `<row>` element per row, read by Spark's own XML source
(Spark 4). A typed source: Spark infers the columns' types, data.columns may override roles and
casts, and every row goes through the same checks and quarantine as the built-in formats."""

from __future__ import annotations

from pyspark.sql import SparkSession

from sparkml_dist import storage
from sparkml_dist.config.schema import DataConfig
from sparkml_dist.data.formats import SourceFormat
from sparkml_dist.data.sources import RawRows, root_cause, typed_rows
from sparkml_dist.errors import DataError


def read_xml(spark: SparkSession, path: str, location: str, cfg: DataConfig) -> RawRows:
    try:
        frame = spark.read.format("xml").option("rowTag", "row").load(storage.spark_path(path))
        _ = frame.schema  # a missing path fails here, not in the middle of ingest
    except Exception as exc:
        raise DataError(f"cannot read xml input '{location}': {root_cause(exc)}") from None
    return typed_rows(frame, location, cfg)


XML = SourceFormat("xml", "toy_source:read_xml", extensions=(".xml",))
