"""Regression: a numeric label. The network learns the label standardised on the training split
((y - mean) / std, both saved with the model); predictions come back in the label's units.
`train.loss`: mse (default) or huber (on the standardised label, delta 1)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from sparkml_dist.tasks.base import PREDICTION, EvalRows, Evaluation, Target, Task, TaskReport, register_task

if TYPE_CHECKING:
    from collections.abc import Mapping

    import numpy as np
    from pyspark.sql import Column, DataFrame

    from sparkml_dist.config.schema import LabelSpec
    from sparkml_dist.tasks.base import Direction


class Regression(Task):
    name = "regression"
    metrics: ClassVar[Mapping[str, Direction]] = {"rmse": "lower", "mae": "lower", "r2": "higher"}
    held_out_metric = "rmse"
    held_out_extra = ("mae", "r2")
    default_gate = ("r2", 0.0)  # better than predicting the mean
    classifier = False

    def check_label(self, label: LabelSpec) -> None:
        if label.positive is not None or label.negative is not None or label.classes is not None:
            raise ValueError("data.label.task=regression takes no data.label.positive/negative/classes")

    def label_value(self, label: LabelSpec, raw: Column) -> Column:
        from sparkml_dist.spark.compat import try_cast  # pyspark: not while a config is read

        return try_cast(raw, "double")

    def label_problem(self, label: LabelSpec, raw: Column) -> Column:
        from pyspark.sql import functions as F

        from sparkml_dist.spark.compat import try_cast  # pyspark: not while a config is read

        value = try_cast(raw, "double")
        return (
            F.when(raw.isNull(), F.lit(f"label '{label.column}' is missing"))
            .when(
                value.isNull(),
                F.concat(F.lit(f"label '{label.column}': '"), raw.cast("string"), F.lit("' is not a number")),
            )
            .when(
                F.isnan(value) | (F.abs(value) == float("inf")),
                F.concat(
                    F.lit(f"label '{label.column}': '"),
                    raw.cast("string"),
                    F.lit("' is not finite (NaN/inf)"),
                ),
            )
        )

    def fit(self, label: LabelSpec, labels: DataFrame, column: str) -> Target:
        from pyspark.sql import functions as F

        from sparkml_dist.spark.rows import only_row  # pyspark: not while a config is read

        row = only_row(labels.agg(F.avg(column).alias("mean"), F.stddev_pop(column).alias("std")))
        std = float(row["std"] or 0.0)
        return Target(self.name, mean=float(row["mean"] or 0.0), std=std if std > 0 else 1.0)

    def encode(self, target: Target, value: Column) -> Column:
        return value.cast("float")

    def output_dim(self, target: Target) -> int:
        return 1

    def loss(self, target: Target, class_weights=None, kind=None):
        from sparkml_dist.tasks.losses import RegressionLoss  # torch: not while a config is read

        return RegressionLoss(target.mean, target.std, kind or "mse")

    def held_out_sums(self, target: Target, outputs, packed):
        import torch

        label, weight = packed[:, 0], packed[:, 1]
        z = (label - target.mean) / target.std
        loss = (outputs - z) ** 2
        squared_error = (outputs * target.std + target.mean - label) ** 2
        return torch.stack([(loss * weight).sum(), (squared_error * weight).sum(), weight.sum()])

    def held_out(
        self, target: Target, loss_sum: float, metric_sum: float, weight_sum: float, rows: EvalRows = "val"
    ) -> Evaluation:
        n = max(weight_sum, 1e-12)
        return Evaluation(rows, loss=loss_sum / n, metric="rmse", value=(metric_sum / n) ** 0.5)

    def held_out_bins(self, target: Target, outputs, packed):
        """Weighted sums over one batch, in the label's units: the weight, the absolute and squared
        errors, and the label and its square. Summed over every rank's shard they give all
        validation rows' mae and r2 (r2's total sum of squares from the label's sums)."""
        import torch

        label, weight = packed[:, 0].double(), packed[:, 1].double()
        error = outputs.double().reshape(-1) * target.std + target.mean - label
        return torch.stack(
            [
                weight.sum(),
                (weight * error.abs()).sum(),
                (weight * error * error).sum(),
                (weight * label).sum(),
                (weight * label * label).sum(),
            ]
        )

    def extra_from_bins(self, target: Target, bins) -> dict[str, float]:
        from sparkml_dist.tasks.metrics import metrics_from_sums  # numpy: not while a config is read

        total, absolute, squared, label_sum, label_squares = (float(v) for v in bins.detach().cpu().double())
        metrics = metrics_from_sums(
            total, squared, absolute, label_sum, label_squares, undefined=float("nan")
        )
        return {"mae": metrics["mae"], "r2": metrics["r2"]}

    def predict(self, target: Target, outputs: np.ndarray) -> dict[str, np.ndarray]:
        import numpy as np

        return {PREDICTION: outputs.astype(np.float64) * target.std + target.mean}

    def output_columns(self, target: Target) -> list[tuple[str, str]]:
        return [(PREDICTION, "double")]

    def report(self, scored: DataFrame, target: Target, label: str, weight: str | None) -> TaskReport:
        from sparkml_dist.tasks.reports.regression import (
            regression_report,  # pyspark: not while a config is read
        )

        return regression_report(scored, label, weight)


REGRESSION = register_task(Regression())
