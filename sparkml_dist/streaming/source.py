"""The streaming counterpart of `data.sources.read_source`: the same parsing, types and reject
reasons, over Spark's streaming file (or table) source."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from sparkml_dist import storage
from sparkml_dist.config.schema import DataConfig, StreamConfig
from sparkml_dist.data.formats import SOURCE_FORMATS
from sparkml_dist.data.sources import (
    RawRows,
    csv_rows,
    numbered_lines,
    read_as,
    resolve_path,
    typed_rows,
    with_task,
)
from sparkml_dist.errors import ConfigError, DataError


@dataclass(frozen=True)
class StreamSource:
    """`frame` is the streaming DataFrame Spark reads; `rows_of` turns one of its micro-batches
    into raw rows with row ids (Spark allows no `monotonically_increasing_id` on a stream, so
    ids, parsing and checks happen per micro-batch, exactly as batch ingest does them); `data` is
    the config resolved against the source."""

    frame: DataFrame
    data: DataConfig
    rows_of: Callable[[DataFrame], RawRows]


def read_stream(spark: SparkSession, location: str, data: DataConfig, stream: StreamConfig) -> StreamSource:
    """Every file that arrives in `location` (a directory), in stream.format, else the format of
    the files already there, else data.format or the training rows' format."""
    path = storage.spark_path(resolve_path(location))
    options = dict(stream.source_options)
    if stream.max_files_per_trigger:
        options["maxFilesPerTrigger"] = str(stream.max_files_per_trigger)
    reader = spark.readStream.options(**options)
    fmt = stream.format or data.format_of_input(location)
    data = read_as(data, fmt, location)
    source = SOURCE_FORMATS.get(fmt)
    if not source.typed:  # text read by position: the lines, parsed per micro-batch
        return StreamSource(
            _opened(lambda: reader.text(path), location),
            with_task(data, list(data.columns)),
            lambda batch: csv_rows(numbered_lines(batch, data), data),
        )
    if source.catalog:
        frame = _opened(lambda: reader.table(location), location)
    else:
        schema = _source_schema(spark, path, location, fmt, stream)
        frame = _opened(lambda: reader.schema(schema).format(fmt).load(path), location)
    return StreamSource(
        frame,
        typed_rows(frame, location, data).data,
        lambda batch: typed_rows(batch, location, data, say_roles=False),
    )


def _opened(open_frame: Callable[[], DataFrame], location: str) -> DataFrame:
    try:
        return open_frame()
    except Exception as exc:
        raise DataError(
            f"cannot stream from '{location}': {str(exc).splitlines()[0]}. Give --input the directory "
            f"files are delivered to (create it first; every file that arrives there is scored)"
        ) from None


def _source_schema(
    spark: SparkSession, path: str, location: str, fmt: str, stream: StreamConfig
) -> StructType:
    """A streaming file source needs its schema up front: the configured one, else the one of the
    files already there (Spark would otherwise refuse to start)."""
    if stream.source_schema:
        try:
            return spark.createDataFrame([], stream.source_schema).schema
        except Exception as exc:
            raise ConfigError(
                f"stream.source_schema {stream.source_schema!r} is not Spark DDL: {str(exc).splitlines()[0]}"
            ) from None
    try:
        return spark.read.format(fmt).load(path).schema
    except Exception as exc:
        raise DataError(
            f"{location}: no {fmt} files to take the stream's schema from ({str(exc).splitlines()[0]}); "
            f"put one file in first, or give stream.source_schema as Spark DDL, e.g. "
            f"'age INT, city STRING'"
        ) from None
