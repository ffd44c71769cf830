"""Spark ML's mean Imputer, fitted in one vectorised pass.

`Imputer(strategy="mean").fit` computes one SQL `avg` per column; on a wide input (784 pixels)
that is hundreds of interpreted aggregates per row, because Spark turns whole-stage code
generation off above `spark.sql.codegen.maxFields` (100) columns. Here the columns travel as one
vector through `Summarizer` (a single aggregate with a tight loop), and only the columns that
hold a missing value (their vector mean is NaN) are averaged in SQL. The result is Spark's own
`ImputerModel`, so the fitted pipeline saves, loads and transforms exactly as before.
"""

from __future__ import annotations

import math

from pyspark.ml import Estimator
from pyspark.ml.feature import Imputer, ImputerModel
from pyspark.ml.functions import array_to_vector
from pyspark.ml.stat import Summarizer
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sparkml_dist.data.sql import ident
from sparkml_dist.errors import DataError

__all__ = ["MeanImputer"]


class MeanImputer(Estimator):
    """Fits `imputer` (strategy mean, missing value NaN: what `build_feature_pipeline` makes)
    and returns the same `ImputerModel` Spark ML would."""

    def __init__(self, imputer: Imputer) -> None:
        super().__init__()
        if imputer.getStrategy() != "mean" or not math.isnan(imputer.getMissingValue()):
            raise ValueError("MeanImputer fits strategy 'mean' with missing value NaN only")
        self.imputer = imputer

    def _fit(self, dataset: DataFrame) -> ImputerModel:
        names = self.imputer.getInputCols()
        means = column_means(dataset, names)
        context = dataset.sparkSession.sparkContext
        jvm, gateway = context._jvm, context._gateway
        columns, surrogates = gateway.new_array(jvm.java.lang.String, len(names)), gateway.new_array(jvm.double, len(names))
        for i, name in enumerate(names):
            columns[i], surrogates[i] = name, means[name]
        # the constructor Spark's own fit uses: (uid, column names, surrogates)
        java_model = jvm.org.apache.spark.ml.feature.ImputerModel(self.imputer.uid, columns, surrogates)
        return self.imputer._copyValues(ImputerModel(java_model))


def column_means(rows: DataFrame, names: list[str]) -> dict[str, float]:
    """The mean of each column over its values that are neither null nor NaN."""
    if rows.isEmpty():  # Summarizer fails on no rows with a bare "requirement failed"
        raise DataError("no training rows to fit the feature pipeline on (the training split is empty)")
    as_doubles = ", ".join(f"coalesce(CAST({ident(n)} AS DOUBLE), double('NaN'))" for n in names)
    vector = array_to_vector(F.expr(f"array({as_doubles})"))
    summary = rows.select(Summarizer.metrics("mean").summary(vector).alias("s")).first()["s"]
    means = dict(zip(names, summary["mean"].toArray().tolist()))
    with_missing = [n for n, m in means.items() if math.isnan(m)]
    if with_missing:
        means.update(_sql_means(rows, with_missing))
    return means


def _sql_means(rows: DataFrame, names: list[str]) -> dict[str, float]:
    present = [f"CASE WHEN isnan(CAST({ident(n)} AS DOUBLE)) THEN NULL ELSE CAST({ident(n)} AS DOUBLE) END"
               for n in names]
    row = rows.selectExpr(*[f"avg({p})" for p in present]).first()
    empty = [n for n, value in zip(names, row) if value is None]
    if empty:
        raise DataError(f"numeric column(s) {empty} have no value in the training rows (every value is null "
                        f"or NaN): there is nothing to impute from; give them role ignore in data.columns")
    return dict(zip(names, (float(v) for v in row)))
