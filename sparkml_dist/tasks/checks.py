"""What a config asks of its task, checked with the task's own knowledge (its label settings,
metrics and their directions, whether it is a classifier or thresholded): at load, and again
once a typed source's label type has decided the task (`data/labels.py::check_task`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkml_dist.tasks.base import TASKS

if TYPE_CHECKING:
    from sparkml_dist.config.schema import JobConfig

__all__ = ["task_problems"]


def task_problems(cfg: JobConfig, task_name: str) -> list[tuple[tuple[str, ...], str]]:
    """What cannot work for this task in this config, each with the key to change (checked at load,
    or once a typed source's label type is known)."""
    task = TASKS.get(task_name)
    problems: list[tuple[tuple[str, ...], str]] = []
    label = cfg.data.label
    # a typed source's boolean label names its own classes once read (data/sources.py::with_task)
    classes_when_read = (
        cfg.data.typed and task.boolean_classes and label.positive is None and label.negative is None
    )
    try:
        if not classes_when_read:
            task.check_label(label)
    except ValueError as exc:
        problems.append((("data", "label"), str(exc)))
    gate = cfg.tracking.gate
    metric = gate.metric or task.default_gate[0]
    if metric not in task.metrics:
        problems.append(
            (
                ("tracking", "gate", "metric"),
                f"{metric!r} is not a {task_name} metric; one of {', '.join(task.metrics)}",
            )
        )
    elif task.metrics[metric] == "lower" and gate.min_value is not None:
        problems.append(
            (
                ("tracking", "gate", "min_value"),
                f"{metric} is better lower: bound it with tracking.gate.max_value",
            )
        )
    elif task.metrics[metric] == "higher" and gate.max_value is not None:
        problems.append(
            (
                ("tracking", "gate", "max_value"),
                f"{metric} is better higher: bound it with tracking.gate.min_value",
            )
        )
    if cfg.evaluate.threshold != 0.5 and not task.thresholded:
        problems.append(
            (("evaluate", "threshold"), "a decision threshold applies to binary classification only")
        )
    if cfg.train.loss is not None and task.classifier:
        problems.append(
            (("train", "loss"), f"train.loss is for regression; a {task_name} classifier uses cross-entropy")
        )
    if cfg.train.class_weight != "none" and not task.classifier:
        problems.append((("train", "class_weight"), "class weights apply to classification only"))
    return problems
