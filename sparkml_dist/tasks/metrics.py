"""The tasks' metrics over counts and sums, in numpy alone: what the ranks compute each epoch from
allreduced counts (`Task.extra_from_bins`, no Spark on a rank) and what the Spark reports
(`sparkml_dist.tasks.reports`) compute from their aggregations."""

from __future__ import annotations

import math

import numpy as np


def roc_from_bins(pos: np.ndarray, neg: np.ndarray) -> tuple[list[float], list[float], float]:
    """ROC from (weighted) positive and negative counts per probability bin, bins in increasing
    probability; AUC by trapezoids (pairs within a bin count as ties)."""
    # thresholds from high to low probability
    tpr = np.concatenate([[0.0], np.cumsum(pos[::-1]) / max(pos.sum(), 1e-12)])
    fpr = np.concatenate([[0.0], np.cumsum(neg[::-1]) / max(neg.sum(), 1e-12)])
    auc = float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))  # the trapezoid rule
    return fpr.tolist(), tpr.tolist(), auc


def macro_f1(per_class: list[dict]) -> float:
    """The mean F1 over the classes that are in the rows or in the predictions (`class_table`)."""
    seen = [r["f1"] for r in per_class if r["support"] > 0 or r["predicted"] > 0]
    return float(np.mean(seen)) if seen else 0.0


def class_table(matrix: np.ndarray, classes: tuple[str, ...]) -> list[dict]:
    """Per class: precision, recall, F1, support (true rows) and predicted rows, from the matrix."""
    out = []
    for i, name in enumerate(classes):
        tp = matrix[i, i]
        predicted, support = matrix[:, i].sum(), matrix[i, :].sum()
        precision = tp / predicted if predicted else 0.0
        recall = tp / support if support else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        out.append(
            {
                "class": name,
                "precision": float(precision),
                "recall": float(recall),
                "f1": float(f1),
                "support": float(support),
                "predicted": float(predicted),
            }
        )
    return out


def metrics_from_sums(
    total: float, sse: float, sae: float, sy: float, syy: float, undefined: float
) -> dict[str, float]:
    """rmse, mae and r2 from weighted sums: the weight, the squared and absolute errors, the label
    and its square (the test report's Spark aggregation, or the ranks' allreduced epoch sums).
    `undefined`: the value of a metric the rows cannot give (no rows; r2 of a constant label)."""
    ss_tot = syy - sy * sy / total if total else 0.0
    return {
        "rmse": math.sqrt(sse / total) if total else undefined,
        "mae": sae / total if total else undefined,
        "r2": 1.0 - sse / ss_tot if ss_tot > 0 else undefined,
    }
