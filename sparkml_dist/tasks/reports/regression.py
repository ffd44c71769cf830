"""Regression metrics as Spark aggregations (rmse, mae, r2, optionally weighted), and a bounded
sample of (actual, predicted) pairs for the plots."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkml_dist.spark.rows import only_row
from sparkml_dist.tasks.base import PREDICTION, TaskReport
from sparkml_dist.tasks.metrics import metrics_from_sums
from sparkml_dist.tasks.reports.common import plot_module, weight_of

PLOT_POINTS = 5000


def regression_report(scored: DataFrame, label: str = "label", weight: str | None = None) -> TaskReport:
    y, p, w = F.col(label).cast("double"), F.col(PREDICTION).cast("double"), weight_of(weight)
    row = only_row(
        scored.agg(
            F.count(F.lit(1)).alias("n"),
            F.sum(w).alias("w"),
            F.sum(w * (y - p) * (y - p)).alias("sse"),
            F.sum(w * F.abs(y - p)).alias("sae"),
            F.sum(w * y).alias("sy"),
            F.sum(w * y * y).alias("syy"),
        )
    )
    n = int(row["n"] or 0)
    total, sse, sae, sy, syy = (float(row[k] or 0.0) for k in ("w", "sse", "sae", "sy", "syy"))
    metrics = {"rows": float(n), **metrics_from_sums(total, sse, sae, sy, syy, undefined=0.0)}
    sample = scored.select(y.alias("y"), p.alias("p"))
    if n > PLOT_POINTS:
        sample = sample.sample(fraction=min(1.0, 1.5 * PLOT_POINTS / n), seed=0)
    pairs = [(r["y"], r["p"]) for r in sample.limit(PLOT_POINTS).collect()]
    actual, predicted = [a for a, _ in pairs], [b for _, b in pairs]
    return TaskReport(
        metrics,
        plots=[
            (
                "predicted_vs_actual.png",
                lambda path: plot_module().predicted_vs_actual(actual, predicted, metrics["r2"], path),
            ),
            ("residuals.png", lambda path: plot_module().residuals(actual, predicted, path)),
        ],
    )
