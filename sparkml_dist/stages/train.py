"""Stage 2: N-rank barrier training on the preprocessed Parquet; logs the model to MLflow."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql import SparkSession

from sparkml_dist.config.schema import JobConfig
from sparkml_dist.data.dataset import Manifest
from sparkml_dist.data.layout import FeatureLayout
from sparkml_dist.errors import RankFailure, TrainingFailed
from sparkml_dist.launch import backend_for, run_barrier
from sparkml_dist.models.factory import model_spec
from sparkml_dist.stages.paths import OutputPaths
from sparkml_dist.stages.preprocess import PreprocessResult
from sparkml_dist.tracking import plots
from sparkml_dist.tracking.client import RankTracker, RunHandle
from sparkml_dist.tracking.models import log_model
from sparkml_dist.train.job import TrainJob
from sparkml_dist.train.async_ps import as_train_results, async_rank, log_async
from sparkml_dist.train.loop import train_rank

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    run_id: str
    model_uri: str
    history: list[dict[str, float]]
    rank_samples: list[int]
    param_checksums: list[list[float] | None]  # None: a rank holding part of the model (model parallel)

    @property
    def ranks_in_step(self) -> bool:
        """Every rank holding a full replica ended with the same parameters."""
        replicas = [c for c in self.param_checksums if c is not None]
        return all(c == replicas[0] for c in replicas[1:])


def train(spark: SparkSession, cfg: JobConfig, prep: PreprocessResult, run: RunHandle) -> TrainResult:
    if cfg.train.strategy == "federated":
        return _train_federated(spark, cfg, run)
    manifest = prep.manifest
    paths = OutputPaths.of(cfg)
    spec = model_spec(cfg.model, manifest.feature_dim, manifest.feature_names)
    job = make_job(prep.path, manifest, spec, cfg, str(paths.checkpoints(run.run_id)), run)
    results = run_with_recovery(spark, job, cfg)
    if cfg.train.strategy == "async":
        log_async(run, results)
    chief = results[0]
    model_uri = log_model(run, chief["state_dict"], spec, prep.feature_pipeline, manifest.schema)
    curve = plots.loss_curves(chief["history"], paths.plots / "loss_curves.png")
    run.client().log_artifact(run.run_id, str(curve), "plots")
    result = TrainResult(run.run_id, model_uri, chief["history"], [r["samples"] for r in results],
                         [r["param_checksum"] for r in results])
    if not result.ranks_in_step:
        log.warning("ranks ended with different parameters: %s", [c[:2] for c in result.param_checksums])
    paths.last_train.parent.mkdir(parents=True, exist_ok=True)
    paths.last_train.write_text(json.dumps({"run_id": run.run_id, "model_uri": model_uri,
                                            "tracking_uri": run.tracking_uri, "history": chief["history"]}))
    return result


def _train_federated(spark: SparkSession, cfg: JobConfig, run: RunHandle) -> TrainResult:
    """train.strategy=federated: the rounds run over the raw rows kept in client partitions (not
    the preprocessed splits); the model carries the pipeline fitted from Spark aggregates."""
    from sparkml_dist.federated.server import run_federated

    fed = run_federated(spark, cfg, run)
    history = fed.epoch_history()
    paths = OutputPaths.of(cfg)
    curve = plots.loss_curves(history, paths.plots / "loss_curves.png")
    run.client().log_artifact(run.run_id, str(curve), "plots")
    paths.last_train.parent.mkdir(parents=True, exist_ok=True)
    paths.last_train.write_text(json.dumps({"run_id": run.run_id, "model_uri": fed.model_uri,
                                            "tracking_uri": run.tracking_uri, "history": history}))
    return TrainResult(run.run_id, fed.model_uri, history, list(fed.clients.values()), [None])


def run_with_recovery(spark: SparkSession, job: TrainJob, cfg: JobConfig) -> list[dict[str, Any]]:
    """Spark never retries a barrier stage, so the driver relaunches it, up to
    `train.max_attempts` times; each attempt resumes from the last complete checkpoint."""
    backend = backend_for(cfg.train)
    asynchronous = cfg.train.strategy == "async"
    rank_fn = async_rank if asynchronous else train_rank
    failures: list[str] = []
    for attempt in range(cfg.train.max_attempts):
        try:
            results = run_barrier(spark, rank_fn, replace(job, attempt=attempt), cfg.train.num_ranks, backend)
            if asynchronous:
                results = as_train_results(results, cfg.train.epochs)
        except RankFailure as failure:
            failures.append(str(failure))
            log.warning("training attempt %d/%d failed: %s", attempt + 1, cfg.train.max_attempts,
                        str(failure).splitlines()[0])
            if not failure.retryable:
                raise TrainingFailed(attempt + 1, failures[-1], retryable=False) from None
            continue
        if job.run is not None:
            RankTracker(job.run, 0).log({"train_attempts": attempt + 1}, 0)
        if failures:
            log.info("training finished on attempt %d after %d failure(s)", attempt + 1, len(failures))
        return results
    raise TrainingFailed(cfg.train.max_attempts, failures[-1])


def make_job(data_root: str, manifest: Manifest, spec: dict[str, Any], cfg: JobConfig,
             checkpoint_dir: str, run: RunHandle | None) -> TrainJob:
    return TrainJob(
        data_root=data_root,
        train_groups=tuple(manifest.splits["train"].row_groups),
        val_groups=tuple(manifest.splits["val"].row_groups),
        model_spec=spec,
        train=cfg.train,
        checkpoint_dir=checkpoint_dir,
        run=run,
        feature_layout=FeatureLayout.from_json(manifest.feature_layout),
    )
