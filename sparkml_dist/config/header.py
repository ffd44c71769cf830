"""A CSV with a header needs no hand-written schema (`data.header: true` without `data.columns`,
or with only the entries to override).

The columns come from the first file's header, in file order; each column's type from pandas'
inference over its first `INFER_ROWS` rows (`int` for whole numbers that fit 32 bits,
`double` for other numbers, `boolean`, else `string`); roles from the types as for a typed
source (numbers numeric, text and booleans categorical), with dates, timestamps, empty columns and
a column that numbers the rows (0, 1, 2, ... in file order: pandas' index) ignored, the
label `label` and `data.weight_column` `weight`. A `data.columns` entry overrides its column's
type or role by name. A 0/1, true/false or yes/no label with no task, classes or positive/negative
is binary with 1/true/yes positive. Repeated header names keep the first and add `_<position>` to the
others (0-based position in the header), and an empty one is `_c<position>`, as Spark names them.

This runs before validation, so every stage of a job sees the same, complete config; `sparkml-dist
init` prints it for the user to pin.
"""

from __future__ import annotations

import io
import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

from sparkml_dist.data.formats import SOURCE_FORMATS, format_of
from sparkml_dist.errors import ConfigError

INFER_ROWS = 200_000
_INT32 = (-(2**31), 2**31 - 1)
_BINARY_LABELS = ({"0", "1"}, {"true", "false"}, {"no", "yes"})  # any case
_POSITIVE = ("1", "true", "yes")


@dataclass(frozen=True)
class InferredColumn:
    name: str
    type: str
    role: str
    distinct: int
    missing: int
    note: str = ""  # why a person may want another role: identifier-like, constant, a date


@dataclass(frozen=True)
class InferredTable:
    source: str  # the file the header and types were read from
    rows: int  # rows the types were inferred over
    columns: tuple[InferredColumn, ...]
    label_values: tuple[str, ...]  # the label's distinct values when there are at most 20


def header_names(fields: list[str]) -> list[str]:
    """Column names from a header line's fields: stripped, an empty one `_c<i>`, a repeated one
    `<name>_<i>` (the first keeps its name)."""
    names: list[str] = []
    for i, field in enumerate(f.strip() for f in fields):
        name = field or f"_c{i}"
        names.append(f"{name}_{i}" if name in names else name)
    return names


def header_fields(names: list[str]) -> list[str]:
    """The header line's fields that `header_names` turned into `names` (its inverse)."""
    fields = []
    for i, name in enumerate(names):
        base = name.removesuffix(f"_{i}")
        fields.append(base if base != name and base in names[:i] else "" if name == f"_c{i}" else name)
    return fields


def needs_inference(data: object) -> TypeGuard[dict]:
    """A CSV with a header whose `data.columns` do not all carry a type and a role (`data` is the
    config's raw data section, which may be missing or not a mapping)."""
    if (
        not isinstance(data, dict)
        or data.get("header") is not True
        or not isinstance(data.get("train_path"), str)
    ):
        return False
    fmt = format_of(data["train_path"], data.get("format"))
    if fmt not in SOURCE_FORMATS or SOURCE_FORMATS.get(fmt).typed:  # a typed source names its own columns
        return False
    given = data.get("columns") or []
    return not given or not all(isinstance(c, dict) and c.get("type") and c.get("role") for c in given)


def complete_columns(raw: dict) -> dict:
    """`raw` (a config before validation) with data.columns read from the CSV's header where it
    needs them; unchanged otherwise."""
    data = raw.get("data")
    if not needs_inference(data):
        return raw
    table = infer_table(data)
    columns = _merged(table, data.get("columns") or [], data)
    return {**raw, "data": {**data, "columns": columns, "label": _label_with_default_task(data, table)}}


def infer_table(data: dict) -> InferredTable:
    import pandas as pd

    source = _first_file(data["train_path"])
    delimiter = data.get("delimiter", ",")
    nulls = data.get("null_values", ["?"])
    with _open(source) as fh, warnings.catch_warnings():
        names = header_names(fh.readline().rstrip("\r\n").split(delimiter))
        warnings.simplefilter("ignore")  # pandas' parser warnings; the types are what is checked
        frame = pd.read_csv(
            fh,
            sep=delimiter,
            header=None,
            names=names,
            nrows=INFER_ROWS,
            na_values=nulls,
            skipinitialspace=True,
            low_memory=False,
            dtype_backend="numpy_nullable",
        )
    label = (data.get("label") or {}).get("column")
    columns = tuple(
        _column(frame[name], name, label, data.get("weight_column"), len(frame)) for name in names
    )
    values = (
        tuple(
            sorted(str(v).lower() if isinstance(v, bool) else str(v) for v in frame[label].dropna().unique())
        )
        if label in frame.columns and frame[label].nunique() <= 20
        else ()
    )
    return InferredTable(source, len(frame), columns, values)


def _column(values, name: str, label: str | None, weight: str | None, rows: int) -> InferredColumn:
    import pandas as pd

    present = values.dropna()
    kind, role, note = "string", "categorical", ""
    if pd.api.types.is_bool_dtype(values):
        kind = "boolean"
    elif pd.api.types.is_integer_dtype(values) and (
        present.empty or _INT32[0] <= present.min() <= present.max() <= _INT32[1]
    ):
        kind, role = "int", "numeric"
    elif pd.api.types.is_numeric_dtype(values):
        kind, role = "double", "numeric"
    elif len(present) and _all_dates(present):
        role, note = "ignore", "a date or time: ignored (derive numbers from it to use it)"
    distinct = int(present.nunique())
    if name == label:
        role = "label"
    elif name == weight:
        role = "weight"
    elif distinct == 0:
        role, note = "ignore", "empty: every value is missing"
    elif distinct == 1:
        note = note or "constant: carries nothing"
    elif kind == "int" and rows > 50 and _row_number(present, len(values)):
        role = "ignore"
        note = f"a row number ({int(present.iloc[0])}, {int(present.iloc[1])}, ... in file order): ignored; role id keeps it with the predictions"
    elif distinct >= 0.9 * len(present) and rows > 50 and kind in ("int", "string"):
        note = (
            note
            or f"identifier-like: {distinct:,} values in {len(present):,} rows; consider role ignore (or id)"
        )
    return InferredColumn(name, kind, role, distinct, int(values.isna().sum()), note)


def _row_number(present, rows: int) -> bool:
    """Whether the column counts the rows in file order from 0 or 1 (what pandas' to_csv writes
    first, under an empty name, unless told index=False): it names the row, it is no feature."""
    return (
        len(present) == rows and int(present.iloc[0]) in (0, 1) and bool((present.diff().iloc[1:] == 1).all())
    )


def _all_dates(present) -> bool:
    import pandas as pd

    sample = present.astype(str).head(1000)
    if not sample.str.match(r"^\d{4}-\d{2}-\d{2}").all():
        return False
    return bool(pd.to_datetime(sample, errors="coerce", format="ISO8601").notna().all())


def _merged(table: InferredTable, given: list, data: dict) -> list[dict]:
    by_name = {c.name: c for c in table.columns}
    for entry in given:
        name = entry.get("name") if isinstance(entry, dict) else None
        if name not in by_name:
            raise ConfigError(
                f"data.columns: {name!r} is not a column of {table.source}'s header {list(by_name)}"
            )
    overrides = {entry["name"]: entry for entry in given}
    label = (data.get("label") or {}).get("column")
    if label not in by_name:
        raise ConfigError(
            f"data.label.column {label!r} is not a column of {table.source}'s header {list(by_name)}"
        )
    return [
        {"name": c.name, "type": c.type, "role": c.role, **overrides.get(c.name, {})} for c in table.columns
    ]


def _label_with_default_task(data: dict, table: InferredTable) -> dict:
    label = dict(data.get("label") or {})
    if any(label.get(k) is not None for k in ("task", "positive", "negative", "classes")):
        return label
    values = {v.lower() for v in table.label_values}
    for pair in _BINARY_LABELS:
        if values == pair:
            negative, positive = sorted(table.label_values, key=lambda v: v.lower() in _POSITIVE)
            return {**label, "positive": positive, "negative": negative}
    return label


def _first_file(location: str) -> str:
    """The file whose header names the columns: the file itself, or a directory's or glob's first."""
    import glob

    # pyarrow: not while a config is read
    from sparkml_dist.storage import is_remote, local_path
    from sparkml_dist.storage.packages import resolve_path

    path = resolve_path(location)
    local = None if is_remote(path) else local_path(path)
    if local is None:
        return path
    candidates = (
        [local]
        if local.is_file()
        else sorted(
            p
            for p in (local.rglob("*") if local.is_dir() else map(Path, glob.glob(str(local))))
            if p.is_file() and not p.name.startswith((".", "_"))
        )
    )
    if not candidates:
        raise ConfigError(
            f"data.train_path {location}: no file to read the header from; list data.columns, or "
            f"point train_path at the CSV"
        )
    return str(candidates[0])


def _open(source: str):
    from sparkml_dist.storage import locate  # pyarrow: not while a config is read

    try:
        loc = locate(source)
        if loc.is_local:
            return open(loc.path, encoding="utf-8", errors="replace", newline="")
        return io.TextIOWrapper(loc.remote.open_input_stream(loc.path), encoding="utf-8", errors="replace")
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"data.train_path: cannot read the header of {source} ({exc}); list data.columns instead"
        ) from None


def init_config(data: dict) -> str:
    """A complete, commented YAML config for a headed CSV (`sparkml-dist init`): every column with
    its inferred type and role, the label's task, a note on columns a person should look at."""

    data = {"header": True, **data}
    table = infer_table(data)
    columns = _merged(table, [], data)
    label = _label_with_default_task(data, table)
    leaks = _label_leaks(data, table) if table.label_values else {}
    notes = {
        c.name: "; ".join(n for n in (c.note, leaks.get(c.name, ""), _renamed(c.name, i, columns)) if n)
        for i, c in enumerate(table.columns)
    }
    entries = [
        "{" + ", ".join(f"{k}: {_scalar(c[k])}" for k in ("name", "type", "role")) + "}" for c in columns
    ]
    width = max(map(len, entries))
    lines = [
        f"# written by sparkml-dist init from {table.source}: types inferred over {table.rows:,} rows.",
        "# Check the roles (a column that gives the label away must be ignored), then pin this file.",
        "data:",
        *(
            f"  {key}: {json.dumps(data[key])}"
            for key in ("train_path", "test_path", "delimiter", "null_values")
            if key in data
        ),
        "  header: true",
        "  columns:",
    ]
    for c, entry in zip(columns, entries):
        note = notes[c["name"]]
        lines.append(f"    - {entry:<{width}}  # {note}" if note else f"    - {entry}")
    lines.append("  label: {" + ", ".join(f"{k}: {json.dumps(v)}" for k, v in label.items()) + "}")
    if table.label_values:
        lines.append(f"  # label values: {', '.join(table.label_values)}")
    return "\n".join(lines)


def _scalar(value: str) -> str:
    return value if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", value) else json.dumps(value)


def _renamed(name: str, position: int, columns: list[dict]) -> str:
    base = header_fields([c["name"] for c in columns])[position]
    return f"the header repeats '{base}': this is its column {position}" if base != name and base else ""


def _label_leaks(data: dict, table: InferredTable, threshold: float = 0.95) -> dict[str, str]:
    """Columns whose value alone gives the label for at least `threshold` of the rows, far above
    always guessing the commonest class: usually an outcome recorded after the fact (a leak)."""
    import pandas as pd

    label = data["label"]["column"]
    with _open(table.source) as fh, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frame = pd.read_csv(
            fh,
            sep=data.get("delimiter", ","),
            header=0,
            names=[c.name for c in table.columns],
            nrows=INFER_ROWS,
            na_values=data.get("null_values", ["?"]),
            skipinitialspace=True,
            low_memory=False,
            dtype=str,
        )
    frame = frame[frame[label].notna()]
    base = frame[label].value_counts(normalize=True).max() if len(frame) else 1.0
    leaks = {}
    for column in frame.columns.drop(label):
        groups = frame.groupby(frame[column].fillna("<missing>"))[label]
        if groups.ngroups > 50:
            continue
        alone = groups.agg(lambda s: s.value_counts().max()).sum() / len(frame)
        if alone >= threshold and alone - base >= (1 - base) / 2:
            leaks[column] = (
                f"gives the label for {alone:.0%} of rows on its own: a leak? consider role ignore"
            )
    return leaks
