"""Stage 4: a new registry version each run; `champion` moves only through the gate."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from sparkml_dist.config.schema import JobConfig
from sparkml_dist.data.dataset import PreprocessResult
from sparkml_dist.errors import SparkMLDistError
from sparkml_dist.stages.evaluate import evaluate
from sparkml_dist.stages.records import EvaluateRecord, TrainRecord
from sparkml_dist.storage.paths import OutputPaths
from sparkml_dist.tasks.base import UNRECORDED_TARGET, TaskReport
from sparkml_dist.tracking.client import RunHandle, resolve_tracking_uri
from sparkml_dist.tracking.models import champion_version, versions_tagged
from sparkml_dist.tracking.models import register as create_version
from sparkml_dist.validation.gate import decide

CHAMPION, CHALLENGER = "champion", "challenger"


@dataclass
class RegistryDecision:
    name: str
    version: str
    alias: str
    reason: str
    champion_metrics: dict[str, float] | None


def register(
    spark: SparkSession,
    cfg: JobConfig,
    run: RunHandle,
    model_uri: str,
    report: TaskReport,
    test_rows: DataFrame | None = None,
) -> RegistryDecision:
    """A new version of `model_uri` with the alias the gate gives it; `report` is its evaluation.
    A scheduled run (`output.run_date`) that finds the date's version made from the same input
    and config reuses it: re-running a date never adds a version."""
    name = cfg.tracking.registered_model
    scheduled = run_date_tags(cfg)
    if scheduled:
        earlier = versions_tagged(run.tracking_uri, name, scheduled)
        if earlier:
            return _reuse(run, name, earlier[0], scheduled["run_date"])
    target = report.target or UNRECORDED_TARGET
    current = champion_version(run.tracking_uri, name)
    champion_metrics = None
    if current is not None:  # re-score the champion on the same test rows
        champion = evaluate(spark, cfg, f"models:/{name}@{CHAMPION}", run.tracking_uri, test_rows)
        if (champion.target or target).task != target.task:
            raise SparkMLDistError(
                f"register: the champion of {name} is a {(champion.target or target).task} model "
                f"and this one {target.task}; register it under another tracking.registered_model"
            )
        champion_metrics = champion.metrics
    decision = decide(cfg.tracking.gate, target, report.metrics, champion_metrics)
    alias = CHAMPION if decision.promote else CHALLENGER
    metric = cfg.tracking.gate.metric or target.kind.default_gate[0]
    version = create_version(
        run, model_uri, name, {"gate_reason": decision.reason, "gate_metric": metric, **scheduled}
    )
    client = run.client()
    client.set_registered_model_alias(name, alias, version)
    client.set_tag(run.run_id, "registry.version", version)
    client.set_tag(run.run_id, "registry.alias", alias)
    client.set_tag(run.run_id, "registry.reason", decision.reason)
    return RegistryDecision(name, version, alias, decision.reason, champion_metrics)


def run_date_tags(cfg: JobConfig) -> dict[str, str]:
    """What makes a scheduled run's version the same one again: the date, the input's fingerprint
    (the preprocess manifest's) and the config's, outputs aside. Empty for an unscheduled run."""
    if cfg.output.run_date is None:
        return {}

    manifest = PreprocessResult.load(OutputPaths.of(cfg).preprocess).manifest
    params = {k: v for k, v in cfg.flat_params().items() if not k.startswith("output.")}
    config = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()
    return {
        "run_date": cfg.output.run_date,
        "input_fingerprint": manifest.input_fingerprint,
        "config_fingerprint": config,
    }


def _reuse(run: RunHandle, name: str, version, run_date: str) -> RegistryDecision:
    aliases = list(version.aliases)
    alias = aliases[0] if aliases else "none"
    reason = (
        f"reused version {version.version}: registered for run date {run_date} from the same input and "
        f"config (a re-run adds no version); alias unchanged"
    )
    client = run.client()
    for key, value in (
        ("registry.version", str(version.version)),
        ("registry.alias", alias),
        ("registry.reason", reason),
    ):
        client.set_tag(run.run_id, key, value)
    return RegistryDecision(name, str(version.version), alias, reason, None)


def register_evaluated(spark: SparkSession, cfg: JobConfig, model_uri: str | None = None) -> RegistryDecision:
    """The `register` job: the model the train and evaluate stages recorded, through the gate."""
    paths = OutputPaths.of(cfg)
    trained = TrainRecord.load(paths.train_record)
    uri = model_uri or (trained.model_uri if trained else None)
    if trained is None or not uri:
        raise SparkMLDistError(
            f"register: no train stage output under {paths.root}; run the train stage first"
        )
    evaluated = EvaluateRecord.load(paths.evaluate_record)
    if evaluated is None or evaluated.model_uri != uri:
        raise SparkMLDistError(f"register: {uri} has not been evaluated; run the evaluate stage first")
    run = RunHandle.existing(resolve_tracking_uri(cfg.tracking), trained.run_id)
    return register(spark, cfg, run, uri, TaskReport(evaluated.metrics, target=evaluated.target))
