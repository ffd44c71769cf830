"""Spark SQL text for wide inputs. Every `pyspark.sql.functions` call is a round trip to the JVM
(about 0.1 ms); an input with hundreds of columns needs thousands of them, so per-column
expressions are written as SQL and parsed once (`F.expr`)."""

from __future__ import annotations


def ident(name: str) -> str:
    """A column name as a quoted SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


def literal(text: str) -> str:
    """A string as a SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def double(value: float) -> str:
    """A finite float as a SQL DOUBLE literal that round-trips exactly (`0.1` alone is a DECIMAL)."""
    return f"CAST({float(value)!r} AS DOUBLE)" if "e" in repr(float(value)) else f"{float(value)!r}D"


def raw_json(columns: str) -> str:
    """A row as a reject's raw text: JSON of `columns` (SQL: `*` or a list), nulls kept, so a
    missing value shows as `"price":null` instead of vanishing."""
    return f"to_json(struct({columns}), map('ignoreNullFields', 'false'))"
