"""The one logging path of the train stage: whatever the method, its outcome becomes the same
MLflow entries (per-rank stats, launches, the model with its feature pipeline, the loss plot)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from sparkml_dist import storage
from sparkml_dist.tracking import plots
from sparkml_dist.tracking.client import RankTracker, RunHandle
from sparkml_dist.tracking.cost import RunCost
from sparkml_dist.tracking.models import log_model
from sparkml_dist.train.records import TrainOutcome


def log_outcome(run: RunHandle, outcome: TrainOutcome, plots_dir: str) -> str:
    """Log what the epoch records do not already hold; return the model's `runs:/` URI."""
    last_epoch = outcome.records[-1].epoch if outcome.records else 0
    metrics = {"train_attempts": float(outcome.attempts)}
    for rank in outcome.ranks:
        metrics.update(rank.metrics())
    cost = RunCost.of_outcome(outcome)
    metrics.update(cost.metrics())
    RankTracker(run, 0).log(metrics, last_epoch)
    client = run.client()
    client.set_tag(run.run_id, "sparkml_dist.method", outcome.method)
    if cost.measured:  # how the joules were had: never an estimate called a measurement
        client.set_tag(run.run_id, "energy.method", cost.method)
    if len(set(outcome.world_sizes)) > 1:  # an elastic run changed its world size: say so
        client.set_tag(
            run.run_id,
            "sparkml_dist.elastic",
            "ranks per attempt: " + " -> ".join(str(n) for n in outcome.world_sizes),
        )
    target = outcome.model.target
    client.set_tag(run.run_id, "sparkml_dist.task", target.task)
    if target.classes:
        client.set_tag(run.run_id, "sparkml_dist.classes", ", ".join(target.classes)[:5000])
    model_uri = log_model(run, outcome.model)
    if outcome.records:
        log_plot(
            run,
            lambda path: plots.loss_curves(outcome.records, path, outcome.unit),
            storage.join(plots_dir, "loss_curves.png"),
        )
    if cost.steps_ms:
        log_plot(
            run,
            lambda path: plots.step_breakdown(outcome.records, path),
            storage.join(plots_dir, "step_breakdown.png"),
        )
    if any(record.system for record in outcome.records):
        log_plot(
            run,
            lambda path: plots.system_metrics(outcome.records, path),
            storage.join(plots_dir, "system_metrics.png"),
        )
    return model_uri


def log_plot(run: RunHandle, render: Callable[[Path], Path], uri: str) -> str:
    """Render a PNG to `uri` (a path or URI) and attach it to the run under plots/."""
    local = storage.local_path(uri)
    if local is not None:
        run.client().log_artifact(run.run_id, str(render(local)), "plots")
        return uri
    with tempfile.TemporaryDirectory(prefix="sparkml_dist_plot_") as tmp:
        png = render(Path(tmp) / storage.name_of(uri))
        storage.upload(png, uri)
        run.client().log_artifact(run.run_id, str(png), "plots")
    return uri
