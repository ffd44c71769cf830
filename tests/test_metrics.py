"""Spark-aggregated metrics agree with scikit-learn on the same predictions."""

import numpy as np
import pytest
from sklearn import metrics as skm

from sparkml_dist.validation.metrics import binary_report

pytestmark = pytest.mark.spark


def test_binary_report_matches_sklearn(spark):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 5000)
    p = np.clip(0.35 * y + rng.random(5000) * 0.65, 0, 1)
    rows = [(int(a), float(b), int(b >= 0.5)) for a, b in zip(y, p)]
    df = spark.createDataFrame(rows, "label int, probability double, prediction int")
    report = binary_report(df, roc_bins=5000)
    pred = (p >= 0.5).astype(int)
    assert report.metrics["accuracy"] == pytest.approx(skm.accuracy_score(y, pred))
    assert report.metrics["precision"] == pytest.approx(skm.precision_score(y, pred))
    assert report.metrics["recall"] == pytest.approx(skm.recall_score(y, pred))
    assert report.metrics["f1"] == pytest.approx(skm.f1_score(y, pred))
    assert report.metrics["log_loss"] == pytest.approx(skm.log_loss(y, p), rel=1e-4)
    assert report.metrics["roc_auc"] == pytest.approx(skm.roc_auc_score(y, p), abs=2e-3)
    assert report.confusion == skm.confusion_matrix(y, pred).tolist()
