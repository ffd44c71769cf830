"""The promotion gate: whether a trained model becomes the registered champion (each task's metrics live with the task, `tasks/reports/`)."""
