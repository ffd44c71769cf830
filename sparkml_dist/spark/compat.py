"""What differs between the pyspark versions the package supports (3.5 to 4.3), in one place.

Databricks LTS runtimes bring pyspark 3.5, newer ones 4.x, and the package is to run on the
runtime's own pyspark, so the few calls that 4.0 added are made here, with the 3.5 equivalent
beside them (tests/test_install.py runs the pipeline on pyspark 3.5.9). Each function keeps
the newer version's semantics: a 3.5 path that behaved differently would train on different rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F


def try_cast(column: Column, type_name: str) -> Column:
    """`column` cast to `type_name`, null where the value does not convert (ANSI rules: '1.5' is
    not an int). pyspark 4 has `Column.try_cast`; 3.5 has only the SQL function (since 3.2), so
    the column's own SQL text goes through it (classic sessions: a 3.5 Connect column has no
    JVM expression to read)."""
    column_try_cast: Callable[[Column, str], Column] | None = getattr(Column, "try_cast", None)
    if column_try_cast is not None:
        return column_try_cast(column, type_name)
    java_column: Any = column._jc  # py4j: untyped
    return F.expr(f"try_cast({java_column.expr().sql()} AS {type_name.upper()})")
