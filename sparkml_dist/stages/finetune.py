"""Fine-tuning from the registry: start from a registered model (default `@champion`), train on
new rows (or a `where` subset) with the same launcher and backends, optionally with frozen
layers or low-rank adapters, and register the result as a new version that names its parent.

The new version keeps the base model's feature pipeline (the new rows are encoded exactly as
the base model saw its own), spec and parameter names, so scoring needs nothing new. It gets
`finetune.alias` only when the gate metric on the original test rows fell by at most
`finetune.max_original_drop`; either way the reason is recorded on the version.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyspark.ml import PipelineModel
from pyspark.sql import SparkSession

from sparkml_dist import storage
from sparkml_dist.config.schema import JobConfig
from sparkml_dist.data.ingest import ingest
from sparkml_dist.data.labels import model_target
from sparkml_dist.data.sources import schema_of, with_types_of
from sparkml_dist.errors import ConfigError
from sparkml_dist.inference.scoring import check_schema
from sparkml_dist.methods.base import TrainRequest, WarmStart, get_method
from sparkml_dist.stages.evaluate import evaluate
from sparkml_dist.stages.preprocess import preprocess, select_rows
from sparkml_dist.storage.paths import OutputPaths
from sparkml_dist.tasks.base import Target
from sparkml_dist.tracking.client import EpochLogger, RankTracker, RunHandle
from sparkml_dist.tracking.models import load_bundle, model_version
from sparkml_dist.tracking.models import register as create_version
from sparkml_dist.tracking.outcome import log_outcome
from sparkml_dist.train.adapters import AdaptSpec

log = logging.getLogger(__name__)


@dataclass
class FinetuneResult:
    run_id: str
    model_uri: str
    parent: str  # the base model URI as given
    parent_version: str | None
    version: str
    alias: str | None
    reason: str
    base_metrics: dict[str, dict[str, float]]  # {"test": ..., "subset": ...} of the base model (no
    # "subset" when no test row matches finetune.where)
    metrics: dict[str, dict[str, float]]  # the same for the fine-tuned model


def finetune(spark: SparkSession, cfg: JobConfig, run: RunHandle) -> FinetuneResult:
    ft = cfg.finetune
    method = get_method(cfg.train.strategy)
    if not method.supports_warm_start:
        raise ConfigError(
            f"train.strategy={cfg.train.strategy} cannot start from a registered model; fine-tune with "
            f"one of the rank-loop methods (ddp, fsdp, tensor, pipeline, hybrid)"
        )
    base_uri = ft.base_model or f"models:/{cfg.tracking.registered_model}@champion"
    bundle = load_bundle(base_uri, run.tracking_uri, spark=spark, shared_dir=OutputPaths.of(cfg).models)
    if not cfg.data.typed:  # a typed source's columns are known once read: checked after preprocess
        check_schema(schema_of(cfg.data), bundle)
    target = model_target(bundle.target, cfg.data)
    parent_version = model_version(base_uri, run.tracking_uri)
    log.info("fine-tuning %s (version %s) on %s", base_uri, parent_version or "-", ft.where or "all rows")

    out = OutputPaths.of(cfg).under("finetune")
    fitted = PipelineModel.load(storage.spark_path(bundle.spark_pipeline))
    # the new rows are encoded the way the base model saw its own: its pipeline, its classes or scale
    prep = preprocess(
        spark,
        cfg,
        fitted=fitted,
        where=ft.where,
        out=storage.join(out, "preprocess"),
        target=target,
        trained_on=bundle.training_schema,
        min_rows=cfg.train.batch_size,
    )
    check_schema(prep.manifest.schema, bundle)
    train_cfg = cfg.train.model_copy(update={"epochs": ft.epochs, "learning_rate": ft.learning_rate})
    warm = WarmStart(
        bundle.spec,
        bundle.weights,
        bundle.feature_pipeline_path,
        bundle.training_schema or {},
        target,
        AdaptSpec(tuple(ft.freeze), ft.lora_rank, ft.lora_alpha),
    )
    request = TrainRequest(
        spark,
        cfg.model_copy(update={"train": train_cfg}),
        prep,
        storage.join(out, "checkpoints", run.run_id),
        sink=EpochLogger(run),
        warm_start=warm,
    )
    model_uri = log_outcome(run, method.run(request), storage.join(out, "plots"))

    with ingest(
        spark, cfg.data.test_path, with_types_of(cfg.data, prep.manifest.schema), key="data.test_path"
    ) as test_input:
        sets = {"test": test_input.accepted}
        subset = select_rows(test_input.accepted, ft.where, cfg.data.label.column)
        if subset.limit(1).count():  # no test row in the subset: no subset metrics, never zeros
            sets["subset"] = subset
        base = {k: evaluate(spark, cfg, base_uri, run.tracking_uri, rows).metrics for k, rows in sets.items()}
        new = {k: evaluate(spark, cfg, model_uri, run.tracking_uri, rows).metrics for k, rows in sets.items()}
    _log_comparison(run, base, new)

    passed, reason = _guard(cfg, target, base["test"], new["test"])
    tags = {
        "parent_model": base_uri,
        "parent_version": parent_version or "",
        "finetune.where": ft.where or "",
        "finetune.reason": reason,
        "finetune.lora_rank": str(ft.lora_rank),
        "finetune.freeze": ",".join(ft.freeze),
    }
    version = create_version(run, model_uri, cfg.tracking.registered_model, tags)
    client = run.client()
    if passed:
        client.set_registered_model_alias(cfg.tracking.registered_model, ft.alias, version)
    for key, value in {**tags, "registry.version": version}.items():
        client.set_tag(run.run_id, key, value)
    log.info("fine-tuned version %s: %s", version, reason)
    return FinetuneResult(
        run.run_id,
        model_uri,
        base_uri,
        parent_version,
        version,
        ft.alias if passed else None,
        reason,
        base,
        new,
    )


def _guard(cfg: JobConfig, target: Target, base: dict[str, float], new: dict[str, float]) -> tuple[bool, str]:
    """The gate's metric on the original test rows may get worse by at most
    `finetune.max_original_drop` (in the metric's own direction)."""
    task = target.kind
    metric, bound = cfg.tracking.gate.metric or task.default_gate[0], cfg.finetune.max_original_drop
    worse = (new[metric] - base[metric]) if task.metrics[metric] == "lower" else (base[metric] - new[metric])
    if worse > bound:
        return False, (
            f"original test {metric} got worse by {worse:.4f} ({base[metric]:.4f} -> {new[metric]:.4f}), "
            f"more than finetune.max_original_drop {bound}"
        )
    return True, f"original test {metric} {base[metric]:.4f} -> {new[metric]:.4f} (allowed drop {bound})"


def _log_comparison(
    run: RunHandle, base: dict[str, dict[str, float]], new: dict[str, dict[str, float]]
) -> None:
    flat = {}
    for split in base:
        flat.update({f"base_{split}_{k}": v for k, v in base[split].items()})
        flat.update({f"{split}_{k}": v for k, v in new[split].items()})
    RankTracker(run, 0).log(flat, 0)


def result_lines(result: FinetuneResult) -> str:
    def show(m: dict[str, float] | None) -> str:
        if m is None:
            return "no row of data.test_path matches finetune.where: not measured"
        return "  ".join(f"{k} {v:.4f}" for k, v in m.items() if k not in ("rows", "unknown_label_rows"))

    return "\n".join(
        [
            "=== sparkml_dist finetune ===",
            f"parent         : {result.parent} (version {result.parent_version or '-'})",
            f"subset  before : {show(result.base_metrics.get('subset'))}",
            f"subset  after  : {show(result.metrics.get('subset'))}",
            f"test    before : {show(result.base_metrics['test'])}",
            f"test    after  : {show(result.metrics['test'])}",
            f"registry       : version {result.version}"
            + (f" -> alias '{result.alias}'" if result.alias else " (no alias)"),
            f"reason         : {result.reason}",
            f"mlflow run     : {result.run_id}",
        ]
    )
