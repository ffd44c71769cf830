"""Stage 2: train with the method `train.strategy` names, then log its outcome the same way for
every method: epoch records (live, through `EpochLogger`), per-rank stats, the model with its
feature pipeline, the loss plot, and `train.json` for the stages after it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pyspark.sql import SparkSession

from sparkml_dist.config.schema import JobConfig
from sparkml_dist.data.dataset import PreprocessResult, split_frame
from sparkml_dist.data.features import ScoringPipeline
from sparkml_dist.data.ingest import LABEL, ROW_ID, WEIGHT, ingest
from sparkml_dist.data.labels import encode_labels
from sparkml_dist.inference.bundle import ModelBundle
from sparkml_dist.inference.udf import score_features
from sparkml_dist.methods.base import TrainRequest, get_method
from sparkml_dist.models.custom import ship_factory
from sparkml_dist.models.kinds import MODEL_KINDS
from sparkml_dist.stages.records import TrainRecord
from sparkml_dist.storage.paths import OutputPaths
from sparkml_dist.tasks.reports.binary import best_f1_threshold
from sparkml_dist.tracking.client import EpochLogger, RankTracker, RunHandle, tracked_run
from sparkml_dist.tracking.outcome import log_outcome
from sparkml_dist.train.records import EpochRecord, TrainOutcome

if TYPE_CHECKING:
    from sparkml_dist.train.job import EpochSink

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    run_id: str
    model_uri: str
    outcome: TrainOutcome

    @property
    def records(self) -> tuple[EpochRecord, ...]:
        return self.outcome.records

    @property
    def ranks_in_step(self) -> bool:
        return self.outcome.ranks_in_step


def train(
    spark: SparkSession,
    cfg: JobConfig,
    prep: PreprocessResult | None,
    run: RunHandle,
    method_name: str | None = None,
    sink: EpochSink | None = None,
    label: str = "",
) -> TrainResult:
    """Train on `prep` (the preprocess stage's output) with `train.strategy`'s method (or
    `method_name`'s) and log the result under `run`; each epoch's record goes to `sink` (default:
    the run's metrics); `label` prefixes the run's progress lines (a tune trial's "trial 3")."""
    paths = OutputPaths.of(cfg)
    method = get_method(method_name or cfg.train.strategy)
    if MODEL_KINDS.get(cfg.model.kind).user_code and cfg.model.factory:
        ship_factory(spark, cfg.model.factory)
    outcome = method.run(
        TrainRequest(
            spark, cfg, prep, paths.checkpoints(run.run_id), sink=sink or EpochLogger(run), label=label
        )
    )
    if cfg.evaluate.threshold == "f1":
        outcome = with_f1_threshold(spark, cfg, outcome, run, label)
    return record_outcome(run, cfg, outcome)


def with_f1_threshold(
    spark: SparkSession, cfg: JobConfig, outcome: TrainOutcome, run: RunHandle, label: str = ""
) -> TrainOutcome:
    """`evaluate.threshold: f1`: the probability threshold with the best F1 on the validation
    split (the training rows the model did not learn from), scored through the model's own
    feature pipeline; it goes into the model and decides every later prediction."""

    model = outcome.model
    bundle = ModelBundle(model.spec, model.weights, model.feature_pipeline, target=model.target)
    with ingest(spark, cfg.data.train_path, cfg.data, key="data.train_path") as rows:
        _, val = split_frame(
            encode_labels(rows.accepted, model.target, rows.data).known,
            cfg.data.validation_fraction,
            cfg.data.split_seed,
        )
        weighted = rows.data.weight_column is not None
        extra = (WEIGHT,) if weighted else ()
        features, layout = ScoringPipeline.load(bundle.spark_pipeline).frame(
            val, with_label=True, extra=extra
        )
        scored = score_features(
            features, bundle, passthrough=(ROW_ID, LABEL, *extra), layout=layout, device=cfg.score.device
        )
        threshold, f1 = best_f1_threshold(scored, LABEL, WEIGHT if weighted else None)
    log.info(
        "%sevaluate.threshold=f1: %.3f (validation F1 %.4f)", f"{label}: " if label else "", threshold, f1
    )
    RankTracker(run, 0).log({"threshold": threshold, "val_best_f1": f1}, outcome.last.epoch)
    target = replace(model.target, threshold=threshold)
    return replace(outcome, model=replace(model, target=target))


def record_outcome(run: RunHandle, cfg: JobConfig, outcome: TrainOutcome) -> TrainResult:
    """Log `outcome` under `run` and leave `train.json` for the evaluate and register stages."""
    paths = OutputPaths.of(cfg)
    model_uri = log_outcome(run, outcome, paths.plots)
    if not outcome.ranks_in_step:
        log.warning(
            "ranks ended with different parameters: %s",
            [r.param_checksum[:2] for r in outcome.ranks if r.param_checksum],
        )
    TrainRecord(run.run_id, model_uri, run.tracking_uri, outcome.method, outcome.records).save(
        paths.train_record
    )
    return TrainResult(run.run_id, model_uri, outcome)


def train_preprocessed(spark: SparkSession, cfg: JobConfig) -> TrainResult:
    """The `train` job on its own: the preprocess stage's output under `output.root`, one MLflow run."""
    prep = PreprocessResult.load(OutputPaths.of(cfg).preprocess)
    with tracked_run(cfg.tracking, "train", cfg.flat_params()) as run:
        return train(spark, cfg, prep, run)
