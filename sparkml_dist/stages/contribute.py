"""Community contributions: a contributor fine-tunes the registered model on their own data and
submits a parameter delta (a file, or an MLflow artifact URI). Before it is merged into a new
registry version it must pass, in order: its size is within `community.max_delta_mb` (checked
before a byte is parsed), shapes and finite values match the base model, the update's L2 norm is
within `community.max_delta_norm`, and the gate metric on held-out rows does not fall by more than
`community.max_regression`. The held-out rows are the training file's validation split (never
trained on, and not the test set a contributor could otherwise tune against), or
`community.validation_path`; the verdict states pass or fail with the change rounded to 0.01.
Every submission gets an MLflow run with its verdict; only an accepted one is logged as a model
and becomes a version tagged with its parent, contributor and the delta's sha256.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

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
from sparkml_dist.data.dataset import split_frame
from sparkml_dist.data.ingest import ingest
from sparkml_dist.data.sources import with_types_of
from sparkml_dist.models.weights import state_dict_from_bytes, state_dict_to_bytes
from sparkml_dist.stages.evaluate import evaluate
from sparkml_dist.storage import has_scheme
from sparkml_dist.tracking.client import RankTracker, RunHandle
from sparkml_dist.tracking.models import load_bundle, log_model, model_version, save_pyfunc_model
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


def contribute(
    spark: SparkSession, cfg: JobConfig, run: RunHandle, delta_source: str, contributor: str
) -> Verdict:
    community = cfg.community
    base_uri = community.base_model or f"models:/{cfg.tracking.registered_model}@champion"
    bundle = load_bundle(base_uri, run.tracking_uri, spark=spark)
    parent = model_version(base_uri, run.tracking_uri)
    try:
        who, verified, refused = *contributor_identity(contributor, run.tracking_uri), None
    except DeltaRejected as bad_name:
        who, verified, refused = "(refused name)", False, bad_name
    client = run.client()
    verdict = Verdict(False, "", parent)
    for key, value in {
        "contribution.contributor": who,
        "contribution.contributor_verified": str(verified).lower(),
        "contribution.source": delta_source,
        "parent_model": base_uri,
        "parent_version": parent or "",
    }.items():
        client.set_tag(run.run_id, key, value)
    try:
        if refused is not None:
            raise refused
        blob = read_delta(delta_source, run.tracking_uri, max_bytes(community.max_delta_mb, bundle.weights))
        verdict.sha256 = fingerprint(blob)
        client.set_tag(run.run_id, "contribution.sha256", verdict.sha256)
        merged = _check(spark, cfg, run, bundle, blob, verdict)
        merged_uri = log_model(run, merged)  # only now: nothing of a rejected delta is kept as a model
        verdict.accepted = True
        verdict.reason = (
            f"shapes match, norm {verdict.norm:.4g} <= {community.max_delta_norm:g}, "
            f"{_coarse_change(cfg, bundle, verdict)}"
        )
        verdict.version = create_version(
            run,
            merged_uri,
            cfg.tracking.registered_model,
            {
                "parent_version": parent or "",
                "parent_model": base_uri,
                "contributor": who,
                "contributor_verified": str(verified).lower(),
                "contribution.sha256": verdict.sha256,
                "contribution.reason": verdict.reason,
            },
        )
        if community.alias:
            client.set_registered_model_alias(cfg.tracking.registered_model, community.alias, verdict.version)
    except DeltaRejected as rejected:
        verdict.reason = str(rejected)
    client.set_tag(run.run_id, "contribution.status", "accepted" if verdict.accepted else "rejected")
    client.set_tag(run.run_id, "contribution.reason", verdict.reason)
    log.info(
        "contribution from %s %s: %s", who, "accepted" if verdict.accepted else "REJECTED", verdict.reason
    )
    return verdict


CONTRIBUTOR = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,99}")


def contributor_identity(claimed: str, tracking_uri: str) -> tuple[str, bool]:
    """(who, verified): the tracking server's authenticated user when the job talks to one with
    credentials (MLflow's basic-auth app checks them on every call); else the name given, which
    nothing verifies (tagged contributor_verified=false) and which must be a plain identifier."""
    user = os.environ.get("MLFLOW_TRACKING_USERNAME")
    if user and tracking_uri.startswith(("http://", "https://")):
        return user, True
    if not CONTRIBUTOR.fullmatch(claimed or ""):
        raise DeltaRejected(
            f"contributor {claimed!r}: give a plain name (letters, digits, . _ @ + -, at most 100)"
        )
    return claimed, False


def max_bytes(limit_mb: float | None, base_weights: bytes) -> int:
    """The cap a delta file must be within: `community.max_delta_mb`, default twice the base model's
    weights plus 1 MiB (a float32 delta of every parameter is about the weights' own size)."""
    return int(limit_mb * 2**20) if limit_mb else 2 * len(base_weights) + 2**20


def _check(spark, cfg: JobConfig, run: RunHandle, bundle, blob: bytes, verdict: Verdict) -> TrainedModel:
    community = cfg.community
    base = state_dict_from_bytes(bundle.weights)
    delta = load_delta(blob)
    check_shapes(base, delta)
    verdict.norm = check_norm(delta, community.max_delta_norm)
    merged = TrainedModel(
        bundle.spec,
        state_dict_to_bytes(apply_delta(base, delta)),
        bundle.feature_pipeline_path,
        bundle.training_schema or {},
        bundle.target,
    )
    task = bundle.target.kind
    metric = cfg.tracking.gate.metric or task.default_gate[0]
    with (
        tempfile.TemporaryDirectory(prefix="sparkml_dist_candidate_") as tmp,
        _held_out(spark, cfg, bundle.training_schema or {}) as rows,
    ):
        candidate = save_pyfunc_model(
            tmp, merged.weights, merged.spec, merged.feature_pipeline, merged.training_schema, merged.target
        )
        verdict.metric_before = evaluate(spark, cfg, bundle.uri, run.tracking_uri, rows).metrics[metric]
        verdict.metric_after = evaluate(spark, cfg, candidate, run.tracking_uri, rows).metrics[metric]
    # coarse: a contributor who reads the run must not be able to tune against the held-out rows
    RankTracker(run, 0).log(
        {
            "delta_norm": verdict.norm,
            f"held_out_{metric}_change": round(verdict.metric_after - verdict.metric_before, 2),
        },
        0,
    )
    # how much worse, in the metric's own direction
    drop = (
        verdict.metric_after - verdict.metric_before
        if task.metrics[metric] == "lower"
        else verdict.metric_before - verdict.metric_after
    )
    if drop > community.max_regression:
        raise DeltaRejected(
            f"regression on held-out rows: {metric} got worse by more than community.max_regression "
            f"{community.max_regression:g} ({_coarse_change(cfg, bundle, verdict)})"
        )
    return merged


def _coarse_change(cfg: JobConfig, bundle, verdict: Verdict) -> str:
    metric = cfg.tracking.gate.metric or bundle.target.kind.default_gate[0]
    change = (verdict.metric_after or 0.0) - (verdict.metric_before or 0.0)  # both set once it regressed
    return f"{metric} change on held-out rows about {change:+.2f}"


@contextmanager
def _held_out(spark, cfg: JobConfig, schema: Mapping[str, str]) -> Iterator[DataFrame]:
    """The rows a contribution is judged on: `community.validation_path`, else the training file's
    validation split (the rows preprocess held out: a hash of row id and data.split_seed); read
    with the types the model was trained on (`schema`)."""
    path = cfg.community.validation_path
    with ingest(
        spark,
        path or cfg.data.train_path,
        with_types_of(cfg.data, schema),
        key="community.validation_path" if path else "data.train_path",
    ) as rows:
        yield (
            rows.accepted
            if path
            else split_frame(rows.accepted, cfg.data.validation_fraction, cfg.data.split_seed)[1]
        )


def read_delta(source: str, tracking_uri: str, limit: int) -> bytes:
    """A local file, or an MLflow artifact URI (runs:/<id>/delta.pt, mlflow-artifacts:/...), refused
    when larger than `limit` bytes before any of it is read."""
    if not has_scheme(source):
        path = Path(source)
        if not path.is_file():
            raise DeltaRejected(f"delta file {source} does not exist")
        return _read_capped(path, limit, source)
    import mlflow.artifacts

    with tempfile.TemporaryDirectory() as tmp:
        local = mlflow.artifacts.download_artifacts(
            artifact_uri=source, tracking_uri=tracking_uri, dst_path=tmp
        )
        return _read_capped(Path(local), limit, source)


def _read_capped(path: Path, limit: int, source: str) -> bytes:
    size = path.stat().st_size
    if size > limit:
        raise DeltaRejected(
            f"delta {source} is {size:,} bytes, over the {limit:,}-byte cap "
            f"(community.max_delta_mb; default twice the base model's weights plus 1 MiB): "
            f"not read"
        )
    return path.read_bytes()


def write_delta(base_uri: str, tuned_uri: str, tracking_uri: str, out: str | Path) -> Path:
    """What a contributor runs after fine-tuning: tuned weights minus the base's, as a file."""
    base = state_dict_from_bytes(load_bundle(base_uri, tracking_uri).weights)
    tuned = state_dict_from_bytes(load_bundle(tuned_uri, tracking_uri).weights)
    return save_delta(make_delta(base, tuned), out)


if __name__ == "__main__":
    import argparse

    from sparkml_dist.config.schema import TrackingConfig
    from sparkml_dist.tracking.client import resolve_tracking_uri

    parser = argparse.ArgumentParser(
        description="write a parameter delta (tuned - base) to submit with jobs/contribute.py"
    )
    parser.add_argument(
        "--base", required=True, help="the model you started from, e.g. models:/adult_income_mlp@champion"
    )
    parser.add_argument("--tuned", required=True, help="your fine-tuned model, e.g. runs:/<run id>/model")
    parser.add_argument("--out", required=True, help="delta file to write, e.g. delta.pt")
    parser.add_argument("--tracking-uri", help="default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    args = parser.parse_args()
    uri = args.tracking_uri or resolve_tracking_uri(TrackingConfig())
    print(write_delta(args.base, args.tuned, uri, args.out))
