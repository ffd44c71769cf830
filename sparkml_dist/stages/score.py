"""Stage 5: batch scoring of raw rows with the champion; predictions written atomically."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pyspark import Accumulator
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkml_dist import storage
from sparkml_dist.config.schema import DataConfig, JobConfig
from sparkml_dist.data.features import ScoringPipeline
from sparkml_dist.data.ingest import ROW_ID, IngestResult, ingest
from sparkml_dist.data.labels import model_target
from sparkml_dist.data.sources import schema_of, with_types_of
from sparkml_dist.errors import DataError
from sparkml_dist.inference.bundle import ModelBundle
from sparkml_dist.inference.scoring import check_schema, load_pipeline
from sparkml_dist.inference.udf import PREDICTION, score_features
from sparkml_dist.observe.spark_cpu import executor_cpu_seconds, job_ids
from sparkml_dist.spark.session import is_connect, job_group
from sparkml_dist.storage.hadoop import atomic_dir
from sparkml_dist.storage.paths import OutputPaths
from sparkml_dist.tracking.client import resolve_tracking_uri
from sparkml_dist.tracking.models import load_bundle

PREDICTED_LABEL = "predicted_label"
PER_MILLION_FROM = 100_000  # scored rows from which the energy is quoted per million rows


@dataclass
class ScoreResult:
    model_uri: str
    path: str
    input_rows: int
    scored_rows: int
    rejected_rows: int
    cpu_seconds: float = math.nan  # executors' task CPU time, JVM and Python workers (nan: not readable)
    joules: float = math.nan  # cpu_seconds x observe.cpu_watts_per_core: an estimate

    @property
    def joules_per_million_rows(self) -> float:
        return self.joules / self.scored_rows * 1e6 if self.scored_rows else math.nan

    def energy_text(self) -> str:
        """The estimate as a person reads it ("" when the CPU time was not readable): per million
        rows for a large run, the whole run's joules for a small one, whose per-row figure would
        be mostly the job's fixed cost scaled up."""
        if math.isnan(self.joules) or not self.scored_rows:
            return ""
        amount = (
            f"{self.joules_per_million_rows:,.1f} J per million rows"
            if self.scored_rows >= PER_MILLION_FROM
            else f"{self.joules:,.1f} J for {self.scored_rows:,} rows"
        )
        return f"{amount} (estimated from the executors' CPU time)"


def score(
    spark: SparkSession,
    cfg: JobConfig,
    model_uri: str | None = None,
    input_path: str | None = None,
    output_path: str | None = None,
) -> ScoreResult:
    uri = model_uri or f"models:/{cfg.tracking.registered_model}@champion"
    bundle = load_bundle(
        uri, resolve_tracking_uri(cfg.tracking), spark=spark, shared_dir=OutputPaths.of(cfg).models
    )
    data = with_types_of(
        cfg.data, bundle.training_schema or {}
    )  # a typed source read as the model was trained
    key = "--input" if input_path else "data.score_path" if cfg.data.score_path else "data.test_path"
    with ingest(
        spark,
        input_path or cfg.data.score_path or cfg.data.test_path,
        data,
        require_label=False,
        key=key,
        pack_wide=True,  # the scoring frame reads a wide run of numbers from one array (data/packed.py)
    ) as raw:
        check_schema(schema_of(raw.data), bundle)
        return _score_rows(spark, cfg, uri, bundle, raw, output_path)


def _score_rows(
    spark: SparkSession,
    cfg: JobConfig,
    uri: str,
    bundle: ModelBundle,
    raw: IngestResult,
    output_path: str | None,
) -> ScoreResult:
    # a Spark Connect client has neither accumulators nor the status store: its CPU is not measured
    cpu_seconds = None if is_connect(spark) else spark.sparkContext.accumulator(0.0)
    scored = scored_rows(bundle, load_pipeline(bundle), raw.accepted, raw.data, cpu_seconds, cfg.score.device)
    out = storage.absolute(output_path) if output_path else OutputPaths.of(cfg).predictions
    group = "sparkml_dist:score"
    earlier = job_ids(spark, group) if cpu_seconds is not None else set()  # an earlier scoring's is not ours
    with atomic_dir(spark, out) as staging, job_group(spark, group, f"score: {uri} -> {out}"):
        scored.write.mode("overwrite").parquet(f"{staging}/scored")
        raw.rejects.coalesce(1).write.mode("overwrite").parquet(f"{staging}/rejects")
        written = spark.read.parquet(f"{staging}/scored").count()
        if written + raw.rejected_rows != raw.input_rows:
            raise DataError(
                f"scoring lost rows: input {raw.input_rows} != scored {written} + rejected {raw.rejected_rows}"
            )
    cpu = (
        cpu_seconds.value + executor_cpu_seconds(spark, job_ids(spark, group) - earlier)
        if cpu_seconds is not None
        else math.nan
    )
    return ScoreResult(
        uri,
        storage.join(out, "scored"),
        raw.input_rows,
        written,
        raw.rejected_rows,
        cpu,
        cpu * cfg.observe.cpu_watts_per_core,
    )


def scored_rows(
    bundle: ModelBundle,
    pipeline: ScoringPipeline,
    accepted: DataFrame,
    data: DataConfig,
    cpu_seconds: Accumulator | None = None,
    device: str = "auto",
) -> DataFrame:
    """Accepted raw rows -> (row_id, the id columns, the task's prediction columns, and for a
    classifier the predicted class as the label's own value). Batch and streaming scoring alike."""
    ids = tuple(data.names_with_role("id"))  # pass through: predictions join back to the input on them
    features, layout = pipeline.frame(accepted, with_label=False, extra=ids)
    scored = score_features(
        features, bundle, layout=layout, passthrough=(ROW_ID, *ids), cpu_seconds=cpu_seconds, device=device
    )
    classes = model_target(bundle.target, data).classes
    if classes:
        scored = scored.withColumn(
            PREDICTED_LABEL, F.element_at(F.array(*[F.lit(c) for c in classes]), F.col(PREDICTION) + 1)
        )
    return scored
