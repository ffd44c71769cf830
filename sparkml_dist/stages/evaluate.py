"""Stage 3: distributed validation of a logged model on the official test rows, from raw columns."""

from __future__ import annotations

from pyspark.ml import PipelineModel
from pyspark.sql import DataFrame, SparkSession

from sparkml_dist.config.schema import JobConfig
from sparkml_dist.data.features import scoring_frame
from sparkml_dist.data.ingest import LABEL, ROW_ID, ingest
from sparkml_dist.inference.udf import score_features
from sparkml_dist.tracking.models import load_bundle
from sparkml_dist.validation.metrics import BinaryReport, binary_report


def evaluate(spark: SparkSession, cfg: JobConfig, model_uri: str, tracking_uri: str,
             test_rows: DataFrame | None = None) -> BinaryReport:
    """Score `test_rows` (typed raw columns + label; default: the config's test file) with the
    model's own feature pipeline and weights, and aggregate the metrics in Spark."""
    bundle = load_bundle(model_uri, tracking_uri)
    if test_rows is None:
        with ingest(spark, cfg.data.test_path, cfg.data) as test_input:
            return evaluate(spark, cfg, model_uri, tracking_uri, test_input.accepted)
    features, layout = scoring_frame(PipelineModel.load(bundle.feature_pipeline_path), test_rows, with_label=True)
    scored = score_features(features, bundle, passthrough=(ROW_ID, LABEL), layout=layout)
    return binary_report(scored)
