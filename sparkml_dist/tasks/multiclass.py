"""Multiclass classification: the classes are `data.label.classes`, or every value of the label
in the training rows (sorted: numbers by value, else as strings), saved with the data and the
model. The network has one logit per class; a prediction is the most probable class, with its
probability and every class's (`probabilities`, in class order)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from sparkml_dist.tasks.base import (
    PREDICTION,
    PROBABILITIES,
    PROBABILITY,
    Target,
    Task,
    TaskReport,
    register_task,
)
from sparkml_dist.tasks.binary import normalized

if TYPE_CHECKING:
    from collections.abc import Mapping

    import numpy as np
    from pyspark.sql import Column, DataFrame

    from sparkml_dist.config.schema import LabelSpec
    from sparkml_dist.tasks.base import Direction

MAX_CLASSES = 10_000  # more distinct labels than this is almost certainly a regression target or an id


def class_order(values: list[str]) -> list[str]:
    """Numbers by value ('2' before '10'), otherwise as strings."""
    try:
        return sorted(values, key=float)
    except ValueError:
        return sorted(values)


class Multiclass(Task):
    name = "multiclass"
    metrics: ClassVar[Mapping[str, Direction]] = {
        "accuracy": "higher",
        "macro_f1": "higher",
        "weighted_f1": "higher",
        "log_loss": "lower",
    }
    held_out_metric = "accuracy"
    held_out_extra = ("macro_f1",)  # what imbalanced classes are tuned on: accuracy rewards the largest
    default_gate = ("accuracy", 0.0)  # the bound is the majority class's share (default_bound)

    def check_label(self, label: LabelSpec) -> None:
        if label.positive is not None or label.negative is not None:
            raise ValueError(
                "data.label.task=multiclass takes no data.label.positive/negative (a binary label's two "
                "classes): remove them, or make the task binary"
            )
        if label.classes is not None and len(set(label.classes)) < 2:
            raise ValueError("data.label.classes must list at least two distinct classes")

    def label_value(self, label: LabelSpec, raw: Column) -> Column:
        return normalized(label, raw)

    def label_problem(self, label: LabelSpec, raw: Column) -> Column:
        from pyspark.sql import functions as F

        missing = raw.isNull() | (F.trim(raw.cast("string")) == "")
        problem = F.when(missing, F.lit(f"label '{label.column}' is missing"))
        if label.classes is not None:
            listed = list(label.classes)
            problem = problem.when(
                ~normalized(label, raw).isin(listed),
                F.concat(
                    F.lit(f"label '{label.column}': unknown value '"),
                    raw.cast("string"),
                    F.lit(
                        f"' (not one of data.label.classes: {listed[:20]}{' ...' if len(listed) > 20 else ''})"
                    ),
                ),
            )
        return problem

    def fit(self, label: LabelSpec, labels: DataFrame, column: str) -> Target:
        counts = {
            str(r[0]): int(r[1]) for r in labels.groupBy(column).count().limit(MAX_CLASSES + 1).collect()
        }
        if len(counts) > MAX_CLASSES:
            raise ValueError(
                f"label '{label.column}' has more than {MAX_CLASSES} distinct values: set "
                f"data.label.task=regression for a numeric target, or list data.label.classes"
            )
        classes = list(label.classes) if label.classes is not None else class_order(list(counts))
        if len(classes) < 2:
            raise ValueError(
                f"label '{label.column}' has a single value in the training rows ({classes}); "
                f"a classifier needs at least two classes"
            )
        return Target(self.name, tuple(classes), counts=tuple(counts.get(c, 0) for c in classes))

    def encode(self, target: Target, value: Column) -> Column:
        from pyspark.sql import functions as F

        lookup = F.create_map(*[x for i, c in enumerate(target.classes) for x in (F.lit(c), F.lit(float(i)))])
        return F.try_element_at(lookup, value).cast("float")

    def default_bound(self, target: Target) -> float:
        """Always predicting the most frequent training class scores its share of the rows."""
        return max(target.counts) / sum(target.counts) if sum(target.counts) else 0.0

    def output_dim(self, target: Target) -> int:
        return len(target.classes)

    def loss(self, target: Target, class_weights=None, kind=None):
        from sparkml_dist.tasks.losses import MulticlassLoss  # torch: not while a config is read

        return MulticlassLoss(class_weights)

    def held_out_sums(self, target: Target, outputs, packed):
        import torch
        import torch.nn.functional as F

        label, weight = packed[:, 0].long(), packed[:, 1]
        loss = F.cross_entropy(outputs, label, reduction="none")
        correct = (outputs.argmax(dim=1) == label).float()
        return torch.stack([(loss * weight).sum(), (correct * weight).sum(), weight.sum()])

    def held_out_bins(self, target: Target, outputs, packed):
        """The weighted confusion matrix (true class x predicted class, flattened): summed over
        every rank's shard it gives all validation rows' macro F1."""
        import torch

        k = len(target.classes)
        cells = torch.zeros(k * k, dtype=torch.float64, device=outputs.device)
        if outputs.numel():
            label, weight = packed[:, 0].long(), packed[:, 1].double()
            cells.index_add_(0, label * k + outputs.argmax(dim=1), weight)
        return cells

    def extra_from_bins(self, target: Target, bins) -> dict[str, float]:
        from sparkml_dist.tasks.metrics import class_table, macro_f1  # numpy: not while a config is read

        k = len(target.classes)
        matrix = bins.detach().cpu().double().numpy().reshape(k, k)
        return {"macro_f1": macro_f1(class_table(matrix, target.classes))}

    def predict(self, target: Target, outputs: np.ndarray) -> dict[str, np.ndarray]:
        import numpy as np

        # float32 throughout (the per-class probabilities cross Arrow into the JVM as float32: half
        # the bytes); reductions over the classes run on the transposed [classes, rows] array, along
        # long contiguous rows (3x faster than across 10-wide rows); the best class's probability is
        # 1 / the sum, its shifted exp being 1
        logits = np.asarray(outputs, dtype=np.float32)
        by_class = np.ascontiguousarray(logits.T)
        z = np.exp(by_class - by_class.max(axis=0))
        total = z.sum(axis=0)
        z /= total
        return {
            PREDICTION: logits.argmax(axis=1).astype(np.int32),
            PROBABILITY: 1.0 / total.astype(np.float64),
            PROBABILITIES: z.T,
        }

    def output_columns(self, target: Target) -> list[tuple[str, str]]:
        return [(PREDICTION, "integer"), (PROBABILITY, "double"), (PROBABILITIES, "array<float>")]

    def report(self, scored: DataFrame, target: Target, label: str, weight: str | None) -> TaskReport:
        from sparkml_dist.tasks.reports.multiclass import (
            multiclass_report,  # pyspark: not while a config is read
        )

        return multiclass_report(scored, target, label, weight)


MULTICLASS = register_task(Multiclass())
