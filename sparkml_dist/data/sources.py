"""Input sources (`data.format`): each turns its input into raw rows for ingest.

- `csv`: text lines parsed with the config's column list and types (`data.columns`, in order);
  a line with the wrong field count or a value that does not parse is a reject with its reason.
- `parquet`, `orc`, `json`: Spark's readers; `table`: `spark.table(<path>)`. Types come from the
  source schema and roles from the types (numbers -> numeric, strings and booleans ->
  categorical, anything else -> ignore); `data.columns` entries only override roles.

`pkg://<package>/<path>` names a data file shipped inside an installed Python package (how the
real datasets arrive offline); anything else is a path, glob or URI.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkml_dist import storage
from sparkml_dist.config.header import header_fields, header_names
from sparkml_dist.config.schema import ColumnSpec, DataConfig
from sparkml_dist.data.formats import SOURCE_FORMATS
from sparkml_dist.data.sql import ident, literal, raw_json
from sparkml_dist.errors import ConfigError, DataError
from sparkml_dist.spark.compat import try_cast
from sparkml_dist.storage.packages import PKG_SCHEME, resolve_path  # noqa: F401 - re-exported
from sparkml_dist.tasks.base import TASKS, boolean_label_task, resolve_task

log = logging.getLogger(__name__)

ROW_ID, SOURCE_FILE, RAW_LINE = "row_id", "source_file", "raw_line"
_CORRUPT = "_corrupt"
_SOURCE = "_source_value_of_"
_CASTS = {"int": "int", "double": "double", "string": "string", "boolean": "boolean"}
# the name pandas' to_parquet gives an index it stores as a column (any but a default RangeIndex)
PANDAS_INDEX = re.compile(r"__index_level_\d+__")
_KINDS = {
    "int": "an int",
    "double": "a number",
    "boolean": "true or false",
    "string": "text",
}  # in reject reasons


@dataclass
class RawRows:
    """What a source hands ingest: `rows` has source_file, row_id, raw_line and every configured
    column already typed (null where a value did not parse); `problems` are the source's own
    reject reasons; `data` is the config resolved against the source (every column with a type
    and a role, the task named)."""

    rows: DataFrame
    problems: list[Column]
    data: DataConfig
    explain_all_rejected: Callable[[DataFrame, str], None]
    # a row's raw text, over `rows`' columns: ingest evaluates it for rejected rows only (a JSON
    # text of every accepted row of a wide source would cost more than reading it)
    raw_line: Column


def read_source(spark: SparkSession, path: str, location: str, cfg: DataConfig) -> RawRows:
    """`location`'s rows, read by its format's registered reader (`data/formats.py`): `read_csv`
    or `read_typed` for the built-ins."""
    fmt = cfg.format_of_input(location)
    return SOURCE_FORMATS.get(fmt).read(spark, path, location, read_as(cfg, fmt, location))


def read_as(cfg: DataConfig, fmt: str, location: str) -> DataConfig:
    """`cfg` for reading `location` in `fmt`, which may differ from the training rows' format.
    Rows trained from a typed source cannot be read from CSV: CSV is read by position, and only
    data.columns (every column, in file order, with its type) says what each position is."""
    if fmt == cfg.source_format:
        return cfg
    if not SOURCE_FORMATS.get(fmt).typed and cfg.typed:
        raise DataError(
            f"'{location}' is CSV, but the training rows are {cfg.source_format}, so data.columns does "
            f"not list every column in file order with its type, as CSV needs. Give these rows as "
            f"{cfg.source_format} (or JSON lines, ORC), or train from CSV with data.columns"
        )
    return cfg.model_copy(update={"format": fmt})


def with_task(cfg: DataConfig, columns: list[ColumnSpec]) -> DataConfig:
    """`cfg` with these columns and its task resolved from the label's type; the label settings
    are checked against that task."""
    label_type = next((c.type for c in columns if c.name == cfg.label.column), None)
    label = cfg.label
    # a typed source's true/false label names its classes (true the positive one) for a task that
    # takes them from it: the one asked for, or by default the task that does (binary)
    unnamed = cfg.typed and label_type == "boolean" and label.positive is None and label.negative is None
    if unnamed and TASKS.get(label.task or boolean_label_task()).boolean_classes:
        label = label.model_copy(update={"positive": "true", "negative": "false"})
    task = resolve_task(label, label_type)
    try:
        TASKS.get(task).check_label(label)
    except ValueError as exc:
        raise ConfigError(f"data.label: {exc}") from None
    return cfg.model_copy(update={"columns": columns, "label": label.model_copy(update={"task": task})})


# ---- csv ---------------------------------------------------------------------------------------


def read_csv(spark: SparkSession, path: str, location: str, cfg: DataConfig) -> RawRows:
    return csv_rows(_read_lines(spark, path, cfg), cfg)


def csv_rows(lines: DataFrame, cfg: DataConfig) -> RawRows:
    """Text lines (value, source_file, row_id; a batch or a streaming frame) parsed with the
    config's columns and types."""
    schema = ", ".join(f"`{c.name}` STRING" for c in cfg.columns) + f", {_CORRUPT} STRING"
    options = {
        "sep": cfg.delimiter,
        "ignoreLeadingWhiteSpace": "true",
        "ignoreTrailingWhiteSpace": "true",
        "mode": "PERMISSIVE",
        "columnNameOfCorruptRecord": _CORRUPT,
    }
    parsed = lines.withColumn("_parsed", F.from_csv(F.col("value"), schema, options))
    raw = {c.name: F.col(f"_parsed.`{c.name}`") for c in cfg.columns}
    raw = {name: F.when(col.isin(cfg.null_values), None).otherwise(col) for name, col in raw.items()}
    n = len(cfg.columns)
    problems = [
        F.when(
            F.col(f"_parsed.{_CORRUPT}").isNotNull(),
            F.lit(f"malformed line: expected {n} fields separated by '{cfg.delimiter}'"),
        )
    ]
    typed = []
    for c in cfg.columns:
        if c.role == "label":  # the task reads the raw text
            typed.append(raw[c.name].alias(c.name))
            continue
        typed.append(try_cast(raw[c.name], _CASTS[c.given_type]).alias(c.name))
        if c.type != "string":
            problems.append(_parse_problem(c, raw[c.name]))
    # the problems read the parse result: evaluated on `parsed`, carried as one column
    reason = F.concat_ws("; ", *problems)
    rows = parsed.select(
        SOURCE_FILE, ROW_ID, F.col("value").alias(RAW_LINE), *typed, reason.alias("_source_problem")
    )
    problem = F.when(F.col("_source_problem") == "", F.lit(None).cast("string")).otherwise(
        F.col("_source_problem")
    )
    return RawRows(
        rows,
        [problem],
        with_task(cfg, list(cfg.columns)),
        lambda rejects, where: _explain_csv(rejects, where, cfg),
        F.col(RAW_LINE),
    )


def _parse_problem(c: ColumnSpec, raw: Column) -> Column:
    cast = try_cast(raw, _CASTS[c.given_type])
    message = _not_read_as_type(c, raw, cast)
    if c.type == "double" and c.role != "weight":
        not_finite = cast.isNotNull() & (F.isnan(cast) | (F.abs(cast) == float("inf")))
        message = message.when(
            not_finite, F.concat(F.lit(f"column '{c.name}': '"), raw, F.lit("' is not finite (NaN/inf)"))
        )
    return message


def _read_lines(spark: SparkSession, path: str, cfg: DataConfig) -> DataFrame:
    try:
        text = spark.read.text(storage.spark_path(path))
    except Exception as exc:  # AnalysisException: path does not exist
        raise DataError(f"cannot read input '{path}': {str(exc).splitlines()[0]}") from None
    if cfg.header:
        check_header(spark, path, cfg)
    return numbered_lines(text, cfg)


def numbered_lines(text: DataFrame, cfg: DataConfig) -> DataFrame:
    """Spark's text rows (`value`) without blank and header lines, with their file and a row id."""
    lines = (
        text.where(F.trim("value") != "")
        .withColumn(SOURCE_FILE, F.input_file_name())
        .withColumn(ROW_ID, F.monotonically_increasing_id())
    )
    if cfg.header:
        header = cfg.delimiter.join(header_fields([c.name for c in cfg.columns]))
        lines = lines.where(F.regexp_replace("value", r"\s", "") != header.replace(" ", ""))
    return lines


def check_header(spark: SparkSession, path: str, cfg: DataConfig) -> None:
    """With data.header, the header must name exactly the configured columns (any order is not
    accepted: CSV columns are positional). A repeated or empty name in the header is the column
    name `header_names` makes of it."""
    files = local_files(path)
    if files:
        headers = {str(f): f.open().readline() for f in files}
    else:
        first = spark.read.text(storage.spark_path(path)).first()
        headers = {path: first["value"] if first is not None else ""}  # empty: no header, refused below
    expected = [c.name for c in cfg.columns]
    for name, line in headers.items():
        got = header_names(line.strip().split(cfg.delimiter))
        if got != expected:
            missing = [c for c in expected if c not in got]
            extra = [c for c in got if c not in expected]
            raise DataError(
                f"{name}: header {got} does not match data.columns; missing {missing}, "
                f"unexpected {extra}. Fix the input or data.columns (order matters)."
            )


def _explain_csv(rejects: DataFrame, location: str, cfg: DataConfig) -> None:
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
    _explain_typed(rejects, location)


# ---- parquet, orc, json, table -------------------------------------------------------------------


def read_typed(spark: SparkSession, path: str, location: str, cfg: DataConfig) -> RawRows:
    fmt = cfg.source_format
    try:
        frame = (
            spark.table(path)
            if SOURCE_FORMATS.get(fmt).catalog
            else spark.read.format(fmt).load(storage.spark_path(path))
        )
        _ = frame.schema  # resolving the schema is where a missing path or a wrong format fails
    except Exception as exc:  # AnalysisException: no such path or table, not that format
        raise DataError(f"cannot read {fmt} input '{location}': {root_cause(exc)}") from None
    return typed_rows(frame, location, cfg)


def root_cause(exc: Exception) -> str:
    """What went wrong, in one line: the innermost Java exception's message for a Py4J error
    (whose first line says only which call failed: "An error occurred while calling o95.load"),
    else the first line."""
    cause = getattr(exc, "java_exception", None)
    try:
        while cause is not None and cause.getCause() is not None:
            cause = cause.getCause()
        message = cause.getMessage() if cause is not None else None
    except Exception:
        message = None
    return (message or str(exc) or type(exc).__name__).splitlines()[0]


def typed_rows(frame: DataFrame, location: str, cfg: DataConfig, say_roles: bool = True) -> RawRows:
    """A typed source's rows (a batch or a streaming frame) with the configured roles and casts.
    `say_roles=False`: no log line for the columns that are not features (a stream's micro-batches,
    whose source said it once)."""
    # Spark's JSON reader (PERMISSIVE) keeps a line it cannot parse in this column: a reject, not a feature
    corrupt = frame.sparkSession.conf.get("spark.sql.columnNameOfCorruptRecord", "_corrupt_record")
    fields = [f for f in frame.schema.fields if f.name != corrupt]
    columns = resolve_columns(cfg, fields, location, say_roles)
    source_types = {f.name: _type_name(f.dataType) for f in fields}
    typed = [_typed(c, source_types[c.name]) for c in columns]
    # a cast column's source value stays alongside, under a private name, for the raw text
    cast = {c.name: _SOURCE + c.name for c, t in zip(columns, typed) if t != ident(c.name)}
    malformed = corrupt if corrupt in frame.columns else None
    rows = frame.selectExpr(
        f"input_file_name() AS {SOURCE_FILE}",
        f"monotonically_increasing_id() AS {ROW_ID}",
        *typed,
        *[f"{ident(name)} AS {ident(hidden)}" for name, hidden in cast.items()],
        *([f"{ident(malformed)} AS {ident(_SOURCE + malformed)}"] if malformed else []),
    )
    as_read = ", ".join(
        f"{ident(cast[f.name])} AS {ident(f.name)}" if f.name in cast else ident(f.name) for f in fields
    )
    raw_line = F.expr(raw_json(as_read))
    doubles = [c.name for c in columns if c.role == "numeric" and c.type == "double"]
    problems = [_not_finite(doubles)] if doubles else []
    problems += [
        _not_read_as_type(c, F.col(cast[c.name]), F.col(c.name), source_types[c.name])
        for c in columns
        if c.name in cast and c.role not in ("ignore", "weight")
    ]  # a weight has its own check (ingest)
    if malformed:
        text = F.col(_SOURCE + malformed)
        problems.insert(
            0, F.when(text.isNotNull(), F.lit("malformed record: the source's reader could not parse it"))
        )
        raw_line = F.coalesce(text, raw_line)
    return RawRows(rows, problems, with_task(cfg, columns), _explain_typed, raw_line)


def _not_read_as_type(c: ColumnSpec, source: Column, typed: Column, source_type: str | None = None) -> Column:
    """The reason for a value that is there in the source but null once read as the column's type:
    a reject, in CSV and typed sources alike (imputing it as missing would hide it). A fraction
    read as an int is one too: the cast truncates, and 1.5 would be trained on or scored as 1."""
    unread = source.isNotNull() & typed.isNull()
    if c.type == "int" and source_type == "double":
        unread = unread | (typed.isNotNull() & (source.cast("double") != typed.cast("double")))
    return F.when(
        unread,
        F.concat(
            F.lit(f"column '{c.name}': '"), source.cast("string"), F.lit(f"' is not {_KINDS[c.given_type]}")
        ),
    )


def schema_of(data: DataConfig) -> dict[str, str]:
    """column -> "type/role", as the model and the manifest record it."""
    return {c.name: f"{c.type}/{c.role}" for c in data.columns}


def with_types_of(cfg: DataConfig, schema: Mapping[str, str]) -> DataConfig:
    """`cfg` for reading rows for the model trained on `schema` (column -> "type/role", as the
    manifest and the model record it). A typed source's later reads (test rows, rows to score, a
    stream) then read each feature as the model was trained on it, and a value that does not cast
    is a reject with its reason; Spark's inference from those files alone would make a number
    column text over one bad value, and the whole file would fail the model's schema check. CSV
    configs type every column already. A column the model was not trained on, and that
    data.columns does not name, is not a feature (an upstream table that gained a column, a date
    that JSON carries as text)."""
    if not schema:
        return cfg
    kinds = {name: kind.partition("/") for name, kind in schema.items()}
    features = {
        name: (type_, role) for name, (type_, _, role) in kinds.items() if role in ("numeric", "categorical")
    }
    if cfg.typed:
        columns = list(cfg.columns)
        where = {c.name: i for i, c in enumerate(columns)}
        for name, (type_, role) in features.items():
            if name not in where:
                columns.append(ColumnSpec(name=name, type=type_, role=role))
            elif columns[where[name]].type is None:
                columns[where[name]] = columns[where[name]].model_copy(update={"type": type_})
        cfg = cfg.model_copy(update={"columns": columns})
    return cfg.with_model_features(features)


def resolve_columns(
    cfg: DataConfig, fields: list[T.StructField], location: str, say_roles: bool = True
) -> list[ColumnSpec]:
    """Every source column with a type (the source's, or the configured cast) and a role (the
    configured one, the label's, the weight's, or the type's)."""
    names = [f.name for f in fields]
    # rows to score need no label or weight: ingest requires them where it reads them; and rows
    # read for a trained model need no column it ignored
    optional = {cfg.label.column, cfg.weight_column}
    if cfg.model_features is not None:
        optional |= {c.name for c in cfg.columns if c.role == "ignore"}
    missing = [n for n in dict.fromkeys(c.name for c in cfg.columns) if n not in names and n not in optional]
    if missing:
        raise DataError(
            f"{location}: column(s) {missing} named in data are not in the source; its columns: "
            f"{names[:50]}{' ...' if len(names) > 50 else ''}. data.columns names them, or (reading rows "
            f"for a trained model) the model was trained on them"
        )
    configured = {c.name: c for c in cfg.columns}
    out, ignored, unused, index_columns = [], [], [], []
    for f in fields:
        source_type = _type_name(f.dataType)
        spec = configured.get(f.name)
        role = (
            spec.role
            if spec
            else "label"
            if f.name == cfg.label.column
            else "weight"
            if f.name == cfg.weight_column
            else "numeric"
            if source_type in ("int", "double")
            else "categorical"
            if source_type in ("string", "boolean")
            else "ignore"
        )
        kind = (spec.type if spec and spec.type else source_type) or "string"
        if spec is None and role in ("numeric", "categorical") and PANDAS_INDEX.fullmatch(f.name):
            role = "ignore"
            index_columns.append(f.name)
        if role == "ignore" and spec is None and source_type is None:
            ignored.append(f"{f.name} ({f.dataType.simpleString()})")
        if (
            role in ("numeric", "categorical")
            and spec is None
            and cfg.model_features is not None
            and f.name not in cfg.model_features
        ):
            role = "ignore"
            unused.append(f"{f.name} ({f.dataType.simpleString()})")
        if role in ("numeric", "weight") and kind not in ("int", "double"):
            raise DataError(
                f"{location}: column '{f.name}' is {f.dataType.simpleString()}, which cannot be role "
                f"'{role}'; give it role categorical or ignore in data.columns, or a numeric type"
            )
        out.append(ColumnSpec(name=f.name, type=kind, role=role))
    if ignored and say_roles:
        log.info("%s: columns of other types are not features: %s", location, ", ".join(ignored))
    if index_columns and say_roles:
        log.info(
            "%s: pandas' index columns are not features: %s (data.columns can give them a role)",
            location,
            ", ".join(index_columns),
        )
    if unused and say_roles:
        log.info("%s: columns the model was not trained on are not features: %s", location, ", ".join(unused))
    if not any(c.role in ("numeric", "categorical") for c in out):
        raise DataError(f"{location}: no feature columns (numbers, strings or booleans besides the label)")
    return out


def _type_name(dtype: T.DataType) -> str | None:
    if isinstance(dtype, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
        return "int"
    if isinstance(dtype, (T.FloatType, T.DoubleType, T.DecimalType)):
        return "double"
    if isinstance(dtype, (T.StringType, T.VarcharType, T.CharType)):
        return "string"
    if isinstance(dtype, T.BooleanType):
        return "boolean"
    return None


def _typed(c: ColumnSpec, source_type: str | None) -> str:
    """The column as SQL text: as the source has it, or cast to the configured type."""
    if c.role == "label" or c.type == source_type:
        return ident(c.name)
    return f"try_cast({ident(c.name)} AS {_CASTS[c.given_type].upper()}) AS {ident(c.name)}"


def _not_finite(names: list[str]) -> Column:
    """One check over every double feature, naming the columns that are NaN or infinite. SQL text:
    hundreds of columns would otherwise cost thousands of JVM calls (data/sql.py). Over several
    columns, not a CASE per column: the generated code Spark compiles for each plan that reads
    the rows grows with the expression, and for 784 columns the per-column form cost seconds of
    compiling and planning (docs/benchmarks.md, MNIST). Whether a row has such a value is plain
    arithmetic (`_any_not_finite`), which Spark compiles; only such a row evaluates the lambda
    that names its columns, which Spark interprets value by value."""
    bad = "isnan({0}) OR abs({0}) = double('inf')"
    if len(names) == 1:
        c = ident(names[0])
        prefix = literal(f"column '{names[0]}': '")
        return F.expr(
            f"CASE WHEN {bad.format(c)} THEN concat({prefix}, CAST({c} AS STRING), "
            f"{literal(chr(39) + ' is not finite (NaN/inf)')}) END"
        )
    values = "array(" + ", ".join(f"CAST({ident(n)} AS DOUBLE)" for n in names) + ")"
    labels = "array(" + ", ".join(literal(f"'{n}' (") for n in names) + ")"
    # concat_ws skips the nulls zip_with leaves for the finite values; no quote right after ': ',
    # where common_reasons would take a column's name for the row's own value and elide it
    which = (
        f"zip_with({labels}, {values}, "
        f"(n, v) -> CASE WHEN {bad.format('v')} THEN concat(n, CAST(v AS STRING), ')') END)"
    )
    return F.expr(
        f"CASE WHEN {_any_not_finite(names)} "
        f"THEN concat('not finite (NaN/inf) in ', concat_ws(', ', {which})) END"
    )


def _any_not_finite(names: list[str]) -> str:
    """SQL: true when any of the columns is NaN or infinite (null, not false, for a row with a
    missing value and no such one: a CASE takes neither). Spark's `arrays_overlap` counts NaN as
    equal to NaN, and is compiled; the row's values are one array node with a child per column.
    The sum of each column times zero that this replaced (NaN exactly then too) was 5,500 nodes
    for MNIST's 784 columns, and analysing it took a fresh JVM 5-6 s (docs/benchmarks.md, MNIST)."""
    values = "array(" + ", ".join(f"CAST({ident(n)} AS DOUBLE)" for n in names) + ")"
    return f"arrays_overlap({values}, array(double('NaN'), double('inf'), double('-inf')))"


def _explain_typed(rejects: DataFrame, location: str) -> None:
    raise DataError(
        f"{location}: every row was rejected; {describe_reasons(common_reasons(rejects))}. "
        f"Rejected rows and reasons: see the rejects output."
    )


@dataclass(frozen=True)
class RejectReason:
    """One kind of reject reason (its values elided), how many rows have it, and one in full."""

    kind: str
    rows: int
    example: str


_QUOTED_VALUE = r"(: |value )'[^']*'"  # where a reason quotes the row's own value


def common_reasons(rejects: DataFrame, limit: int = 3) -> list[RejectReason]:
    """The most frequent kinds of reason among `rejects`: each row's reason with its quoted values
    elided, so 10,000 rows rejected for one column's type are one kind, not 10,000."""
    kind = F.regexp_replace(F.col("reason"), _QUOTED_VALUE, "$1'…'")
    top = (
        rejects.groupBy(kind.alias("kind"))
        .agg(F.count(F.lit(1)).alias("rows"), F.min("reason").alias("example"))
        .orderBy(F.desc("rows"), "kind")
        .limit(limit)
        .collect()
    )
    return [RejectReason(r["kind"], r["rows"], r["example"]) for r in top]


def describe_reasons(reasons: list[RejectReason]) -> str:
    """'most often: <reason> (N rows, e.g. <value>)[; then ...]'."""
    shown = []
    for r in reasons:
        values = [m.group(0).removeprefix(m.group(1)) for m in re.finditer(_QUOTED_VALUE, r.example)]
        example = f", e.g. {', '.join(values)}" if values else ""
        shown.append(f"{r.kind} ({r.rows:,} row{'s' if r.rows != 1 else ''}{example})")
    return "most often: " + "; then ".join(shown)


# ---- fingerprints --------------------------------------------------------------------------------


def local_files(path: str) -> list[Path]:
    """The local files behind a path (file or directory); empty for remote URIs."""
    local = None if storage.is_remote(path) else storage.local_path(path)
    if local is None:
        return []
    p = local
    if p.is_file():
        return [p]
    if p.is_dir():
        return sorted(f for f in p.rglob("*") if f.is_file() and not f.name.startswith((".", "_")))
    return []


def fingerprint(paths: list[str]) -> str:
    """sha256 over the input files, for the manifest: names and bytes of local files; names,
    sizes and modification times of remote ones (reading a bucket through to hash it would cost
    more than the job); a table's name."""
    digest = hashlib.sha256()
    for path in paths:
        if not local_files(path) and storage.is_remote(path):
            for entry in _remote_entries(path):
                digest.update(f"{entry.name}:{entry.size}:{entry.mtime_ns}".encode())
            continue
        if not local_files(path):
            digest.update(path.encode())
        for f in local_files(path):
            digest.update(f.name.encode())
            digest.update(str(os.path.getsize(f)).encode())
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


def _remote_entries(path: str) -> list[storage.Entry]:
    if storage.is_dir(path):
        return [e for e in storage.list_dir(path) if not e.is_dir]
    name = storage.name_of(path)
    return [e for e in storage.list_dir(path.rsplit("/", 1)[0]) if e.name == name]
