"""Raw input -> typed rows + quarantined rejects, with a reason per reject.

A source (`data.format`) turns its input into rows of raw columns plus a raw text for each row
(`data/sources.py`: CSV lines parsed with the config's types; Parquet, ORC, JSON and tables with
the source's own types). Every row then ends up in exactly one of the two outputs, so
input = accepted + rejected always holds (checked by `IngestResult.reconcile`).

The label is read as its task reads it (`tasks/`): a normalised string for a classifier, a
number for regression; the task says which labels are unusable. The accepted rows carry it as
`label`, not yet encoded: encoding needs the target fitted on the training rows (preprocess).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkml_dist.config.schema import DataConfig
from sparkml_dist.data.dataset import LABEL
from sparkml_dist.data.packed import packed_values, unpacked
from sparkml_dist.data.raw_features import WIDE_NUMBERS
from sparkml_dist.data.sources import RAW_LINE, ROW_ID, SOURCE_FILE, RawRows, read_source, resolve_path
from sparkml_dist.data.sql import ident
from sparkml_dist.errors import DataError
from sparkml_dist.spark.rows import only_row
from sparkml_dist.tasks.base import Target, get_task

WEIGHT = "weight"
REASON = "reason"

__all__ = [
    "LABEL",
    "RAW_LINE",
    "REASON",
    "ROW_ID",
    "SOURCE_FILE",
    "WEIGHT",
    "IngestResult",
    "checked_rows",
    "ingest",
    "split_checked",
]


@dataclass
class IngestResult:
    accepted: DataFrame
    rejects: DataFrame  # source_file, row_id, raw_line, reason
    input_rows: int
    accepted_rows: int
    rejected_rows: int
    data: DataConfig  # the config resolved against the source: every column typed, the task named
    cached: DataFrame | None = None  # what `accepted` and `rejects` read from; `release` frees it

    def __enter__(self) -> IngestResult:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def release(self) -> None:
        """Drop the cached rows once both outputs are written (a later ingest of the same input
        would otherwise be served stale from Spark's cache)."""
        if self.cached is not None:
            self.cached.unpersist()

    def reconcile(self) -> None:
        if self.input_rows != self.accepted_rows + self.rejected_rows:
            raise DataError(
                f"row counts do not reconcile: input {self.input_rows} != "
                f"accepted {self.accepted_rows} + rejected {self.rejected_rows}"
            )

    def counts(self) -> dict[str, int]:
        return {"input": self.input_rows, "accepted": self.accepted_rows, "rejected": self.rejected_rows}

    @property
    def task(self) -> str:
        return self.data.label.resolved_task


def ingest(
    spark: SparkSession,
    location: str,
    cfg: DataConfig,
    require_label: bool = True,
    key: str | None = None,
    target: Target | None = None,
    pack_wide: bool = False,
) -> IngestResult:
    """Read `location`, type and check its rows, split into accepted and rejects (cached). `key`
    is the config key or flag that named `location`: an error about the input starts with it, so
    the user knows which setting to fix (a job reads several inputs). With a fitted `target`, a
    label it does not know (a class absent from the training rows) is a reject here, with its
    file and line like any other. `pack_wide`: a wide run of numeric features is cached as one
    array column, which the accepted rows also carry (`data/packed.py`)."""
    try:
        return _ingest(spark, location, cfg, require_label, target, pack_wide)
    except DataError as exc:
        if key is None:
            raise
        raise DataError(f"{key}: {exc}") from None


def _ingest(
    spark: SparkSession,
    location: str,
    cfg: DataConfig,
    require_label: bool,
    target: Target | None,
    pack_wide: bool,
) -> IngestResult:
    raw = read_source(spark, resolve_path(location), location, cfg)
    if require_label:
        _require_label_columns(raw.data, location)
    numeric = raw.data.names_with_role("numeric")
    packed = numeric if pack_wide and len(numeric) >= WIDE_NUMBERS else None
    checked = checked_rows(raw, require_label, target, packed)
    columns = unpacked(list(_typed(raw.data, require_label)), numeric) if packed else None
    result = split_checked(checked.cache(), raw.data, columns)
    if result.input_rows == 0:
        result.release()
        raise DataError(f"{location}: no input rows (the file is empty or holds only blank lines)")
    if result.rejected_rows == result.input_rows:
        raw.explain_all_rejected(result.rejects, location)
    return result


def checked_rows(
    raw: RawRows, require_label: bool, target: Target | None = None, packed: list[str] | None = None
) -> DataFrame:
    """The typed columns, and for a row that fails a check its file, raw text and reason (null
    reason: accepted). Works on a batch or a streaming frame alike. `packed`: these numeric
    columns are one array column instead (`data/packed.py`)."""
    reason = _reject_reason(raw, raw.data, require_label, target)
    if packed:
        # one projection over the source: another under it would pass every raw column through
        # (a row of hundreds of values written out again), and Spark evaluates the reason its
        # three uses share once a row (subexpression elimination)
        row_id, *typed = _columns(_typed(raw.data, require_label), leave_out=set(packed))
        bad = reason.isNotNull()
        return raw.rows.select(
            row_id,
            packed_values(packed),
            *typed,
            F.when(bad, F.col(SOURCE_FILE)).alias(SOURCE_FILE),
            F.when(bad, raw.raw_line).alias(RAW_LINE),
            reason.alias(REASON),
        )
    typed = _columns(_typed(raw.data, require_label))
    # The reason once (a wide source's checks are hundreds of expressions), in its own projection
    # under the one that reads it: the raw text and file are then made only where a row is
    # rejected. The accepted rows' strings would make the cache several times larger and slower.
    reasoned = raw.rows.withColumn(REASON, reason)
    bad = F.col(REASON).isNotNull()
    return reasoned.select(
        *typed,
        F.when(bad, F.col(SOURCE_FILE)).alias(SOURCE_FILE),
        F.when(bad, raw.raw_line).alias(RAW_LINE),
        REASON,
    )


def split_checked(checked: DataFrame, data: DataConfig, columns: list[str] | None = None) -> IngestResult:
    """`checked_rows` (cached by the caller: both outputs and the counts read it) split into the
    accepted rows and the rejects, counted, the counts reconciled. `columns`: the accepted rows'
    columns as SQL that reads them out of packed ones (`data/packed.py`; default: its typed
    columns, by position: checked_rows puts its three after them)."""
    bad = F.col(REASON).isNotNull()
    typed = columns or [ident(n) for n in checked.columns[:-3]]
    rejects = checked.where(bad).select(SOURCE_FILE, ROW_ID, RAW_LINE, REASON)
    accepted = checked.where(~bad).selectExpr(*typed)  # SQL text: one JVM call (data/sql.py)
    counts = only_row(checked.agg(F.count(F.lit(1)).alias("n"), F.count(F.col(REASON)).alias("bad")))
    result = IngestResult(
        accepted, rejects, counts["n"], counts["n"] - counts["bad"], counts["bad"], data, checked
    )
    result.reconcile()
    return result


def _require_label_columns(data: DataConfig, location: str) -> None:
    names = [c.name for c in data.columns]
    for key, name in (("data.label.column", data.label.column), ("data.weight_column", data.weight_column)):
        if name is not None and name not in names:
            raise DataError(
                f"{location}: column '{name}' ({key}) is not in the source; its columns: "
                f"{names[:50]}{' ...' if len(names) > 50 else ''}. Training and evaluation need it "
                f"(only scoring reads rows without it)"
            )


def _reject_reason(raw: RawRows, data: DataConfig, require_label: bool, target: Target | None) -> Column:
    problems: list[Column] = list(raw.problems)
    for c in data.columns:
        if c.role == "label":
            if require_label:
                task = get_task(data.label.resolved_task)
                problem = task.label_problem(data.label, F.col(c.name))
                problems.append(problem)
                if (
                    target is not None
                ):  # one reason a row: a label the config already refuses is not also unknown
                    value = task.label_value(data.label, F.col(c.name))
                    problems.append(
                        F.when(
                            problem.isNull() & value.isNotNull() & task.encode(target, value).isNull(),
                            unknown_label_reason(target, c.name, F.col(c.name)),
                        )
                    )
        elif c.role == "weight" and require_label:  # scoring needs no weights
            problems.append(_weight_problem(c.name))
    joined = F.concat_ws("; ", *problems)  # concat_ws skips nulls: "" means no problem
    return F.when(joined == "", F.lit(None).cast("string")).otherwise(joined)


def unknown_label_reason(target: Target, label_column: str, value: Column) -> Column:
    """The reason for a row whose label `target` does not know."""
    shown = ", ".join(target.classes[:20]) + (" ..." if len(target.classes) > 20 else "")
    return F.concat(
        F.lit(f"label '{label_column}': '"),
        value.cast("string"),
        F.lit(f"' is not a class of the target ({shown})"),
    )


def _weight_problem(name: str) -> Column:
    value = F.col(name).cast("double")
    return F.when(value.isNull(), F.lit(f"weight '{name}' is missing")).when(
        F.isnan(value) | (F.abs(value) == float("inf")) | (value < 0),
        F.concat(
            F.lit(f"weight '{name}': '"), F.col(name).cast("string"), F.lit("' is not a finite number >= 0")
        ),
    )


def _typed(data: DataConfig, with_label: bool) -> dict[str, str | Column]:
    """Each typed column by its name, in order: a feature as SQL text (made a column only where it
    is used: a wide source's hundreds are a JVM call each, data/sql.py), the label and weight as
    columns."""
    typed: dict[str, str | Column] = {ROW_ID: ident(ROW_ID)}
    for c in data.columns:
        if c.role in ("numeric", "categorical", "id"):
            typed[c.name] = (
                f"CAST({ident(c.name)} AS DOUBLE) AS {ident(c.name)}"
                if c.role == "numeric"
                else ident(c.name)
            )
    if with_label:
        task = get_task(data.label.resolved_task)
        typed[LABEL] = task.label_value(data.label, F.col(data.label.column)).alias(LABEL)
        if data.weight_column:
            typed[WEIGHT] = F.col(data.weight_column).cast("double").alias(WEIGHT)
    return typed


def _columns(typed: dict[str, str | Column], leave_out: set[str] | None = None) -> list[Column]:
    """`_typed`'s columns, but those in `leave_out`."""
    return [F.expr(v) if isinstance(v, str) else v for n, v in typed.items() if n not in (leave_out or ())]
