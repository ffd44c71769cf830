"""Stage 3: distributed validation of a logged model on the official test rows, from raw columns."""

from __future__ import annotations

import logging
import time

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from sparkml_dist import storage
from sparkml_dist.config.schema import JobConfig
from sparkml_dist.data.ingest import LABEL, ROW_ID, WEIGHT, IngestResult, ingest
from sparkml_dist.data.labels import encode_labels, model_target
from sparkml_dist.data.sources import common_reasons, describe_reasons, with_types_of
from sparkml_dist.errors import SparkMLDistError
from sparkml_dist.inference.scoring import load_pipeline
from sparkml_dist.inference.udf import score_features
from sparkml_dist.stages.records import EvaluateRecord, TrainRecord
from sparkml_dist.storage.hadoop import atomic_dir
from sparkml_dist.storage.paths import OutputPaths
from sparkml_dist.tasks.base import Target, TaskReport
from sparkml_dist.tracking.client import RunHandle, resolve_tracking_uri
from sparkml_dist.tracking.models import load_bundle
from sparkml_dist.tracking.outcome import log_plot

log = logging.getLogger(__name__)


def evaluate(
    spark: SparkSession, cfg: JobConfig, model_uri: str, tracking_uri: str, test_rows: DataFrame | None = None
) -> TaskReport:
    """Score `test_rows` (typed raw columns + label, as ingest makes them; default: the config's
    test file) with the model's own feature pipeline, target and weights, and aggregate the task's
    metrics in Spark. Rows whose label the model does not know (a class it was not trained on)
    are not scored; `metrics["unknown_label_rows"]` counts them. Reading the config's test file,
    such rows are rejects instead, with every other unusable row: `metrics["rejected_rows"]`
    counts them and `<output.root>/evaluate/rejects` holds them with their reasons."""
    bundle = load_bundle(model_uri, tracking_uri, spark=spark, shared_dir=OutputPaths.of(cfg).models)
    if test_rows is None:
        data = with_types_of(cfg.data, bundle.training_schema or {})
        with ingest(
            spark,
            cfg.data.test_path,
            data,
            key="data.test_path",
            target=model_target(bundle.target, data),
            pack_wide=True,  # the features are read from one array (data/packed.py)
        ) as test_input:
            report = evaluate(spark, cfg, model_uri, tracking_uri, test_input.accepted)
            _quarantine(spark, cfg, test_input)
            if test_input.rejected_rows:
                report.metrics["rejected_rows"] = float(test_input.rejected_rows)
            return report
    target = model_target(bundle.target, cfg.data)
    labelled = encode_labels(test_rows, target, cfg.data)
    weighted = WEIGHT in test_rows.columns
    extra = (WEIGHT,) if weighted else ()
    features, layout = load_pipeline(bundle).frame(labelled.known, with_label=True, extra=extra)
    scored = score_features(
        features, bundle, passthrough=(ROW_ID, LABEL, *extra), layout=layout, device=cfg.score.device
    )
    report = _report_once_scored(scored, target, WEIGHT if weighted else None)
    report.target = target
    if labelled.unknown_rows:
        report.metrics["unknown_label_rows"] = float(labelled.unknown_rows)
    return report


def _quarantine(spark: SparkSession, cfg: JobConfig, test_input: IngestResult) -> None:
    """The test rows that could not be evaluated, with their reasons, where a person can look
    (none: an earlier evaluation's are removed, so what is there is this one's)."""
    out = OutputPaths.of(cfg).under("evaluate", "rejects")
    if not test_input.rejected_rows:
        storage.delete(out)
        return
    with atomic_dir(spark, out) as staging:
        test_input.rejects.coalesce(1).write.parquet(staging)
    log.warning(
        "evaluate: %d of %d test rows rejected, not scored (%s); they are in %s",
        test_input.rejected_rows,
        test_input.input_rows,
        describe_reasons(common_reasons(test_input.rejects)),
        out,
    )


def _report_once_scored(scored: DataFrame, target: Target, weight: str | None) -> TaskReport:
    """The task's report, which may aggregate the scored rows more than once (the metrics, then a
    histogram or a plot's sample): the rows are kept after the first pass, so the model scores
    each test row once. Only the few scored columns are kept, not the raw ones."""
    scored = scored.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        return target.kind.report(scored, target, LABEL, weight)
    finally:
        scored.unpersist()


def log_report(run: RunHandle, report: TaskReport, cfg: JobConfig, step: int = 0) -> None:
    """Test metrics (`test_<name>`) at `step` (the model's last epoch), the task's plots and tables."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    run.client().log_batch(
        run.run_id, metrics=[Metric(f"test_{k}", float(v), now, step) for k, v in report.metrics.items()]
    )
    plot_dir = OutputPaths.of(cfg).plots
    for name, render in report.plots:
        log_plot(run, render, storage.join(plot_dir, name))
    for name, rows in report.tables.items():
        run.client().log_dict(run.run_id, rows, f"metrics/{name}")


def evaluate_trained(spark: SparkSession, cfg: JobConfig, model_uri: str | None = None) -> EvaluateRecord:
    """The `evaluate` job: the last trained model (or `model_uri`) on the test rows; the report goes
    to the training run when the model is that run's, and `evaluate.json` to the register stage."""
    paths = OutputPaths.of(cfg)
    trained = TrainRecord.load(paths.train_record)
    uri = model_uri or (trained.model_uri if trained else None)
    if not uri:
        raise SparkMLDistError(
            f"evaluate: no --model-uri given and no train stage output under {paths.root}; "
            f"run the train stage first"
        )
    tracking_uri = resolve_tracking_uri(cfg.tracking)
    report = evaluate(spark, cfg, uri, tracking_uri)
    if trained is not None and uri == trained.model_uri:
        log_report(RunHandle.existing(tracking_uri, trained.run_id), report, cfg, trained.last_epoch)
    result = EvaluateRecord(uri, report.metrics, report.target)
    result.save(paths.evaluate_record)
    return result
