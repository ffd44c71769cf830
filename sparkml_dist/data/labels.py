"""The label between ingest and the network: fitted into a `Target` on the training rows, then
encoded (class index, or the value) for every split. A row whose label the target does not know
(a class absent from the training rows, or from the model being fine-tuned) is rejected with its
reason, like any other unusable row."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkml_dist.config.schema import DataConfig, JobConfig
from sparkml_dist.data.ingest import LABEL, RAW_LINE, REASON, ROW_ID, SOURCE_FILE, unknown_label_reason
from sparkml_dist.data.sql import ident, raw_json
from sparkml_dist.errors import ConfigError, DataError
from sparkml_dist.tasks.base import Target, get_task
from sparkml_dist.tasks.checks import task_problems


@dataclass
class EncodedRows:
    known: DataFrame  # label encoded (float)
    unknown: DataFrame  # rejects: source_file, row_id, raw_line, reason
    unknown_rows: int


def encode_labels(rows: DataFrame, target: Target, data: DataConfig, all_known: bool = False) -> EncodedRows:
    """Split `rows` into those whose label the target knows (encoded) and rejects for the rest.
    `all_known`: `rows` were ingested with this target, which made an unknown label a reject
    there (data/ingest.py), so none is left to count."""
    code = get_task(target.task).encode(target, F.col(LABEL))
    # the label replaced where it stands: a wide source's rows are hundreds of columns, and each
    # projection that names them all is analysed again by every plan over it
    unknown = rows.where(code.isNull())
    count = 0 if all_known else unknown.count()
    known = rows.where(code.isNotNull()).withColumn(LABEL, code)
    reason = unknown_label_reason(target, data.label.column, F.col(LABEL))
    rejects = unknown.select(
        F.lit(None).cast("string").alias(SOURCE_FILE),
        F.col(ROW_ID),
        F.expr(raw_json(", ".join(ident(c) for c in rows.columns))).alias(RAW_LINE),
        reason.alias(REASON),
    )
    return EncodedRows(known, rejects, count)


def check_task(cfg: JobConfig, data: DataConfig) -> None:
    """What the config asks of the task the source's label decided (a typed source's label type
    is only known once read): the same checks as at load, naming the keys."""
    problems = task_problems(
        cfg.model_copy(update={"data": data}), data.label.resolved_task
    )  # the label as the source resolved it
    if problems:
        raise ConfigError("; ".join(f"{'.'.join(loc)}: {message}" for loc, message in problems))


def fit_target(cfg: JobConfig, data: DataConfig, rows: DataFrame) -> Target:
    try:
        target = get_task(data.label.resolved_task).fit(data.label, rows, LABEL)
    except ValueError as exc:
        raise DataError(str(exc)) from None
    threshold = cfg.evaluate.threshold
    return replace(target, threshold=threshold) if isinstance(threshold, float) else target


def model_target(target: Target, data: DataConfig) -> Target:
    """A model's target; a binary model logged before targets were recorded has no classes, and
    gets them from the config's positive and negative values."""
    if target.classes or not target.kind.thresholded:
        return target
    label = data.label
    if label.positive is None or label.negative is None:
        raise ConfigError("the model records no classes: give data.label.positive and data.label.negative")
    return replace(target, classes=(label.negative, label.positive))
