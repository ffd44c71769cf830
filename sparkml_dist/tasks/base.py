"""What a supervised task is: how its label is read, checked and encoded, the network's output
width and loss, how outputs become predictions, and which metrics judge it (and in which
direction). One registry entry per task (`data.label.task`): binary, multiclass, regression.

A task object is light: Spark and torch are imported where its methods run, so reading a config
(which resolves the task and checks the gate's metric) imports neither.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from sparkml_dist.registry import Registry

if TYPE_CHECKING:
    import numpy as np
    from pyspark.sql import Column, DataFrame

    from sparkml_dist.config.schema import LabelSpec
    from sparkml_dist.tasks.losses import TargetLoss

# prediction columns (binary: probability, prediction; multiclass: prediction, probability,
# probabilities; regression: prediction)
PROBABILITY, PREDICTION, PROBABILITIES = "probability", "prediction", "probabilities"

Direction = Literal["higher", "lower"]
EvalRows = Literal["val", "test"]


@dataclass(frozen=True)
class Evaluation:
    """Loss and the task's held-out metric (accuracy, rmse) of a model after an epoch (or a
    federated round), on `rows`: the validation split, or the test rows."""

    rows: EvalRows
    loss: float
    metric: str
    value: float
    # the task's other per-epoch metrics (`Task.held_out_extra`), e.g. binary's roc_auc
    extra: dict[str, float] = field(default_factory=dict, compare=True, hash=False)

    def metrics(self) -> dict[str, float]:
        """`<rows>_loss`, `<rows>_<metric>` and each extra metric, as the epoch records log them."""
        return {
            f"{self.rows}_loss": self.loss,
            f"{self.rows}_{self.metric}": self.value,
            **{f"{self.rows}_{name}": value for name, value in self.extra.items()},
        }


@dataclass(frozen=True)
class Target:
    """The label as fitted on the training rows. It travels in the manifest, to the ranks and
    inside the logged model, so every stage reads predictions the way training meant them."""

    task: str
    classes: tuple[str, ...] = ()  # binary: (negative, positive); multiclass: every class, in index order
    mean: float = 0.0  # regression: the label's mean and deviation on the training split
    std: float = 1.0
    threshold: float = 0.5  # binary: probability at or above which the prediction is positive
    counts: tuple[int, ...] = ()  # classification: training rows per class (class weights)

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"classes": list(self.classes), "counts": list(self.counts)}

    @staticmethod
    def from_json(raw: Mapping[str, Any] | None) -> Target:
        if not raw:  # a model or dataset written before targets were recorded
            return UNRECORDED_TARGET
        return Target(
            raw["task"],
            tuple(str(c) for c in raw.get("classes", ())),
            float(raw.get("mean", 0.0)),
            float(raw.get("std", 1.0)),
            float(raw.get("threshold", 0.5)),
            tuple(int(c) for c in raw.get("counts", ())),
        )

    @property
    def kind(self) -> Task:
        return get_task(self.task)

    def balanced_weights(self) -> tuple[float, ...]:
        """Per class: rows / (classes x the class's rows), sklearn's "balanced"; a class with no
        training rows weighs 0."""
        total, k = sum(self.counts), len(self.counts)
        return tuple(total / (k * n) if n else 0.0 for n in self.counts)


# What a model's outputs mean where nothing recorded it: models and datasets written before
# targets were recorded were all binary. The one default every record and reader falls back to.
UNRECORDED_TARGET = Target("binary")


@dataclass
class TaskReport:
    """The test metrics of one model on one set of rows, and what to draw and attach for them."""

    metrics: dict[str, float]
    plots: list[tuple[str, Callable[[Any], Any]]] = field(default_factory=list)  # (file name, render(path))
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # artifact name -> rows
    target: Target | None = None  # the model's: which task, hence which metrics and directions


class Task(ABC):
    name: str
    metrics: ClassVar[Mapping[str, Direction]]  # every metric `report` returns, and which way is better
    held_out_metric: str  # the metric the ranks compute on the validation split each epoch
    held_out_extra: tuple[
        str, ...
    ] = ()  # more metrics each epoch, from `held_out_bins` (tune.metric can name them)
    default_gate: tuple[str, float]  # a metric and a bound that a constant prediction cannot pass
    classifier: bool = True  # predicts classes (cross-entropy, class weights, a predicted_label column)
    thresholded: bool = False  # decides by a probability threshold (evaluate.threshold)
    # a typed source's true/false label gives it its classes once read (no positive/negative to name)
    boolean_classes: bool = False

    # ---- config -------------------------------------------------------------------------------
    def check_label(self, label: LabelSpec) -> None:  # noqa: B027 -- a hook: most tasks take any label
        """Raise ValueError naming the keys when the label settings cannot work for this task."""

    # ---- Spark: ingest and preprocess ---------------------------------------------------------
    @abstractmethod
    def label_value(self, label: LabelSpec, raw: Column) -> Column:
        """The raw label as this task reads it (a normalised string, or a double)."""

    @abstractmethod
    def label_problem(self, label: LabelSpec, raw: Column) -> Column:
        """A reject reason for a row whose label cannot be used (null where it can)."""

    @abstractmethod
    def fit(self, label: LabelSpec, labels: DataFrame, column: str) -> Target:
        """The target from the training rows' label values (`column` of `labels`)."""

    @abstractmethod
    def encode(self, target: Target, value: Column) -> Column:
        """The label as the network learns it (a float; null where the target does not know it)."""

    # ---- torch ----------------------------------------------------------------------------------
    @abstractmethod
    def output_dim(self, target: Target) -> int: ...

    @abstractmethod
    def loss(
        self, target: Target, class_weights: tuple[float, ...] | None = None, kind: str | None = None
    ) -> TargetLoss: ...

    @abstractmethod
    def held_out_sums(self, target: Target, outputs: Any, packed: Any) -> Any:
        """For one validation batch (network outputs, packed [label, weight] targets): the weighted
        loss sum, the weighted sum behind `held_out_metric`, and the weight sum, as a tensor of
        three on the outputs' device (so that no batch waits for a GPU; three floats also do)."""

    def held_out_bins(self, target: Target, outputs: Any, packed: Any) -> Any:
        """For one validation batch: a float64 tensor of additive counts (summed over batches and
        ranks) behind `held_out_extra`, on the outputs' device; None for a task with no extra metrics."""
        return None

    def extra_from_bins(self, target: Target, bins: Any) -> dict[str, float]:
        """`held_out_extra`'s values from the summed `held_out_bins`."""
        return {}

    # ---- numpy: predictions ---------------------------------------------------------------------
    @abstractmethod
    def predict(self, target: Target, outputs: np.ndarray) -> dict[str, np.ndarray]:
        """The network's outputs for a batch of rows -> the prediction columns (see `output_columns`)."""

    @abstractmethod
    def output_columns(self, target: Target) -> list[tuple[str, str]]:
        """(name, Spark SQL type) of the prediction columns, in order."""

    # ---- Spark: reports -------------------------------------------------------------------------
    @abstractmethod
    def report(self, scored: DataFrame, target: Target, label: str, weight: str | None) -> TaskReport:
        """Metrics as Spark aggregations over scored rows (`label` encoded, the prediction columns)."""

    def held_out(
        self, target: Target, loss_sum: float, metric_sum: float, weight_sum: float, rows: EvalRows = "val"
    ) -> Evaluation:
        """The per-epoch result on held-out `rows` from the summed (weighted) loss and metric."""
        n = max(weight_sum, 1e-12)
        return Evaluation(rows, loss=loss_sum / n, metric=self.held_out_metric, value=metric_sum / n)

    def better(self, metric: str, a: float, b: float) -> bool:
        """Is `a` better than `b` on `metric`?"""
        return a < b if self.metrics[metric] == "lower" else a > b

    def default_bound(self, target: Target) -> float:
        """The bound of `default_gate`: what a constant prediction scores (it must do better)."""
        return self.default_gate[1]


TASKS: Registry[Task] = Registry("data.label.task", builtin_modules=("sparkml_dist.tasks.builtin",))


def get_task(name: str) -> Task:
    return TASKS.get(name)


def register_task(task: Task, *, replace: bool = False) -> Task:
    return TASKS.register(task.name, task, replace=replace)


def boolean_label_task() -> str:
    """The task a typed source's true/false label defaults to: the first registered that takes its
    classes from such a label (`Task.boolean_classes`; built in: binary)."""
    return next(name for name in TASKS.names() if TASKS.get(name).boolean_classes)


def resolve_task(label: LabelSpec, label_type: str | None) -> str:
    """`data.label.task`, or the default: binary when positive/negative are given; else
    regression for a double label and multiclass for any other."""
    if label.task is not None:
        return label.task
    if label.positive is not None and label.negative is not None:
        return "binary"
    return "regression" if label_type in ("double", "float") else "multiclass"
