"""Raw delimited text -> typed rows + quarantined rejects, with a reason per reject.

Every non-blank input line ends up in exactly one of the two outputs, so
input = accepted + rejected always holds (checked by `IngestResult.reconcile`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkml_dist.config.schema import ColumnSpec, DataConfig
from sparkml_dist import storage
from sparkml_dist.data.sources import local_files, resolve_path
from sparkml_dist.errors import DataError

ROW_ID = "row_id"
LABEL = "label"
SOURCE_FILE = "source_file"
RAW_LINE = "raw_line"
REASON = "reason"
_CORRUPT = "_corrupt"
_SPARK_TYPES = {"int": "int", "double": "double", "string": "string"}


@dataclass
class IngestResult:
    accepted: DataFrame
    rejects: DataFrame  # source_file, row_id, raw_line, reason
    input_rows: int
    accepted_rows: int
    rejected_rows: int
    cached: DataFrame | None = None  # what `accepted` and `rejects` read from; `release` frees it

    def __enter__(self) -> "IngestResult":
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


def ingest(spark: SparkSession, location: str, cfg: DataConfig, require_label: bool = True) -> IngestResult:
    """Read `location`, parse with the config's schema, split into accepted and rejects (cached)."""
    path = resolve_path(location)
    lines = _read_lines(spark, path, cfg)
    parsed = _parse(lines, cfg)
    reason = _reject_reason(parsed, cfg, require_label)
    bad = reason.isNotNull()
    # Cache typed values, and the raw line and file only where a row is rejected: the accepted
    # rows' strings would make the cache several times larger and slower to build.
    typed = _typed_columns(cfg, require_label)
    checked = parsed.select(*typed, F.when(bad, F.col(SOURCE_FILE)).alias(SOURCE_FILE),
                            F.when(bad, F.col(RAW_LINE)).alias(RAW_LINE), reason.alias(REASON)).cache()
    rejects = checked.where(F.col(REASON).isNotNull()).select(SOURCE_FILE, ROW_ID, RAW_LINE, REASON)
    accepted = checked.where(F.col(REASON).isNull()).select(*checked.columns[:len(typed)])
    counts = checked.agg(
        F.count(F.lit(1)).alias("n"), F.count(F.col(REASON)).alias("bad")
    ).first()
    if counts["n"] == 0:
        raise DataError(f"{location}: no input rows (the file is empty or holds only blank lines)")
    if counts["n"] == counts["bad"]:
        _raise_if_structural(rejects, location, cfg)
    result = IngestResult(accepted, rejects, counts["n"], counts["n"] - counts["bad"], counts["bad"], checked)
    result.reconcile()
    return result


def _raise_if_structural(rejects: DataFrame, location: str, cfg: DataConfig) -> None:
    """Every row rejected with the same wrong field count is a schema problem, not dirty rows."""
    fields = F.size(F.split(F.col(RAW_LINE), re.escape(cfg.delimiter)))
    top = rejects.groupBy(fields.alias("fields")).count().orderBy(F.desc("count")).first()
    expected = len(cfg.columns)
    if top is not None and top["fields"] != expected:
        names = ", ".join(c.name for c in cfg.columns)
        raise DataError(
            f"{location}: every row was rejected; most rows have {top['fields']} fields but data.columns "
            f"lists {expected} ({names}). The input's columns differ from the config (missing or extra "
            f"columns, or another delimiter than '{cfg.delimiter}'); fix data.columns or the input. "
            f"Rejected rows and reasons: see the rejects output."
        )


def check_header(spark: SparkSession, path: str, cfg: DataConfig) -> None:
    """With data.header, the header must name exactly the configured columns (any order is not
    accepted: CSV columns are positional)."""
    files = local_files(path)
    headers = ({str(f): f.open().readline() for f in files} if files
               else {path: spark.read.text(storage.spark_path(path)).first()["value"]})
    expected = [c.name for c in cfg.columns]
    for name, line in headers.items():
        got = [h.strip() for h in line.strip().split(cfg.delimiter)]
        if got != expected:
            missing = [c for c in expected if c not in got]
            extra = [c for c in got if c not in expected]
            raise DataError(f"{name}: header {got} does not match data.columns; missing {missing}, "
                            f"unexpected {extra}. Fix the input or data.columns (order matters).")


def _read_lines(spark: SparkSession, path: str, cfg: DataConfig) -> DataFrame:
    try:
        text = spark.read.text(storage.spark_path(path))
    except Exception as exc:  # AnalysisException: path does not exist
        raise DataError(f"cannot read input '{path}': {str(exc).splitlines()[0]}") from None
    lines = (
        text.where(F.trim("value") != "")
        .withColumn(SOURCE_FILE, F.input_file_name())
        .withColumn(ROW_ID, F.monotonically_increasing_id())
    )
    if cfg.header:
        check_header(spark, path, cfg)
        header = cfg.delimiter.join(c.name for c in cfg.columns)
        lines = lines.where(F.regexp_replace("value", r"\s", "") != header.replace(" ", ""))
    return lines


def _parse(lines: DataFrame, cfg: DataConfig) -> DataFrame:
    schema = ", ".join(f"`{c.name}` STRING" for c in cfg.columns) + f", {_CORRUPT} STRING"
    options = {
        "sep": cfg.delimiter,
        "ignoreLeadingWhiteSpace": "true",
        "ignoreTrailingWhiteSpace": "true",
        "mode": "PERMISSIVE",
        "columnNameOfCorruptRecord": _CORRUPT,
    }
    parsed = lines.withColumn("_parsed", F.from_csv(F.col("value"), schema, options))
    cols = [F.col(f"_parsed.`{c.name}`").alias(c.name) for c in cfg.columns]
    out = parsed.select(SOURCE_FILE, ROW_ID, F.col("value").alias(RAW_LINE), *cols,
                        F.col(f"_parsed.{_CORRUPT}").alias(_CORRUPT))
    for c in cfg.columns:  # the config's null markers (Adult's '?') become real nulls
        out = out.withColumn(c.name, F.when(F.col(c.name).isin(cfg.null_values), None).otherwise(F.col(c.name)))
    return out


def _reject_reason(df: DataFrame, cfg: DataConfig, require_label: bool) -> Column:
    n = len(cfg.columns)
    problems: list[Column] = [
        F.when(F.col(_CORRUPT).isNotNull(), F.lit(f"malformed line: expected {n} fields separated by '{cfg.delimiter}'"))
    ]
    for c in cfg.columns:
        if c.role == "label":
            if require_label:
                problems.append(_label_problem(cfg))
        elif c.type in ("int", "double"):
            problems.append(_numeric_problem(c))
    joined = F.concat_ws("; ", *problems)  # concat_ws skips nulls: "" means no problem
    return F.when(joined == "", F.lit(None).cast("string")).otherwise(joined)


def _numeric_problem(c: ColumnSpec) -> Column:
    raw = F.col(c.name)
    cast = raw.try_cast(_SPARK_TYPES[c.type])
    bad_type = raw.isNotNull() & cast.isNull()
    msg_type = F.concat(F.lit(f"column '{c.name}': '"), raw, F.lit(f"' is not {'an int' if c.type == 'int' else 'a number'}"))
    if c.type == "double":
        not_finite = cast.isNotNull() & (F.isnan(cast) | (F.abs(cast) == float("inf")))
        return F.when(bad_type, msg_type).when(
            not_finite, F.concat(F.lit(f"column '{c.name}': '"), raw, F.lit("' is not finite (NaN/inf)"))
        )
    return F.when(bad_type, msg_type)


def normalized_label(cfg: DataConfig) -> Column:
    raw = F.col(cfg.label.column)
    suffix = cfg.label.strip_suffix
    if suffix:
        raw = F.when(raw.endswith(suffix), raw.substr(F.lit(1), F.length(raw) - len(suffix))).otherwise(raw)
    return raw


def _label_problem(cfg: DataConfig) -> Column:
    lab = normalized_label(cfg)
    allowed = [cfg.label.positive, cfg.label.negative]
    return F.when(F.col(cfg.label.column).isNull(), F.lit(f"label '{cfg.label.column}' is missing")).when(
        ~lab.isin(allowed),
        F.concat(F.lit(f"label '{cfg.label.column}': unknown value '"), F.col(cfg.label.column),
                 F.lit(f"' (expected '{allowed[0]}' or '{allowed[1]}')")),
    )


def _typed_columns(cfg: DataConfig, with_label: bool) -> list[Column]:
    cols = [F.col(ROW_ID)]
    for c in cfg.columns:
        if c.role in ("numeric", "categorical", "id"):
            target = "double" if c.role == "numeric" else _SPARK_TYPES[c.type]
            cols.append(F.col(c.name).try_cast(target).alias(c.name))
    if with_label:
        cols.append((normalized_label(cfg) == cfg.label.positive).cast("double").alias(LABEL))
    return cols

