"""Multiclass metrics as Spark aggregations: a (weighted) confusion matrix (classes x classes
cells, the only thing collected) gives accuracy, per-class precision/recall/F1 and their macro
and support-weighted means; log loss is averaged over rows from the true class's probability."""

from __future__ import annotations

import numpy as np
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkml_dist.spark.rows import only_row
from sparkml_dist.tasks.base import PREDICTION, PROBABILITIES, Target, TaskReport
from sparkml_dist.tasks.metrics import class_table, macro_f1
from sparkml_dist.tasks.reports.common import plot_module, weight_of

_EPS = 1e-7
PLOTTED_CLASSES = 40  # a confusion matrix with more classes is a table, not a picture


def multiclass_report(
    scored: DataFrame, target: Target, label: str = "label", weight: str | None = None
) -> TaskReport:
    k = len(target.classes)
    w = weight_of(weight)
    y = F.col(label).cast("int")
    cells = (
        scored.groupBy(y.alias("y"), F.col(PREDICTION).alias("p"))
        .agg(F.sum(w).alias("w"), F.count(F.lit(1)).alias("n"))
        .collect()
    )
    matrix = np.zeros((k, k))
    rows = 0
    for c in cells:
        matrix[c["y"], c["p"]] += c["w"]
        rows += c["n"]
    true_p = F.greatest(F.try_element_at(F.col(PROBABILITIES), y + 1), F.lit(_EPS))
    log_loss = only_row(scored.agg((F.sum(-w * F.log(true_p)) / F.sum(w)).alias("ll")))["ll"]
    per_class = class_table(matrix, target.classes)
    total = matrix.sum()
    metrics = {
        "rows": float(rows),
        "accuracy": float(np.trace(matrix) / total) if total else 0.0,
        "macro_f1": macro_f1(per_class),
        "weighted_f1": float(sum(r["f1"] * r["support"] for r in per_class) / total) if total else 0.0,
        "log_loss": float(log_loss or 0.0),
    }
    plots = []
    if k <= PLOTTED_CLASSES:
        plots.append(
            (
                "confusion_matrix.png",
                lambda path: plot_module().confusion(matrix.tolist(), target.classes, path),
            )
        )
    return TaskReport(metrics, plots=plots, tables={"per_class.json": per_class})
