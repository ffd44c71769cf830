"""Binary classification: `data.label.positive` / `negative` name the two raw values; the network
has one logit; the prediction is positive at probability >= the target's threshold (0.5, or
chosen on the validation split with `evaluate.threshold: f1`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from sparkml_dist.tasks.base import PREDICTION, PROBABILITY, Target, Task, TaskReport, register_task

if TYPE_CHECKING:
    from collections.abc import Mapping

    import numpy as np
    from pyspark.sql import Column, DataFrame

    from sparkml_dist.config.schema import LabelSpec
    from sparkml_dist.tasks.base import Direction


def normalized(label: LabelSpec, raw: Column) -> Column:
    """The raw label as a string, with `strip_suffix` removed (Adult's test file writes '>50K.')."""
    from pyspark.sql import functions as F

    value = F.trim(raw.cast("string"))
    suffix = label.strip_suffix
    if suffix:
        value = F.when(
            value.endswith(suffix), value.substr(F.lit(1), F.length(value) - len(suffix))
        ).otherwise(value)
    return value


AUC_BINS = 4096


class Binary(Task):
    name = "binary"
    metrics: ClassVar[Mapping[str, Direction]] = {
        "accuracy": "higher",
        "roc_auc": "higher",
        "f1": "higher",
        "log_loss": "lower",
        "precision": "higher",
        "recall": "higher",
    }
    held_out_metric = "accuracy"
    held_out_extra = ("roc_auc",)  # what an imbalanced label is tuned on: accuracy rewards the majority class
    default_gate = ("roc_auc", 0.5)
    thresholded = True
    boolean_classes = True

    def check_label(self, label: LabelSpec) -> None:
        if label.positive is None or label.negative is None:
            raise ValueError(
                "data.label.task=binary needs data.label.positive and data.label.negative (the raw "
                "values of the two classes)"
            )
        if label.positive == label.negative:
            raise ValueError("data.label.positive and data.label.negative must differ")

    def label_value(self, label: LabelSpec, raw: Column) -> Column:
        return normalized(label, raw)

    def label_problem(self, label: LabelSpec, raw: Column) -> Column:
        from pyspark.sql import functions as F

        allowed = [label.negative, label.positive]
        return F.when(raw.isNull(), F.lit(f"label '{label.column}' is missing")).when(
            ~normalized(label, raw).isin(allowed),
            F.concat(
                F.lit(f"label '{label.column}': unknown value '"),
                raw.cast("string"),
                F.lit(f"' (expected '{label.positive}' or '{label.negative}')"),
            ),
        )

    def fit(self, label: LabelSpec, labels: DataFrame, column: str) -> Target:
        if label.negative is None or label.positive is None:  # tasks/checks.py refuses such a config
            raise ValueError("a binary label needs data.label.positive and data.label.negative")
        counts: dict[str, int] = dict(labels.groupBy(column).count().select(column, "count").collect())
        classes = (label.negative, label.positive)
        return Target(self.name, classes, counts=tuple(int(counts.get(c, 0)) for c in classes))

    def encode(self, target: Target, value: Column) -> Column:
        from pyspark.sql import functions as F

        negative, positive = target.classes
        return F.when(value == positive, F.lit(1.0)).when(value == negative, F.lit(0.0)).cast("float")

    def output_dim(self, target: Target) -> int:
        return 1

    def loss(self, target: Target, class_weights=None, kind=None):
        from sparkml_dist.tasks.losses import BinaryLoss  # torch: not while a config is read

        return BinaryLoss(class_weights)

    def held_out_sums(self, target: Target, outputs, packed):
        import torch
        import torch.nn.functional as F

        label, weight = packed[:, 0], packed[:, 1]
        loss = F.binary_cross_entropy_with_logits(outputs, label, reduction="none")
        correct = ((outputs > 0).float() == label).float()
        return torch.stack([(loss * weight).sum(), (correct * weight).sum(), weight.sum()])

    def held_out_bins(self, target: Target, outputs, packed):
        """Weighted counts of negatives, then positives, per probability bin: summed over every
        rank's shard they give the ROC AUC of all validation rows (binned, as TensorFlow's AUC
        metric does, with far finer bins: only pairs that share a bin are counted as ties, so the
        error is at most half their share; 1e-3 against sklearn in tests/test_metrics.py)."""
        import torch

        label, weight = packed[:, 0].double(), packed[:, 1].double()
        index = (torch.sigmoid(outputs.double().reshape(-1)) * AUC_BINS).long().clamp_(0, AUC_BINS - 1)
        bins = torch.zeros(2 * AUC_BINS, dtype=torch.float64, device=outputs.device)
        bins.index_add_(0, index + AUC_BINS * (label > 0.5).long(), weight)
        return bins

    def extra_from_bins(self, target: Target, bins) -> dict[str, float]:
        from sparkml_dist.tasks.metrics import roc_from_bins  # numpy: not while a config is read

        counts = bins.detach().cpu().double().numpy()
        neg, pos = counts[:AUC_BINS], counts[AUC_BINS:]
        if neg.sum() <= 0 or pos.sum() <= 0:  # one class absent from the rows: no AUC
            return {"roc_auc": float("nan")}
        return {"roc_auc": roc_from_bins(pos, neg)[2]}

    def predict(self, target: Target, outputs: np.ndarray) -> dict[str, np.ndarray]:
        import numpy as np

        proba = 1.0 / (1.0 + np.exp(-outputs.astype(np.float64)))
        return {PROBABILITY: proba, PREDICTION: (proba >= target.threshold).astype(np.int32)}

    def output_columns(self, target: Target) -> list[tuple[str, str]]:
        return [(PROBABILITY, "double"), (PREDICTION, "integer")]

    def report(self, scored: DataFrame, target: Target, label: str, weight: str | None) -> TaskReport:
        from sparkml_dist.tasks.reports.binary import binary_report  # pyspark: not while a config is read

        return binary_report(scored, target, label, weight)


BINARY = register_task(Binary())
