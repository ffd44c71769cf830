"""Spark-aggregated metrics agree with scikit-learn on the same predictions, for every task,
with and without row weights."""

import numpy as np
import pytest
from sklearn import metrics as skm

from sparkml_dist.tasks import Target
from sparkml_dist.tasks.reports.binary import best_f1_threshold, binary_report
from sparkml_dist.tasks.reports.multiclass import multiclass_report
from sparkml_dist.tasks.reports.regression import regression_report

pytestmark = pytest.mark.spark


def binary_rows(n=5000, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    p = np.clip(0.35 * y + rng.random(n) * 0.65, 0, 1)
    w = rng.uniform(0.2, 3.0, n)
    return y, p, w


@pytest.mark.parametrize("weighted", [False, True])
def test_binary_report_matches_sklearn(spark, weighted):
    y, p, w = binary_rows()
    rows = [(int(a), float(b), int(b >= 0.5), float(c)) for a, b, c in zip(y, p, w)]
    df = spark.createDataFrame(rows, "label int, probability double, prediction int, weight double")
    report = binary_report(
        df, Target("binary", ("no", "yes")), weight="weight" if weighted else None, roc_bins=5000
    )
    pred = (p >= 0.5).astype(int)
    sw = w if weighted else None
    assert report.metrics["accuracy"] == pytest.approx(skm.accuracy_score(y, pred, sample_weight=sw))
    assert report.metrics["precision"] == pytest.approx(skm.precision_score(y, pred, sample_weight=sw))
    assert report.metrics["recall"] == pytest.approx(skm.recall_score(y, pred, sample_weight=sw))
    assert report.metrics["f1"] == pytest.approx(skm.f1_score(y, pred, sample_weight=sw))
    assert report.metrics["log_loss"] == pytest.approx(skm.log_loss(y, p, sample_weight=sw), rel=1e-4)
    assert report.metrics["roc_auc"] == pytest.approx(skm.roc_auc_score(y, p, sample_weight=sw), abs=2e-3)
    assert [name for name, _ in report.plots] == ["roc.png", "confusion_matrix.png"]


@pytest.mark.parametrize("weighted", [False, True])
def test_the_epochs_validation_roc_auc_summed_over_ranks_matches_sklearn(weighted):
    """Each rank bins its validation batches; the allreduced counts give all rows' AUC."""
    import torch

    from sparkml_dist.tasks import get_task

    y, p, w = binary_rows()
    weights = w if weighted else np.ones_like(w)
    logits = torch.logit(torch.tensor(p).clamp(1e-6, 1 - 1e-6))
    packed = torch.tensor(np.stack([y, weights], axis=1), dtype=torch.float32)
    task, target = get_task("binary"), Target("binary", ("no", "yes"))
    ranks = [slice(0, 1700), slice(1700, 3000), slice(3000, 5000)]  # shards of unequal size, batches within
    summed = sum(
        task.held_out_bins(target, logits[r][i : i + 256], packed[r][i : i + 256])
        for r in ranks
        for i in range(0, r.stop - r.start, 256)
    )
    auc = task.extra_from_bins(target, summed)["roc_auc"]
    assert auc == pytest.approx(skm.roc_auc_score(y, p, sample_weight=weights), abs=1e-3)
    inverted = task.extra_from_bins(target, task.held_out_bins(target, -logits, packed))["roc_auc"]
    assert inverted == pytest.approx(1 - auc, abs=1e-3)


def test_the_f1_threshold_is_the_best_one_on_the_rows(spark):
    rng = np.random.default_rng(1)
    y = (rng.random(20000) < 0.06).astype(int)  # 6% positives: 0.5 is far from the best threshold
    p = np.clip(0.25 * y + rng.random(20000) * 0.3, 0, 1)
    df = spark.createDataFrame([(int(a), float(b)) for a, b in zip(y, p)], "label int, probability double")
    threshold, f1 = best_f1_threshold(df, "label", None)
    cuts = np.arange(0, 1000) / 1000
    best = max(skm.f1_score(y, (p >= c).astype(int), zero_division=0) for c in cuts)
    assert f1 == pytest.approx(best, abs=1e-9)
    assert skm.f1_score(y, (p >= threshold).astype(int)) == pytest.approx(best, abs=1e-9)
    assert skm.f1_score(y, (p >= 0.5).astype(int), zero_division=0) < f1 - 0.2


def test_separated_classes_get_the_threshold_in_the_middle_of_the_gap(spark):
    """Every threshold between the highest negative (0.2) and the lowest positive (0.6) gives F1
    1.0; the one chosen leaves both classes a margin, not the edge of the negatives."""
    rng = np.random.default_rng(3)
    rows = [(0, float(p)) for p in rng.uniform(0.0, 0.2, 300)] + [
        (1, float(p)) for p in rng.uniform(0.6, 1.0, 100)
    ]
    rows += [(0, 0.2), (1, 0.6)]
    df = spark.createDataFrame(rows, "label int, probability double")
    threshold, f1 = best_f1_threshold(df, "label", None)
    assert f1 == 1.0
    assert threshold == pytest.approx(0.4, abs=0.002)


@pytest.mark.parametrize("weighted", [False, True])
def test_the_epochs_validation_macro_f1_summed_over_ranks_matches_sklearn(weighted):
    """Each rank counts its validation rows' confusion matrix; the allreduced counts give all rows'
    macro F1 (a class never predicted counts as F1 0, as sklearn's zero_division=0)."""
    import torch

    from sparkml_dist.tasks import get_task

    rng = np.random.default_rng(5)
    k, n = 4, 3000
    y = rng.choice(k, n, p=[0.7, 0.2, 0.08, 0.02])  # imbalanced: the rare class is rarely right
    logits = rng.normal(size=(n, k)) + 1.5 * np.eye(k)[y]
    weights = rng.uniform(0.2, 3.0, n) if weighted else np.ones(n)
    packed = torch.tensor(np.stack([y, weights], axis=1), dtype=torch.float32)
    task, target = get_task("multiclass"), Target("multiclass", ("a", "b", "c", "d"))
    outputs = torch.tensor(logits, dtype=torch.float32)
    shards = [slice(0, 1000), slice(1000, 1100), slice(1100, 3000)]
    summed = sum(task.held_out_bins(target, outputs[r], packed[r]) for r in shards)
    summed = summed + task.held_out_bins(target, torch.zeros(0), torch.zeros(0, 2))  # a rank with no rows
    expected = skm.f1_score(y, logits.argmax(axis=1), average="macro", sample_weight=weights, zero_division=0)
    assert task.extra_from_bins(target, summed)["macro_f1"] == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("weighted", [False, True])
def test_the_epochs_validation_mae_and_r2_summed_over_ranks_match_sklearn(weighted):
    """Each rank sums its validation rows' errors and labels (in the label's units, from the
    standardised outputs); the allreduced sums give all rows' mae and r2."""
    import torch

    from sparkml_dist.tasks import get_task

    rng = np.random.default_rng(9)
    n = 3000
    y = rng.normal(250_000.0, 60_000.0, n)  # prices: a large mean, as the label's sums must survive
    predicted = y + rng.normal(0.0, 20_000.0, n)
    weights = rng.uniform(0.2, 3.0, n) if weighted else np.ones(n)
    task, target = get_task("regression"), Target("regression", mean=240_000.0, std=55_000.0)
    outputs = torch.tensor((predicted - target.mean) / target.std, dtype=torch.float32).reshape(-1, 1)
    packed = torch.tensor(np.stack([y, weights], axis=1), dtype=torch.float32)
    shards = [slice(0, 1000), slice(1000, 1100), slice(1100, 3000)]
    summed = sum(task.held_out_bins(target, outputs[r], packed[r]) for r in shards)
    summed = summed + task.held_out_bins(target, torch.zeros(0), torch.zeros(0, 2))  # a rank with no rows
    # the ranks hold float32 outputs and labels: compare with sklearn on those same values
    y32, w32 = packed[:, 0].double().numpy(), packed[:, 1].double().numpy()
    p32 = outputs.double().reshape(-1).numpy() * target.std + target.mean
    extra = task.extra_from_bins(target, summed)
    assert extra["mae"] == pytest.approx(skm.mean_absolute_error(y32, p32, sample_weight=w32), rel=1e-9)
    assert extra["r2"] == pytest.approx(skm.r2_score(y32, p32, sample_weight=w32), abs=1e-9)


@pytest.mark.parametrize("weighted", [False, True])
def test_multiclass_report_matches_sklearn(spark, weighted):
    rng = np.random.default_rng(2)
    k, n = 5, 4000
    y = rng.integers(0, k, n)
    logits = rng.normal(size=(n, k)) + 2.0 * np.eye(k)[y] * rng.random((n, 1))
    proba = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    pred = proba.argmax(axis=1)
    w = rng.uniform(0.5, 2.0, n)
    rows = [
        (int(a), int(b), float(c[b]), [float(v) for v in c], float(d))
        for a, b, c, d in zip(y, pred, proba, w)
    ]
    df = spark.createDataFrame(
        rows, "label int, prediction int, probability double, probabilities array<double>, weight double"
    )
    classes = tuple(f"c{i}" for i in range(k))
    report = multiclass_report(df, Target("multiclass", classes), "label", "weight" if weighted else None)
    sw = w if weighted else None
    assert report.metrics["accuracy"] == pytest.approx(skm.accuracy_score(y, pred, sample_weight=sw))
    assert report.metrics["macro_f1"] == pytest.approx(
        skm.f1_score(y, pred, average="macro", sample_weight=sw)
    )
    assert report.metrics["weighted_f1"] == pytest.approx(
        skm.f1_score(y, pred, average="weighted", sample_weight=sw)
    )
    assert report.metrics["log_loss"] == pytest.approx(skm.log_loss(y, proba, sample_weight=sw), rel=1e-4)
    per_class = report.tables["per_class.json"]
    assert [r["class"] for r in per_class] == list(classes)
    recall = skm.recall_score(y, pred, average=None, sample_weight=sw)
    assert [r["recall"] for r in per_class] == pytest.approx(list(recall))


@pytest.mark.parametrize("weighted", [False, True])
def test_regression_report_matches_sklearn(spark, weighted):
    rng = np.random.default_rng(3)
    y = rng.normal(50, 10, 3000)
    p = y + rng.normal(0, 4, 3000)
    w = rng.uniform(0.5, 2.0, 3000)
    df = spark.createDataFrame(
        [(float(a), float(b), float(c)) for a, b, c in zip(y, p, w)],
        "label double, prediction double, weight double",
    )
    report = regression_report(df, "label", "weight" if weighted else None)
    sw = w if weighted else None
    assert report.metrics["rmse"] == pytest.approx(np.sqrt(skm.mean_squared_error(y, p, sample_weight=sw)))
    assert report.metrics["mae"] == pytest.approx(skm.mean_absolute_error(y, p, sample_weight=sw))
    assert report.metrics["r2"] == pytest.approx(skm.r2_score(y, p, sample_weight=sw))
    assert [name for name, _ in report.plots] == ["predicted_vs_actual.png", "residuals.png"]


SCORED = {  # what the model adds to a test row, per task: (column type, a value from the row's id)
    "binary": ("probability:double,prediction:int", lambda i: (((i * 7) % 10) / 10, int((i * 7) % 10 >= 5))),
    "multiclass": ("probabilities:array<double>,prediction:int", lambda i: ([0.2, 0.5, 0.3], 1)),
    "regression": ("prediction:double", lambda i: (float(i % 7),)),
}


@pytest.mark.parametrize("task", sorted(SCORED))
def test_evaluation_runs_the_model_once_per_test_row(spark, task):
    """Each task's report reads the scored rows twice (the metrics, then a histogram, the log loss or
    a plot's sample); evaluate keeps them after the first pass, so the model, here a Python UDF
    that counts its rows, scores each test row once. Without the kept rows it scores each twice."""
    from pyspark.sql import functions as F

    from sparkml_dist.stages.evaluate import _report_once_scored

    columns, value = SCORED[task]
    scored_rows = spark.sparkContext.accumulator(0)

    def model(i):
        scored_rows.add(1)
        return value(i)

    n = 3000
    rows = spark.range(n).withColumn(
        "label",
        (F.col("id") % (2 if task == "binary" else 3)).cast("double" if task == "regression" else "int"),
    )
    scored = rows.withColumn("out", F.udf(model, f"struct<{columns}>")("id"))
    scored = scored.select("id", "label", "out.*")
    classes = {"binary": ("no", "yes"), "multiclass": ("a", "b", "c")}.get(task, ())
    report = _report_once_scored(scored, Target(task, classes), None)
    assert report.metrics["rows"] == n
    assert scored_rows.value == n, f"the model scored {scored_rows.value} rows for {n} test rows"
