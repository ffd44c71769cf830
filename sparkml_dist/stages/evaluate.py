"""Stage 3: distributed validation of a logged model on the official test rows, from raw columns."""

from __future__ import annotations

import time

from pyspark.ml import PipelineModel
from pyspark.sql import DataFrame, SparkSession

from sparkml_dist import storage
from sparkml_dist.config.schema import JobConfig
from sparkml_dist.data.features import scoring_frame
from sparkml_dist.data.ingest import LABEL, ROW_ID, ingest
from sparkml_dist.errors import SparkMLDistError
from sparkml_dist.inference.udf import score_features
from sparkml_dist.stages.records import EvaluateRecord, TrainRecord
from sparkml_dist.storage.paths import OutputPaths
from sparkml_dist.tracking import plots
from sparkml_dist.tracking.client import RunHandle, resolve_tracking_uri
from sparkml_dist.tracking.models import load_bundle
from sparkml_dist.tracking.outcome import log_plot
from sparkml_dist.validation.metrics import BinaryReport, binary_report


def evaluate(spark: SparkSession, cfg: JobConfig, model_uri: str, tracking_uri: str,
             test_rows: DataFrame | None = None) -> BinaryReport:
    """Score `test_rows` (typed raw columns + label; default: the config's test file) with the
    model's own feature pipeline and weights, and aggregate the metrics in Spark."""
    bundle = load_bundle(model_uri, tracking_uri)
    if test_rows is None:
        with ingest(spark, cfg.data.test_path, cfg.data) as test_input:
            return evaluate(spark, cfg, model_uri, tracking_uri, test_input.accepted)
    pipeline = PipelineModel.load(storage.spark_path(bundle.feature_pipeline_path))
    features, layout = scoring_frame(pipeline, test_rows, with_label=True)
    scored = score_features(features, bundle, passthrough=(ROW_ID, LABEL), layout=layout)
    return binary_report(scored)


def log_report(run: RunHandle, report: BinaryReport, cfg: JobConfig, step: int = 0) -> None:
    """Test metrics (`test_<name>`) at `step` (the model's last epoch) and the ROC and confusion plots."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    run.client().log_batch(run.run_id, metrics=[Metric(f"test_{k}", float(v), now, step)
                                                for k, v in report.metrics.items()])
    label, plot_dir = cfg.data.label, OutputPaths.of(cfg).plots
    log_plot(run, lambda path: plots.roc(*report.roc, report.metrics["roc_auc"], path), storage.join(plot_dir, "roc.png"))
    log_plot(run, lambda path: plots.confusion(report.confusion, (label.negative, label.positive), path),
             storage.join(plot_dir, "confusion_matrix.png"))


def evaluate_trained(spark: SparkSession, cfg: JobConfig, model_uri: str | None = None) -> EvaluateRecord:
    """The `evaluate` job: the last trained model (or `model_uri`) on the test rows; the report goes
    to the training run when the model is that run's, and `evaluate.json` to the register stage."""
    paths = OutputPaths.of(cfg)
    trained = TrainRecord.load(paths.train_record)
    uri = model_uri or (trained.model_uri if trained else None)
    if not uri:
        raise SparkMLDistError(f"evaluate: no --model-uri given and no train stage output under {paths.root}; "
                               f"run the train stage first")
    tracking_uri = resolve_tracking_uri(cfg.tracking)
    report = evaluate(spark, cfg, uri, tracking_uri)
    if trained is not None and uri == trained.model_uri:
        log_report(RunHandle.existing(tracking_uri, trained.run_id), report, cfg, trained.last_epoch)
    result = EvaluateRecord(uri, report.metrics)
    result.save(paths.evaluate_record)
    return result
