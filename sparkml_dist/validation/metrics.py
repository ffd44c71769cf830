"""Binary-classification metrics computed by Spark aggregations over scored rows
(label, probability, prediction): nothing is collected but a fixed-size histogram."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkml_dist.inference.udf import PREDICTION, PROBABILITY

_EPS = 1e-7


@dataclass
class BinaryReport:
    metrics: dict[str, float]
    confusion: list[list[int]]  # [[tn, fp], [fn, tp]]
    roc: tuple[list[float], list[float]]  # (fpr, tpr)


def binary_report(scored: DataFrame, label: str = "label", roc_bins: int = 2000) -> BinaryReport:
    y, p, yhat = F.col(label).cast("double"), F.col(PROBABILITY), F.col(PREDICTION).cast("double")
    clipped = F.least(F.greatest(p, F.lit(_EPS)), F.lit(1 - _EPS))
    row = scored.agg(
        F.count(F.lit(1)).alias("n"),
        F.sum(y * yhat).alias("tp"),
        F.sum((1 - y) * yhat).alias("fp"),
        F.sum(y * (1 - yhat)).alias("fn"),
        F.sum((1 - y) * (1 - yhat)).alias("tn"),
        F.avg(-(y * F.log(clipped) + (1 - y) * F.log(1 - clipped))).alias("log_loss"),
    ).first()
    n, tp, fp, fn, tn = (int(row[k] or 0) for k in ("n", "tp", "fp", "fn", "tn"))
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    fpr, tpr, auc = roc_curve(scored, label, roc_bins)
    metrics = {
        "rows": float(n),
        "accuracy": (tp + tn) / n if n else 0.0,
        "precision": precision,
        "recall": recall,
        "f1": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
        "log_loss": float(row["log_loss"] or 0.0),
        "roc_auc": auc,
    }
    return BinaryReport(metrics, [[tn, fp], [fn, tp]], (fpr, tpr))


def roc_curve(scored: DataFrame, label: str, bins: int) -> tuple[list[float], list[float], float]:
    """ROC from a probability histogram (positives/negatives per bin), AUC by trapezoids."""
    bucket = F.least(F.floor(F.col(PROBABILITY) * bins), F.lit(bins - 1)).cast("int")
    rows = scored.groupBy(bucket.alias("b")).agg(
        F.sum(F.col(label).cast("double")).alias("pos"), F.count(F.lit(1)).alias("n")
    ).collect()
    pos = np.zeros(bins)
    neg = np.zeros(bins)
    for r in rows:
        pos[r["b"]] = r["pos"]
        neg[r["b"]] = r["n"] - r["pos"]
    # thresholds from high to low probability
    tpr = np.concatenate([[0.0], np.cumsum(pos[::-1]) / max(pos.sum(), 1)])
    fpr = np.concatenate([[0.0], np.cumsum(neg[::-1]) / max(neg.sum(), 1)])
    auc = float(np.trapezoid(tpr, fpr)) if hasattr(np, "trapezoid") else float(np.trapz(tpr, fpr))
    return fpr.tolist(), tpr.tolist(), auc
