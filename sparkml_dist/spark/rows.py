"""Reading the one row a global aggregate returns."""

from __future__ import annotations

from pyspark.sql import DataFrame, Row


def only_row(frame: DataFrame, what: str = "a global aggregate") -> Row:
    """The first row of `frame`, which the caller knows has one: a global aggregation (`agg`
    without `groupBy`) and a fitted model's frame have exactly one, even over no input rows."""
    row = frame.first()
    if row is None:
        raise RuntimeError(f"{what} returned no row")  # the caller's premise broken: a bug, not bad input
    return row
