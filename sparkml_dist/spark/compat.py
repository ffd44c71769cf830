"""What differs between the pyspark versions the package supports (3.5 to 4.3), in one place.

Databricks LTS runtimes bring pyspark 3.5, newer ones 4.x, and the package is to run on the
runtime's own pyspark, so the few calls that 4.0 added are made here, with the 3.5 equivalent
beside them (tests/test_install.py runs the pipeline on pyspark 3.5.9). Each function keeps
the newer version's semantics: a 3.5 path that behaved differently would train on different rows.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F


def try_cast(column: Column, type_name: str) -> Column:
    """`column` cast to `type_name`, null where the value does not convert (ANSI rules: '1.5' is
    not an int). pyspark 4 has `Column.try_cast`; 3.5 has only the SQL function (since 3.2), so
    the column's own SQL text goes through it (classic sessions: a 3.5 Connect column has no
    JVM expression to read)."""
    if hasattr(Column, "try_cast"):
        return column.try_cast(type_name)
    return F.expr(f"try_cast({column._jc.expr().sql()} AS {type_name.upper()})")
