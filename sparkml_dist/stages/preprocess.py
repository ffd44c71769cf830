"""Stage 1: raw CSV -> quarantined rejects + fitted features -> Parquet splits + manifest."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

from pyspark.ml import PipelineModel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from sparkml_dist import storage
from sparkml_dist.config.schema import DataConfig, JobConfig
from sparkml_dist.data.dataset import Manifest, PreprocessResult, describe_split, split_frame, write_split
from sparkml_dist.data.features import (
    FEATURES,
    build_feature_pipeline,
    compiled_from,
    feature_names,
    identifier_like,
    raw_features,
    to_feature_frame,
)
from sparkml_dist.data.ingest import LABEL, WEIGHT, IngestResult, ingest
from sparkml_dist.data.labels import EncodedRows, check_task, encode_labels, fit_target
from sparkml_dist.data.layout import FeatureLayout
from sparkml_dist.data.predicate import checked_predicate, named_columns
from sparkml_dist.data.raw_features import RAW_FEATURES_FILE, RawFeatures
from sparkml_dist.data.sources import (
    common_reasons,
    describe_reasons,
    fingerprint,
    resolve_path,
    schema_of,
    with_types_of,
)
from sparkml_dist.errors import DataError
from sparkml_dist.spark.rows import only_row
from sparkml_dist.spark.session import is_connect, job_phase
from sparkml_dist.storage.hadoop import atomic_dir
from sparkml_dist.storage.paths import OutputPaths
from sparkml_dist.tasks.base import Target

log = logging.getLogger(__name__)

__all__ = ["PreprocessResult", "preprocess", "select_rows"]


def preprocess(
    spark: SparkSession,
    cfg: JobConfig,
    fitted: PipelineModel | None = None,
    where: str | None = None,
    out: str | None = None,
    target: Target | None = None,
    trained_on: Mapping[str, str] | None = None,
    min_rows: int = 0,
) -> PreprocessResult:
    """Fit the feature pipeline and the target on the training rows (or reuse `fitted` and
    `target`, a model's own, when fine-tuning, with `trained_on`, its training schema: the new rows
    are read as it was trained) and write the splits under `out` (default
    `<output.root>/preprocess`, a path or URI); `where` keeps only the rows it matches, which must
    be at least `min_rows` (a fine-tune's one batch)."""
    out = storage.absolute(str(out)) if out is not None else OutputPaths.of(cfg).preprocess
    # an input ingested with the target has no unknown label left (ingest made each a reject)
    known_labels = {"train": target is not None, "test": True}
    inputs = {"train": _ingest_input(spark, cfg, "train", with_types_of(cfg.data, trained_on or {}), target)}
    try:
        data = inputs["train"].data
        check_task(cfg, data)
        accepted = {"train": select_rows(inputs["train"].accepted, where, cfg.data.label.column)}
        if min_rows:
            _check_selection(
                inputs["train"].accepted, accepted["train"], where, min_rows, cfg.data.label.column
            )
        with job_phase(spark, "preprocess: fit target"):
            target = target or fit_target(cfg, data, accepted["train"])
        # the test rows are read with the types the training rows resolved (a typed source), and a
        # class the target does not know is a reject with its file and line
        inputs["test"] = _ingest_input(spark, cfg, "test", with_types_of(cfg.data, schema_of(data)), target)
        accepted["test"] = select_rows(inputs["test"].accepted, where, cfg.data.label.column)
        with job_phase(spark, "preprocess: encode labels"):
            labelled = {
                name: encode_labels(rows, target, data, known_labels[name]) for name, rows in accepted.items()
            }
        log.info("task %s: %s", target.task, describe_target(target))
        train_rows, val_rows = split_frame(labelled["train"].known, data.validation_fraction, data.split_seed)
        with job_phase(spark, "preprocess: fit features"), _timed("fit features"):
            pipeline = fitted or build_feature_pipeline(data, cfg.features).fit(train_rows)
            raw = raw_features(pipeline)  # its fitted values, read once: stored features and the saved file
            if fitted is None and raw is not None:
                for warning in identifier_like(raw, inputs["train"].counts()["accepted"]):
                    log.warning(warning)
            encoded = _encode(
                pipeline,
                raw,
                {"train": train_rows, "val": val_rows, "test": labelled["test"].known},
                weighted=data.weight_column is not None,
            )
        with atomic_dir(spark, out) as staging, ThreadPoolExecutor(1, "preprocess-save") as background:
            # Spark ML's save is a dozen tiny jobs, latency not work: overlap it with the writes
            # (not on Spark Connect, whose ML writer needs the session active in its own thread)
            save = functools.partial(_save_pipeline, spark, pipeline, raw, f"{staging}/feature_pipeline")
            saved = None if is_connect(spark) else background.submit(save)
            if saved is None:
                save()
            _write_splits(spark, cfg, encoded, staging)
            with job_phase(spark, "preprocess: rejects and manifest"):
                _write_rejects(inputs, labelled, f"{staging}/rejects")
                names = raw.names if raw is not None else feature_names(pipeline, train_rows)
                manifest = _manifest(cfg, data, staging, names, encoded, inputs, labelled, target)
            if saved is not None:
                saved.result()
            manifest.save(staging)
    finally:
        for result in inputs.values():
            result.release()
    return PreprocessResult(out, manifest)


def describe_target(target: Target) -> str:
    """One line: the classes (and a binary model's threshold), or the label's scale."""
    if target.kind.thresholded:
        return f"positive '{target.classes[-1]}' at probability >= {target.threshold:.4g}"
    if target.classes:
        shown = ", ".join(target.classes[:10]) + (" ..." if len(target.classes) > 10 else "")
        return f"{len(target.classes)} classes ({shown})"
    return f"label mean {target.mean:.4g}, std {target.std:.4g} (predictions in the label's units)"


def _ingest_input(
    spark: SparkSession, cfg: JobConfig, name: str, data: DataConfig, target: Target | None
) -> IngestResult:
    """`data.<name>_path` ingested (with `target`: its unknown labels are rejects), with a progress line."""
    start = time.perf_counter()
    with job_phase(spark, f"preprocess: ingest {name}"):
        result = ingest(
            spark,
            getattr(cfg.data, f"{name}_path"),
            data,
            key=f"data.{name}_path",
            target=target,
            pack_wide=True,
        )
    seconds, counts = time.perf_counter() - start, result.counts()
    log.info(
        "ingest %s: %s rows in, %s rejected, in %.1f s (%s rows/s)",
        name,
        f"{counts['input']:,}",
        f"{counts['rejected']:,}",
        seconds,
        f"{counts['input'] / max(seconds, 1e-9):,.0f}",
    )
    if counts["rejected"]:
        _check_rejects(result, f"data.{name}_path", cfg.data.max_reject_fraction)
    return result


def _check_rejects(result: IngestResult, key: str, max_fraction: float) -> None:
    """Say why rows were rejected; stop when so many were that the config, not the rows, is wrong
    (a column typed int that holds 181.0 rejects them all but the missing ones, and training on
    the rest fails later for a reason that hides this one)."""
    reasons = describe_reasons(common_reasons(result.rejects))
    log.info("%s: rejected rows, %s", key, reasons)
    fraction = result.rejected_rows / result.input_rows
    if fraction > max_fraction:
        result.release()
        raise DataError(
            f"{key}: {result.rejected_rows:,} of {result.input_rows:,} rows ({fraction:.1%}) were "
            f"rejected, more than data.max_reject_fraction ({max_fraction:g}); {reasons}. Fix the "
            f"input or data.columns (a type, the delimiter, null_values), or raise "
            f"data.max_reject_fraction to go on with the rows that pass."
        )


def _save_pipeline(spark: SparkSession, pipeline: PipelineModel, raw: RawFeatures | None, path: str) -> None:
    """Spark ML's save, and beside its stages the same pipeline as plain data: the logged model
    scores raw rows with it where there is no Spark (data/raw_features.py, docs/serving.md)."""
    with job_phase(spark, "preprocess: save feature pipeline"):
        pipeline.save(path)
        if raw is not None:
            storage.write_json(storage.join(path, RAW_FEATURES_FILE), raw.to_json())


def _write_splits(spark: SparkSession, cfg: JobConfig, encoded: _Encoded, staging: str) -> None:
    ranks = cfg.train.num_ranks
    for name, frame in encoded.frames.items():
        files = ranks * cfg.data.files_per_rank if name == "train" else ranks
        with job_phase(spark, f"preprocess: write {name}"), _timed(f"write {name} ({files} files)"):
            write_split(frame, f"{staging}/{name}", files, cfg.data.row_group_rows, encoded.row_bytes)


@contextmanager
def _timed(phase: str) -> Iterator[None]:
    """A progress line per phase: preprocessing a large input is minutes without one."""
    start = time.perf_counter()
    yield
    log.info("%s: %.1f s", phase, time.perf_counter() - start)


@dataclass
class _Encoded:
    frames: dict[str, DataFrame]
    layout: FeatureLayout | None  # None: a dense `features` column
    dim: int

    @property
    def row_bytes(self) -> int:
        return self.layout.row_bytes if self.layout is not None else 4 * self.dim


def _encode(
    pipeline: PipelineModel, raw: RawFeatures | None, rows: dict[str, DataFrame], weighted: bool
) -> _Encoded:
    """Each split's rows as stored features: compact when the pipeline compiles (`raw`), else dense."""
    extra = (WEIGHT,) if weighted else ()
    if raw is not None:
        compiled = compiled_from(raw)
        frames = {name: compiled.frame(df, extra=extra) for name, df in rows.items()}
        return _Encoded(frames, compiled.layout, compiled.layout.dim)
    frames = {name: to_feature_frame(pipeline, df, extra=extra) for name, df in rows.items()}
    return _Encoded(frames, None, only_row(frames["train"].select(F.size(FEATURES)), "the training split")[0])


def select_rows(rows: DataFrame, where: str | None, label_column: str | None = None) -> DataFrame:
    """The rows a checked boolean predicate over the raw columns keeps (`finetune.where`). The
    label is there under its source name too (`label_column`), as the user knows it: ingest has
    renamed it `label`."""
    if not where:
        return rows
    named = _with_source_label(rows, label_column)
    return named.where(checked_predicate(named, where)).select(*rows.columns)


def _with_source_label(rows: DataFrame, label_column: str | None) -> DataFrame:
    if label_column and label_column not in rows.columns:
        return rows.withColumn(label_column, F.col(LABEL))
    return rows


def _check_selection(
    rows: DataFrame, selected: DataFrame, where: str | None, min_rows: int, label_column: str | None
) -> None:
    """Fewer rows than one batch train nothing worth a new version: say so before any work, with
    what the clause matched and, for the text columns it names, the values that do occur (a
    clause written 'female' against 'Female' matches nothing)."""
    count = selected.count()
    if count >= min_rows:
        return
    if not where:
        raise DataError(
            f"data.train_path has {count:,} accepted rows to fine-tune on, fewer than one batch "
            f"(train.batch_size {min_rows}): add rows or lower train.batch_size"
        )
    named = _with_source_label(rows, label_column)
    raise DataError(
        f"finetune.where {where!r} matched {count:,} of the {rows.count():,} accepted rows of "
        f"data.train_path, fewer than one batch (train.batch_size {min_rows})"
        f"{_values_that_occur(named, where)}. Widen the clause or lower train.batch_size."
    )


def _values_that_occur(rows: DataFrame, where: str, shown: int = 5) -> str:
    """'; sex is one of 'Male' (21,790), 'Female' (10,771)' for each text column `where` names."""
    parts = []
    for column in named_columns(rows, where):
        if not isinstance(rows.schema[column].dataType, StringType):
            continue
        top = rows.groupBy(column).count().orderBy(F.desc("count"), column).limit(shown + 1).collect()
        values = ", ".join(f"{r[column]!r} ({r['count']:,})" for r in top[:shown])
        parts.append(f"{column} is one of {values}" + (", ..." if len(top) > shown else ""))
    return "".join(f"; {p}" for p in parts)


def _write_rejects(inputs: dict[str, IngestResult], labelled: dict[str, EncodedRows], path: str) -> None:
    frames = [r.rejects.withColumn("input", F.lit(name)) for name, r in inputs.items()]
    frames += [e.unknown.withColumn("input", F.lit(name)) for name, e in labelled.items() if e.unknown_rows]
    union: DataFrame = frames[0]
    for f in frames[1:]:
        union = union.unionByName(f)
    union.coalesce(1).write.mode("overwrite").parquet(path)


def _manifest(
    cfg: JobConfig,
    data: DataConfig,
    staging: str,
    names: list[str],
    encoded: _Encoded,
    inputs: dict[str, IngestResult],
    labelled: dict[str, EncodedRows],
    target: Target,
) -> Manifest:
    classes = len(target.classes)
    splits = {name: describe_split(storage.join(staging, name), classes) for name in ("train", "val", "test")}
    schema = schema_of(data)
    counts = {name: _counts_after_labels(r, labelled[name]) for name, r in inputs.items()}
    return Manifest(
        feature_dim=encoded.dim,
        feature_names=names,
        splits=splits,
        input_fingerprint=fingerprint([resolve_path(cfg.data.train_path), resolve_path(cfg.data.test_path)]),
        inputs=counts,
        schema=schema,
        layout={
            "num_ranks": cfg.train.num_ranks,
            "files_per_rank": cfg.data.files_per_rank,
            "row_group_rows": cfg.data.row_group_rows,
        },
        feature_layout=encoded.layout.to_json() if encoded.layout is not None else None,
        target=target.to_json(),
        weighted=data.weight_column is not None,
    )


def _counts_after_labels(result: IngestResult, labels: EncodedRows) -> dict[str, int]:
    """Ingest's counts with the rows whose label the target did not know moved to the rejects."""
    counts = result.counts()
    return counts | {
        "accepted": counts["accepted"] - labels.unknown_rows,
        "rejected": counts["rejected"] + labels.unknown_rows,
    }
