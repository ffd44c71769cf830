"""What every task's report shares: the row weight as a column, and the plots module, imported
when a plot is drawn (matplotlib stays out of scoring and training processes)."""

from __future__ import annotations

from types import ModuleType

from pyspark.sql import Column
from pyspark.sql import functions as F


def weight_of(weight: str | None) -> Column:
    """The weight column as a double, or 1 for every row."""
    return F.col(weight).cast("double") if weight else F.lit(1.0)


def plot_module() -> ModuleType:
    from sparkml_dist.tracking import plots as module  # matplotlib: only when a report is plotted

    return module
