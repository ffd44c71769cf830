"""Supervised tasks, one registry entry per `data.label.task`: binary, multiclass, regression.

A task owns everything that depends on what the label is: reading and checking it, the fitted
`Target` (classes, or the label's scale), the network's output width and loss, predictions, and
the metrics that judge it with their directions."""

from sparkml_dist.tasks.base import (
    TASKS,
    Evaluation,
    Target,
    Task,
    TaskReport,
    get_task,
    register_task,
    resolve_task,
)

__all__ = ["TASKS", "Evaluation", "Target", "Task", "TaskReport", "get_task", "register_task", "resolve_task"]
