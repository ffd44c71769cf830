"""Binary-classification metrics as Spark aggregations over scored rows (encoded label,
probability, prediction; optionally a weight per row): nothing is collected but a fixed-size
histogram for the ROC curve."""

from __future__ import annotations

import numpy as np
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkml_dist.spark.rows import only_row
from sparkml_dist.tasks.base import PREDICTION, PROBABILITY, Target, TaskReport
from sparkml_dist.tasks.metrics import roc_from_bins
from sparkml_dist.tasks.reports.common import plot_module, weight_of

_EPS = 1e-7


def binary_report(
    scored: DataFrame, target: Target, label: str = "label", weight: str | None = None, roc_bins: int = 2000
) -> TaskReport:
    y, p, yhat = F.col(label).cast("double"), F.col(PROBABILITY), F.col(PREDICTION).cast("double")
    w = weight_of(weight)
    clipped = F.least(F.greatest(p, F.lit(_EPS)), F.lit(1 - _EPS))
    row = only_row(
        scored.agg(
            F.count(F.lit(1)).alias("n"),
            F.sum(w).alias("w"),
            F.sum(w * y * yhat).alias("tp"),
            F.sum(w * (1 - y) * yhat).alias("fp"),
            F.sum(w * y * (1 - yhat)).alias("fn"),
            F.sum(w * (1 - y) * (1 - yhat)).alias("tn"),
            F.sum(-w * (y * F.log(clipped) + (1 - y) * F.log(1 - clipped))).alias("log_loss"),
        )
    )
    n, total = int(row["n"] or 0), float(row["w"] or 0.0)
    tp, fp, fn, tn = (float(row[k] or 0.0) for k in ("tp", "fp", "fn", "tn"))
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    fpr, tpr, auc = roc_curve(scored, label, w, roc_bins)
    metrics = {
        "rows": float(n),
        "accuracy": (tp + tn) / total if total else 0.0,
        "precision": precision,
        "recall": recall,
        "f1": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
        "log_loss": float(row["log_loss"] or 0.0) / total if total else 0.0,
        "roc_auc": auc,
    }
    confusion = [[_whole(tn), _whole(fp)], [_whole(fn), _whole(tp)]]
    names = target.classes or ("negative", "positive")
    return TaskReport(
        metrics,
        plots=[
            ("roc.png", lambda path: plot_module().roc(fpr, tpr, auc, path)),
            ("confusion_matrix.png", lambda path: plot_module().confusion(confusion, tuple(names), path)),
        ],
    )


def roc_curve(scored: DataFrame, label: str, w, bins: int) -> tuple[list[float], list[float], float]:
    """ROC from a (weighted) probability histogram, positives/negatives per bin; AUC by trapezoids."""
    bucket = F.least(F.floor(F.col(PROBABILITY) * bins), F.lit(bins - 1)).cast("int")
    rows = (
        scored.groupBy(bucket.alias("b"))
        .agg(F.sum(w * F.col(label).cast("double")).alias("pos"), F.sum(w).alias("n"))
        .collect()
    )
    pos = np.zeros(bins)
    neg = np.zeros(bins)
    for r in rows:
        pos[r["b"]] = r["pos"]
        neg[r["b"]] = r["n"] - r["pos"]
    return roc_from_bins(pos, neg)


def best_f1_threshold(
    scored: DataFrame, label: str, weight: str | None, bins: int = 1000
) -> tuple[float, float]:
    """The probability threshold with the highest F1 on `scored` (a histogram of `bins` cut points,
    aggregated in Spark), and that F1. Where a run of cut points ties for the best F1 (no rows
    between them: classes that the validation rows separate), the middle one of the run: the
    first would sit on the highest negative's probability, with no margin for unseen rows."""
    w = weight_of(weight)
    bucket = F.least(F.floor(F.col(PROBABILITY) * bins), F.lit(bins - 1)).cast("int")
    rows = (
        scored.groupBy(bucket.alias("b"))
        .agg(F.sum(w * F.col(label).cast("double")).alias("pos"), F.sum(w).alias("n"))
        .collect()
    )
    pos, total = np.zeros(bins), np.zeros(bins)
    for r in rows:
        pos[r["b"]], total[r["b"]] = r["pos"], r["n"]
    # predicting positive from bin b upwards: tp = positives at or above b, fp = the rest there
    tp = np.cumsum(pos[::-1])[::-1]
    predicted = np.cumsum(total[::-1])[::-1]
    fn = pos.sum() - tp
    f1 = np.where(predicted + fn > 0, 2 * tp / np.maximum(predicted + pos.sum(), 1e-12), 0.0)
    first = int(np.argmax(f1))
    last = first
    while last + 1 < bins and f1[last + 1] == f1[first]:
        last += 1
    middle = (first + last) // 2
    return middle / bins, float(f1[middle])


def _whole(x: float) -> float:
    return int(round(x)) if abs(x - round(x)) < 1e-9 else round(x, 3)  # noqa: RUF046 -- numpy scalars
