"""A wide run of numeric features (MNIST's 784 pixels) carried as one array<double> column.

Spark processes rows value by value, and each plan over hundreds of columns is generated code
that a fresh JVM compiles and warms up again. Ingest caches the checked rows of a source with at
least `WIDE_NUMBERS` numeric features as one array column (`PACKED`), whose metadata lists the
columns it holds, in order. The accepted rows still have every column by its name (read out of
the array where a plan needs it), and the stages that can work on the array do: the imputer's
and scaler's statistics are one `Summarizer` pass over it (`data/imputer.py`), and the stored
features are one expression over it (`data/features.py`). What it saved on MNIST:
docs/benchmarks.md, "Wide rows".
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sparkml_dist.data.sql import ident

__all__ = ["PACKED", "packed_columns", "packed_values", "unpacked"]

PACKED = "_wide_values"
_HOLDS = "sparkml_dist.packed_columns"  # the packed column's metadata key: the columns, in order


def packed_values(numeric: list[str]) -> Column:
    """The `numeric` columns of a source's rows as doubles in one array column, which says
    which columns it holds."""
    values = F.expr("array(" + ", ".join(f"CAST({ident(n)} AS DOUBLE)" for n in numeric) + ")")
    return values.alias(PACKED, metadata={_HOLDS: list(numeric)})


def unpacked(names: list[str], numeric: list[str]) -> list[str]:
    """SQL over rows with `packed_values`: the columns `names`, the `numeric` ones read out of
    the array, then the array itself (for the stages that work on it)."""
    at = {n: i for i, n in enumerate(numeric)}
    return [*(f"{PACKED}[{at[n]}] AS {ident(n)}" if n in at else ident(n) for n in names), PACKED]


def packed_columns(rows: DataFrame) -> list[str] | None:
    """The columns `rows`' packed array holds, in order; None without one."""
    if PACKED not in rows.columns:
        return None
    holds = rows.schema[PACKED].metadata.get(_HOLDS)
    return list(holds) if holds else None
