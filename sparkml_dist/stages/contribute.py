"""Community contributions: a contributor fine-tunes the registered model on their own data and
submits a parameter delta (a file, or an MLflow artifact URI). Before it is merged into a new
registry version it must pass, in order: shapes and finite values match the base model, the
update's L2 norm is within `community.max_delta_norm`, and the gate metric on held-out rows
(`community.validation_path`, default the test file) does not fall by more than
`community.max_regression`. Every submission gets an MLflow run with its verdict; an accepted
one becomes a version tagged with its parent, contributor and the delta's sha256.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession

from sparkml_dist.community.deltas import (
    DeltaRejected,
    apply_delta,
    check_norm,
    check_shapes,
    fingerprint,
    load_delta,
    make_delta,
    save_delta,
)
from sparkml_dist.config.schema import JobConfig
from sparkml_dist.data.ingest import ingest
from sparkml_dist.models.weights import state_dict_from_bytes, state_dict_to_bytes
from sparkml_dist.stages.evaluate import evaluate
from sparkml_dist.tracking.client import RankTracker, RunHandle
from sparkml_dist.tracking.models import load_bundle, log_model, model_version
from sparkml_dist.tracking.models import register as create_version
from sparkml_dist.train.records import TrainedModel

log = logging.getLogger(__name__)


@dataclass
class Verdict:
    accepted: bool
    reason: str
    parent_version: str | None
    version: str | None = None
    norm: float | None = None
    metric_before: float | None = None
    metric_after: float | None = None
    sha256: str = ""


def contribute(spark: SparkSession, cfg: JobConfig, run: RunHandle, delta_source: str, contributor: str) -> Verdict:
    community = cfg.community
    base_uri = community.base_model or f"models:/{cfg.tracking.registered_model}@champion"
    bundle = load_bundle(base_uri, run.tracking_uri, spark=spark)
    parent = model_version(base_uri, run.tracking_uri)
    blob = read_delta(delta_source, run.tracking_uri)
    verdict = Verdict(False, "", parent, sha256=fingerprint(blob))
    client = run.client()
    for key, value in {"contribution.contributor": contributor, "contribution.source": delta_source,
                       "contribution.sha256": verdict.sha256, "parent_model": base_uri,
                       "parent_version": parent or ""}.items():
        client.set_tag(run.run_id, key, value)
    try:
        merged_uri = _check_and_merge(spark, cfg, run, bundle, blob, verdict)
        verdict.accepted = True
        verdict.reason = (f"shapes match, norm {verdict.norm:.4g} <= {community.max_delta_norm:g}, "
                          f"{cfg.tracking.gate.metric or bundle.target.kind.default_gate[0]} {verdict.metric_before:.4f} -> "
                          f"{verdict.metric_after:.4f}")
        verdict.version = create_version(run, merged_uri, cfg.tracking.registered_model, {
            "parent_version": parent or "", "parent_model": base_uri, "contributor": contributor,
            "contribution.sha256": verdict.sha256, "contribution.reason": verdict.reason})
        if community.alias:
            client.set_registered_model_alias(cfg.tracking.registered_model, community.alias, verdict.version)
    except DeltaRejected as rejected:
        verdict.reason = str(rejected)
    client.set_tag(run.run_id, "contribution.status", "accepted" if verdict.accepted else "rejected")
    client.set_tag(run.run_id, "contribution.reason", verdict.reason)
    log.info("contribution from %s %s: %s", contributor, "accepted" if verdict.accepted else "REJECTED", verdict.reason)
    return verdict


def _check_and_merge(spark, cfg: JobConfig, run: RunHandle, bundle, blob: bytes, verdict: Verdict) -> str:
    community = cfg.community
    base = state_dict_from_bytes(bundle.weights)
    delta = load_delta(blob)
    check_shapes(base, delta)
    verdict.norm = check_norm(delta, community.max_delta_norm)
    merged = state_dict_to_bytes(apply_delta(base, delta))
    merged_uri = log_model(run, TrainedModel(bundle.spec, merged, bundle.feature_pipeline_path,
                                             bundle.training_schema or {}, bundle.target))
    task = bundle.target.kind
    metric = cfg.tracking.gate.metric or task.default_gate[0]
    with ingest(spark, community.validation_path or cfg.data.test_path, cfg.data) as held_out:
        verdict.metric_before = evaluate(spark, cfg, bundle.uri, run.tracking_uri, held_out.accepted).metrics[metric]
        verdict.metric_after = evaluate(spark, cfg, merged_uri, run.tracking_uri, held_out.accepted).metrics[metric]
    RankTracker(run, 0).log({"delta_norm": verdict.norm, f"base_{metric}": verdict.metric_before,
                             metric: verdict.metric_after}, 0)
    # how much worse, in the metric's own direction
    drop = (verdict.metric_after - verdict.metric_before if task.metrics[metric] == "lower"
            else verdict.metric_before - verdict.metric_after)
    if drop > community.max_regression:
        raise DeltaRejected(f"regression on held-out rows: {metric} {verdict.metric_before:.4f} -> "
                            f"{verdict.metric_after:.4f} (drop {drop:.4f} > community.max_regression "
                            f"{community.max_regression:g})")
    return merged_uri


def read_delta(source: str, tracking_uri: str) -> bytes:
    """A local file, or an MLflow artifact URI (runs:/<id>/delta.pt, mlflow-artifacts:/...)."""
    if "://" not in source and ":/" not in source:
        path = Path(source)
        if not path.is_file():
            raise DeltaRejected(f"delta file {source} does not exist")
        return path.read_bytes()
    import mlflow.artifacts

    with tempfile.TemporaryDirectory() as tmp:
        local = mlflow.artifacts.download_artifacts(artifact_uri=source, tracking_uri=tracking_uri, dst_path=tmp)
        return Path(local).read_bytes()


def write_delta(base_uri: str, tuned_uri: str, tracking_uri: str, out: str | Path) -> Path:
    """What a contributor runs after fine-tuning: tuned weights minus the base's, as a file."""
    base = state_dict_from_bytes(load_bundle(base_uri, tracking_uri).weights)
    tuned = state_dict_from_bytes(load_bundle(tuned_uri, tracking_uri).weights)
    return save_delta(make_delta(base, tuned), out)


if __name__ == "__main__":
    import argparse

    from sparkml_dist.config.schema import TrackingConfig
    from sparkml_dist.tracking.client import resolve_tracking_uri

    parser = argparse.ArgumentParser(description="write a parameter delta (tuned - base) to submit with jobs/contribute.py")
    parser.add_argument("--base", required=True, help="the model you started from, e.g. models:/adult_income_mlp@champion")
    parser.add_argument("--tuned", required=True, help="your fine-tuned model, e.g. runs:/<run id>/model")
    parser.add_argument("--out", required=True, help="delta file to write, e.g. delta.pt")
    parser.add_argument("--tracking-uri", help="default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    args = parser.parse_args()
    uri = args.tracking_uri or resolve_tracking_uri(TrackingConfig())
    print(write_delta(args.base, args.tuned, uri, args.out))
