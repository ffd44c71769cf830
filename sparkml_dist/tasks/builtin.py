"""The built-in tasks, imported (and so registered) on the first `data.label.task` lookup."""

from sparkml_dist.tasks import binary, multiclass, regression  # noqa: F401
