"""Spark ML's Imputer and the StandardScaler after it, fitted in one pass.

`Imputer.fit` is one pass over the rows (an `avg` or an approximate median per column), and the
`StandardScaler` that `build_feature_pipeline` puts after it is another (a `Summarizer` over
the assembled, imputed vector). Both need only each column's count, mean and variance over its
present values, and the surrogate: the imputed column is those k values plus n - k copies of the
surrogate, whose mean and variance follow from them (`ColumnMoments.imputed`). `OnePassImputer`
computes them in one job; `ImputedScaler` turns them into the scaler without reading the rows
again. The results are Spark's own `ImputerModel` and `StandardScalerModel`, so the fitted
pipeline saves, loads and transforms exactly as before.

How the statistics are computed depends on the width: a narrow input is one select of SQL
aggregates (code-generated; the median is the `percentile_approx` Spark's Imputer asks for, at
its relative error). Above `spark.sql.codegen.maxFields` (100) Spark interprets aggregates row
by row, so a wide input (784 pixels) travels as one vector through `Summarizer` (a single
aggregate with a tight loop); only its columns that hold a missing value (their vector mean is
NaN) are aggregated in SQL, and a median is Spark's own Imputer fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from pyspark.ml import Estimator
from pyspark.ml.feature import Imputer, ImputerModel, StandardScaler, StandardScalerModel
from pyspark.ml.functions import array_to_vector
from pyspark.ml.stat import Summarizer
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkml_dist.data.packed import PACKED, packed_columns
from sparkml_dist.data.sql import ident
from sparkml_dist.errors import DataError
from sparkml_dist.spark.kind import is_connect
from sparkml_dist.spark.rows import only_row

__all__ = ["ColumnMoments", "ImputedScaler", "OnePassImputer", "numeric_moments"]

# up to four aggregates a column: above this many columns the select exceeds codegen's field limit
_SQL_COLUMNS = 24


@dataclass(frozen=True)
class ColumnMoments:
    """One column over the rows: n rows, k of them with a value (not null, not NaN), those values'
    mean and sample variance, and the surrogate that fills the other n - k."""

    n: int
    k: int
    mean: float
    variance: float
    surrogate: float

    def imputed(self) -> tuple[float, float]:
        """The mean and sample std of the column once imputed: what StandardScaler would fit."""
        n, k, s = self.n, self.k, self.surrogate
        if k == n:  # nothing imputed: the moments as computed (k * mean / n would not round-trip)
            return self.mean, math.sqrt(self.variance) if n > 1 else 0.0
        mean = (k * self.mean + (n - k) * s) / n
        if n < 2:
            return mean, 0.0
        squares = (
            (k - 1) * (self.variance if k > 1 else 0.0)
            + k * (self.mean - mean) ** 2
            + (n - k) * (s - mean) ** 2
        )
        return mean, math.sqrt(squares / (n - 1))


@dataclass
class _MomentsBox:
    """Where `OnePassImputer` leaves its statistics for the `ImputedScaler` after it. A box, not
    an attribute: Spark ML copies stages shallowly, and every copy shares one box."""

    moments: dict[str, ColumnMoments] | None = field(default=None)
    # on Spark Connect the models cannot be built from the moments on this side (no JVM here):
    # Spark ML fits both itself, one pass each
    own_passes: bool = False


class OnePassImputer(Estimator):
    """Fits `imputer` (missing value NaN, strategy mean or median: what `build_feature_pipeline`
    makes) and returns the `ImputerModel` Spark ML would, keeping each column's moments for an
    `ImputedScaler`."""

    def __init__(self, imputer: Imputer) -> None:
        super().__init__()
        if imputer.getStrategy() not in ("mean", "median") or not math.isnan(imputer.getMissingValue()):
            raise ValueError("OnePassImputer fits strategy 'mean' or 'median' with missing value NaN only")
        self.imputer = imputer
        self.box = _MomentsBox()

    def _fit(self, dataset: DataFrame) -> ImputerModel:
        if is_connect(dataset.sparkSession):
            self.box.own_passes = True
            return self.imputer.fit(dataset)
        names = self.imputer.getInputCols()
        moments = numeric_moments(dataset, names, self.imputer)
        self.box.moments = moments
        java_model = _java_imputer_model(
            dataset.sparkSession, self.imputer.uid, names, [moments[n].surrogate for n in names]
        )
        return self.imputer._copyValues(ImputerModel(java_model))


class ImputedScaler(Estimator):
    """`scaler` (withMean, withStd) over the assembled output of `imputer`, fitted from the
    moments the imputer's fit already computed: no pass over the rows."""

    def __init__(self, imputer: OnePassImputer, scaler: StandardScaler) -> None:
        super().__init__()
        if not (scaler.getWithMean() and scaler.getWithStd()):
            raise ValueError("ImputedScaler fits a StandardScaler with withMean and withStd only")
        self.box, self.names, self.scaler = imputer.box, imputer.imputer.getInputCols(), scaler

    def _fit(self, dataset: DataFrame) -> StandardScalerModel:
        if self.box.own_passes:
            return self.scaler.fit(dataset)
        if self.box.moments is None:
            raise RuntimeError("ImputedScaler is fitted after its OnePassImputer, in one Pipeline")
        if any(dataset.schema[n].dataType.typeName() != "double" for n in self.names):
            # the imputer casts its surrogate to the column's type: an int column's imputed values
            # are not the surrogate, so only the scaler's own pass is exact (ingest makes numbers double)
            return self.scaler.fit(dataset)
        context = dataset.sparkSession.sparkContext
        jvm: Any = context._jvm  # py4j: untyped
        means, stds = zip(*(self.box.moments[n].imputed() for n in self.names))

        def vector(values: tuple[float, ...]):
            return jvm.org.apache.spark.ml.linalg.Vectors.dense(_java_array(context, "double", list(values)))

        # the constructor StandardScaler's own fit uses: (uid, std, mean)
        java_model = jvm.org.apache.spark.ml.feature.StandardScalerModel(
            self.scaler.uid, vector(stds), vector(means)
        )
        return self.scaler._copyValues(StandardScalerModel(java_model))


def numeric_moments(rows: DataFrame, names: list[str], imputer: Imputer) -> dict[str, ColumnMoments]:
    """Each column's moments over its present values, and `imputer`'s surrogate for it."""
    median = imputer.getStrategy() == "median"
    narrow = len(names) <= _SQL_COLUMNS
    moments = (
        _sql_moments(rows, names, imputer.getRelativeError() if median else None)
        if narrow
        else _summarized_moments(rows, names)
    )
    if moments[names[0]].n == 0:
        raise DataError("no training rows to fit the feature pipeline on (the training split is empty)")
    empty = [name for name in names if moments[name].k == 0]
    if empty:
        raise DataError(
            f"numeric column(s) {empty} have no value in the training rows (every value is null "
            f"or NaN): there is nothing to impute from; give them role ignore in data.columns"
        )
    if median and not narrow:
        surrogates = only_row(imputer.fit(rows).surrogateDF).asDict()  # Spark's own quantile pass
        moments = {n: replace(m, surrogate=surrogates[n]) for n, m in moments.items()}
    return moments


def _present(name: str) -> str:
    x = f"CAST({ident(name)} AS DOUBLE)"
    return f"CASE WHEN isnan({x}) THEN NULL ELSE {x} END"


def _sql_moments(rows: DataFrame, names: list[str], median_error: float | None) -> dict[str, ColumnMoments]:
    """One select; with `median_error`, the surrogate is the median at that relative error
    (`percentile_approx`'s accuracy is its inverse), else the mean."""
    per_column = 4 if median_error is not None else 3
    aggregates = ["count(1)"]
    for name in names:
        p = _present(name)
        aggregates += [f"count({p})", f"avg({p})", f"var_samp({p})"]
        if median_error is not None:
            aggregates.append(f"percentile_approx({p}, 0.5, {round(1 / median_error)})")
    row = only_row(rows.selectExpr(*aggregates))
    moments = {}
    for i, name in enumerate(names):
        k, mean, variance, *median = row[1 + per_column * i : 1 + per_column * (i + 1)]
        mean = _number(mean)
        moments[name] = ColumnMoments(
            int(row[0]), int(k), mean, _number(variance), _number(median[0]) if median else mean
        )
    return moments


def _summarized_moments(rows: DataFrame, names: list[str]) -> dict[str, ColumnMoments]:
    """Mean surrogates: one Summarizer pass, and SQL for the columns with a missing value."""
    if packed_columns(rows) == names:  # already one array of doubles (data/packed.py)
        # a vector takes no null: a row with one is copied with NaN for it, by a lambda Spark
        # interprets value by value; a row with neither a null nor a NaN (array_contains is false
        # only then, and compiled: a plain scan, where arrays_overlap hashed each value and took
        # MNIST's pass 2.7 s against 2.2) is the vector as it is
        values = (
            f"CASE WHEN NOT array_contains({PACKED}, double('NaN')) THEN {PACKED} "
            f"ELSE transform({PACKED}, x -> coalesce(x, double('NaN'))) END"
        )
    else:
        values = (
            "array(" + ", ".join(f"coalesce(CAST({ident(n)} AS DOUBLE), double('NaN'))" for n in names) + ")"
        )
    vector = array_to_vector(F.expr(values))
    metrics = Summarizer.metrics("count", "mean", "variance").summary(vector).alias("s")
    try:
        summary = only_row(rows.select(metrics))["s"]
    except Exception:
        # Summarizer fails on no rows with a bare "requirement failed": asked only then, which
        # spares every fit a job
        if rows.isEmpty():
            return {name: ColumnMoments(0, 0, math.nan, math.nan, math.nan) for name in names}
        raise
    n = int(summary["count"])
    means, variances = summary["mean"].toArray().tolist(), summary["variance"].toArray().tolist()
    moments = {name: ColumnMoments(n, n, m, v, m) for name, m, v in zip(names, means, variances)}
    with_missing = [name for name, m in zip(names, means) if math.isnan(m)]  # NaN: a missing value somewhere
    if with_missing:  # one more pass for all of them (interpreted when wide, but one pass)
        moments.update(_sql_moments(rows, with_missing, None))
    return moments


def _java_imputer_model(spark: SparkSession, uid: str, names: list[str], surrogates: list[float]):
    """The JVM ImputerModel Spark's own fit makes, built with the constructor this Spark has."""
    context = spark.sparkContext
    jvm: Any = context._jvm  # py4j: untyped
    model_class = jvm.org.apache.spark.ml.feature.ImputerModel
    if _has_names_and_surrogates_constructor(context):  # Spark 4's (uid, column names, surrogates)
        return model_class(
            uid, _java_array(context, "String", names), _java_array(context, "double", surrogates)
        )
    # 3.5's (uid, surrogateDF): one row holding each column's surrogate under the column's name
    surrogate_row = spark.createDataFrame(
        [tuple(float(v) for v in surrogates)], T.StructType([T.StructField(n, T.DoubleType()) for n in names])
    )
    return model_class(uid, surrogate_row._jdf)


def _has_names_and_surrogates_constructor(context) -> bool:
    """Asked of the JVM rather than inferred from pyspark's version: the client and the cluster's
    Spark can differ by a minor release, and the constructor is what the call needs."""
    jvm_class = context._jvm.java.lang.Class.forName("org.apache.spark.ml.feature.ImputerModel")
    return any(
        [str(t.getSimpleName()) for t in c.getParameterTypes()] == ["String", "String[]", "double[]"]
        for c in jvm_class.getConstructors()
    )


def _number(value) -> float:
    return math.nan if value is None else float(value)


def _java_array(context, kind: str, values: list):
    jvm = context._jvm
    array = context._gateway.new_array(jvm.java.lang.String if kind == "String" else jvm.double, len(values))
    for i, value in enumerate(values):
        array[i] = value
    return array
