"""The stages wired together: preprocess -> train -> evaluate -> register -> score.
One MLflow run per pipeline run; a re-run replaces outputs instead of duplicating them."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from pyspark.sql import SparkSession

from sparkml_dist import storage
from sparkml_dist.config.schema import JobConfig
from sparkml_dist.data.ingest import ingest
from sparkml_dist.data.sources import with_types_of
from sparkml_dist.spark.session import job_group
from sparkml_dist.stages import evaluate, log_report, preprocess, register, score, train
from sparkml_dist.stages.preprocess import describe_target
from sparkml_dist.stages.score import ScoreResult
from sparkml_dist.storage.paths import OutputPaths
from sparkml_dist.tasks.base import get_task
from sparkml_dist.tracking.client import RankTracker, RunHandle, tracked_run
from sparkml_dist.tracking.cost import RunCost
from sparkml_dist.tracking.models import champion_version

log = logging.getLogger(__name__)


@dataclass
class Summary:
    rows: dict[str, Any]
    test_metrics: dict[str, float]
    run_id: str
    experiment_id: str
    tracking_uri: str
    registered_model: str
    version: str
    alias: str
    gate_reason: str
    outputs: dict[str, str]
    task: str = "binary"
    target: str = ""  # what the model predicts: its classes (and threshold), or the label's scale
    seconds: dict[str, float] = field(default_factory=dict)
    energy: str = ""  # the run's energy, how it was had, per training sample and per million rows scored
    step_time: str = ""  # where each rank's mean step went (data, compute, comm, optimizer)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def run_pipeline(spark: SparkSession, cfg: JobConfig, run_name: str = "pipeline") -> Summary:
    with tracked_run(cfg.tracking, run_name, cfg.flat_params()) as run:
        return _run_stages(spark, cfg, run)


def _run_stages(spark: SparkSession, cfg: JobConfig, run: RunHandle) -> Summary:
    paths = OutputPaths.of(cfg)
    timer = _Timer(spark)
    with timer("preprocess"):
        prep = preprocess(spark, cfg)
    with timer("train"):
        trained = train(spark, cfg, prep, run)
    with ingest(
        spark,
        cfg.data.test_path,
        with_types_of(cfg.data, prep.manifest.schema),
        key="data.test_path",
        pack_wide=True,  # evaluation and the gate's re-scoring read the features from one array
    ) as test_input:
        with timer("evaluate"):
            report = evaluate(spark, cfg, trained.model_uri, run.tracking_uri, test_input.accepted)
            log_report(run, report, cfg, step=trained.outcome.last.epoch)
        with timer("register"):
            decision = register(spark, cfg, run, trained.model_uri, report, test_input.accepted)
    if champion_version(run.tracking_uri, decision.name) is None:
        # scoring uses the champion; a first model that the gate refused leaves none to score with
        log.warning("score: skipped, no version of %s is champion (%s)", decision.name, decision.reason)
        scored = ScoreResult("", "", 0, 0, 0)
    else:
        with timer("score"):
            scored = score(spark, cfg)
    cost = RunCost.of_outcome(trained.outcome)
    if scored.scored_rows and not math.isnan(scored.joules):
        RankTracker(run, 0).log(
            {"score_joules": scored.joules, "score_joules_per_million_rows": scored.joules_per_million_rows},
            trained.outcome.last.epoch,
        )
    manifest = prep.manifest
    summary = Summary(
        rows={
            "input": {k: v["input"] for k, v in manifest.inputs.items()},
            "rejected": {k: v["rejected"] for k, v in manifest.inputs.items()},
            "trained": manifest.splits["train"].rows,
            "validation": manifest.splits["val"].rows,
            "test": manifest.splits["test"].rows,
            "scored": scored.scored_rows,
            "score_rejected": scored.rejected_rows,
        },
        test_metrics=report.metrics,
        run_id=run.run_id,
        experiment_id=run.experiment_id,
        tracking_uri=run.tracking_uri,
        registered_model=decision.name,
        version=decision.version,
        alias=decision.alias,
        gate_reason=decision.reason,
        outputs={
            "preprocess": prep.path,
            "predictions": scored.path or "none: no champion to score with yet",
            "model_uri": trained.model_uri,
            "registered": f"models:/{decision.name}/{decision.version}",
            "plots": paths.plots,
            "summary": paths.summary,
        },
        task=trained.outcome.model.target.task,
        target=describe_target(trained.outcome.model.target),
        seconds=timer.seconds,
        energy=_energy_line(cost, scored),
        step_time=cost.time_line(),
    )
    storage.write_text(paths.summary, summary.to_json())
    with storage.local_copy(paths.summary) as local:
        run.client().log_artifact(run.run_id, str(local))
    return summary


def _energy_line(cost: RunCost, scored: ScoreResult) -> str:
    line = f"training {cost.energy_line()}"
    if scored.energy_text():
        line += f"; scoring {scored.energy_text()}"
    return line


class _Timer:
    """Wall time per stage, with a log line at each start and end; the stage's Spark jobs run
    under its own job group (`sparkml_dist:<stage>` in the Spark UI)."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        log.info("stage %s: started", name)
        try:
            with job_group(self.spark, f"sparkml_dist:{name}", f"pipeline stage {name}"):
                yield
        except BaseException:
            # a scheduler's log search for "finished" must not find a stage that raised
            log.error("stage %s: failed after %.1fs", name, time.perf_counter() - t0)
            raise
        self.seconds[name] = round(time.perf_counter() - t0, 2)
        log.info("stage %s: finished in %.1fs", name, self.seconds[name])


def format_summary(s: Summary) -> str:
    m = s.test_metrics
    lines = [
        "",
        "=== sparkml_dist pipeline summary ===",
        f"rows in        : train {s.rows['input']['train']:,}  test {s.rows['input']['test']:,}",
        f"rows rejected  : train {s.rows['rejected']['train']:,}  test {s.rows['rejected']['test']:,}  (quarantined with reasons)",
        f"rows trained   : {s.rows['trained']:,} (validation {s.rows['validation']:,}, test {s.rows['test']:,})",
        f"rows scored    : {s.rows['scored']:,} (rejected at scoring {s.rows['score_rejected']:,})",
        f"task           : {s.task}: {s.target}",
        "test metrics   : " + "  ".join(f"{k} {m[k]:.4f}" for k in get_task(s.task).metrics if k in m),
        f"mlflow run     : {s.run_id} (experiment {s.experiment_id})",
        f"registry       : {s.registered_model} version {s.version} -> alias '{s.alias}' ({s.gate_reason})",
        f"predictions    : {s.outputs['predictions']}",
        f"preprocessed   : {s.outputs['preprocess']}",
        f"plots          : {s.outputs['plots']}",
        f"stage seconds  : {s.seconds}",
        f"summary JSON   : {s.outputs['summary']}",
        f"MLflow UI      : mlflow ui --backend-store-uri {s.tracking_uri} --host 127.0.0.1 --port 5000",
        f"energy         : {s.energy}",
        f"step time      : {s.step_time}",
    ]
    return "\n".join(lines)
