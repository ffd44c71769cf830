"""The driver side of federated learning: lay the clients out one per partition, run the rounds,
aggregate (FedAvg / FedProx weighted by samples), evaluate the global model on the driver's own
test rows, and log everything to MLflow.

The driver never touches client rows: it fits the feature pipeline from Spark aggregates
(medians, vocabularies, means) and receives, per round, only a public key and a
parameter-shaped update per client. `ReceivedLog` checks every payload and records its shape.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkml_dist.config.schema import JobConfig
from sparkml_dist.data.dataset import split_frame
from sparkml_dist.data.features import FEATURES, build_feature_pipeline, feature_names, to_feature_frame
from sparkml_dist.data.ingest import LABEL, ingest
from sparkml_dist.data.loader import features_to_numpy
from sparkml_dist.federated.client import RoundTask, client_update, public_key
from sparkml_dist.models.factory import build_model, model_spec
from sparkml_dist.stages.paths import OutputPaths
from sparkml_dist.tracking.client import RankTracker, RunHandle
from sparkml_dist.tracking.models import log_model
from sparkml_dist.train.checkpoint import state_dict_to_bytes

log = logging.getLogger(__name__)
CLIENT = "_client"


class UnexpectedPayload(RuntimeError):
    """A client sent something other than a parameter-shaped update: refused, never used."""


@dataclass
class ReceivedLog:
    """What the driver received from clients: per payload, its keys and tensor shapes."""

    shapes: dict[str, tuple[int, ...]]
    payloads: int = 0
    largest_value: float = 0.0  # the largest |entry| of any single update seen (masked ones are huge)

    def check(self, payload: dict[str, Any]) -> None:
        allowed = {"client", "samples", "update", "late", "norm", "clipped", "loss", "public"}
        if set(payload) - allowed:
            raise UnexpectedPayload(f"client {payload.get('client')}: unexpected fields {sorted(set(payload) - allowed)}")
        update = payload.get("update")
        if update is not None:
            if {k: tuple(v.shape) for k, v in update.items()} != self.shapes:
                raise UnexpectedPayload(f"client {payload['client']}: update is not shaped like the model's parameters")
            self.largest_value = max(self.largest_value, max(float(v.abs().max()) for v in update.values()))
        self.payloads += 1


@dataclass
class FederatedResult:
    run_id: str
    model_uri: str
    clients: dict[str, int]  # client value -> its rows (counted where they live)
    history: list[dict[str, float]] = field(default_factory=list)
    received: ReceivedLog | None = None

    @property
    def accuracy(self) -> float:
        return self.history[-1]["test_accuracy"]

    def epoch_history(self) -> list[dict[str, float]]:
        """Rounds as the train stage's epochs: val_* is the driver's own held-out rows (the test file)."""
        return [{"epoch": h["round"], "train_loss": h["train_loss"], "val_loss": h["test_loss"],
                 "val_accuracy": h["test_accuracy"], "samples": float(sum(self.clients.values()))} for h in self.history]


def run_federated(spark: SparkSession, cfg: JobConfig, run: RunHandle,
                  slow_clients: dict[str, float] | None = None) -> FederatedResult:
    """`slow_clients`: client value -> seconds of delay per batch (to exercise the round timeout)."""
    fed = cfg.federated
    if fed.client_column is None:
        from sparkml_dist.errors import ConfigError

        raise ConfigError("federated.client_column: name the column whose values are the clients, e.g. occupation")
    with ingest(spark, cfg.data.train_path, cfg.data) as train_input:
        fit_rows, _ = split_frame(train_input.accepted, cfg.data.validation_fraction, cfg.data.split_seed)
        pipeline = build_feature_pipeline(cfg.data, cfg.features).fit(fit_rows)
        names = feature_names(pipeline, fit_rows)
        spec = model_spec(cfg.model, len(names), names)
        clients, rdd = client_partitions(pipeline, train_input.accepted, fed.client_column)
        try:
            state, result = _run_rounds(spark, cfg, run, spec, clients, rdd, _test_arrays(spark, cfg, pipeline),
                                        slow_clients or {})
        finally:
            rdd.unpersist()
    pipeline_dir = OutputPaths.of(cfg).root / "federated" / "feature_pipeline"
    pipeline.write().overwrite().save(str(pipeline_dir))  # travels inside the model: it scores raw rows
    result.model_uri = log_model(run, state_dict_to_bytes(state), spec, str(pipeline_dir),
                                 {c.name: f"{c.type}/{c.role}" for c in cfg.data.columns})
    return result


def _run_rounds(spark, cfg: JobConfig, run: RunHandle, spec: dict, clients: dict[str, int], rdd,
                test: tuple[np.ndarray, np.ndarray], slow_clients: dict[str, float]) -> tuple[dict, FederatedResult]:
    """The rounds from a fresh model: sample clients, aggregate their updates, evaluate on `test`."""
    fed = cfg.federated
    torch.manual_seed(cfg.train.seed)
    state = build_model(spec).state_dict()
    received = ReceivedLog({k: tuple(v.shape) for k, v in state.items()})
    result = FederatedResult(run.run_id, "", clients, received=received)
    delays = {list(clients).index(c): s for c, s in slow_clients.items()}
    tracker = RankTracker(run, 0)
    rng = np.random.default_rng(fed.seed)
    for round_index in range(fed.rounds):
        sampled = _sample(rng, len(clients), fed.client_fraction)
        state, stats = run_round(spark, rdd, cfg, spec, state, round_index, sampled, received, delays)
        stats.update(evaluate_arrays(spec, state, *test))
        result.history.append({"round": round_index, **stats})
        tracker.log(stats, round_index)
        log.info("round %d/%d: %d clients, %d late, %d clipped, test accuracy %.4f", round_index + 1, fed.rounds,
                 stats["clients"], stats["late"], stats["clipped"], stats["test_accuracy"])
    return state, result


def client_partitions(pipeline, rows: DataFrame, column: str):
    """One partition per client value, cached where it is: (features, label) rows only."""
    keyed = rows.withColumn(CLIENT, F.coalesce(F.col(column).cast("string"), F.lit("__missing__")))
    counts = keyed.groupBy(CLIENT).count().orderBy(F.desc("count"), CLIENT).collect()
    clients = {r[CLIENT]: r["count"] for r in counts}
    index = {c: i for i, c in enumerate(clients)}
    rdd = (to_feature_frame(pipeline, keyed, extra=(CLIENT,)).select(CLIENT, FEATURES, LABEL).rdd
           .map(lambda r: (r[0], (r[1], r[2])))
           .partitionBy(len(clients), lambda c: index[c])
           .values()
           .cache())
    return clients, rdd


def run_round(spark, rdd, cfg: JobConfig, spec: dict, state: dict, round_index: int, sampled: tuple[int, ...],
              received: ReceivedLog, delays: dict[int, float]) -> tuple[dict, dict[str, float]]:
    fed = cfg.federated
    stats = {"clients": float(len(sampled)), "late": 0.0, "clipped": 0.0, "skipped": 0.0, "update_norm": 0.0,
             "train_loss": float("nan")}
    if len(sampled) < fed.min_clients:
        stats["skipped"] = 1.0
        return state, stats
    noise_std = fed.noise_multiplier * (fed.clip_norm or 0.0) / math.sqrt(len(sampled))
    task = RoundTask(round_index, sampled, spec, state_dict_to_bytes(state), fed.local_epochs, fed.batch_size,
                     fed.learning_rate, fed.proximal_mu if fed.algorithm == "fedprox" else 0.0, fed.clip_norm,
                     noise_std, fed.round_timeout_s, slow_clients=tuple(delays.items()))
    if fed.secure_aggregation:
        keys = _on_clients(spark, rdd, sampled, public_key, task)
        for payload in keys:
            received.check(payload)
        task = RoundTask(**{**task.__dict__, "publics": {p["client"]: p["public"] for p in keys}})
    payloads = _on_clients(spark, rdd, sampled, client_update, task)
    total = {k: torch.zeros(v.shape, dtype=torch.float64) for k, v in state.items()}
    samples, loss_sum = 0, 0.0
    for payload in payloads:
        received.check(payload)
        samples += payload["samples"]
        loss_sum += payload["loss"] * payload["samples"]
        stats["late"] += payload["late"]
        stats["clipped"] += payload["clipped"]
        stats["update_norm"] = max(stats["update_norm"], payload["norm"])
        for k, u in payload["update"].items():
            total[k] += u  # masked, when secure: only the sum means anything
    on_time = len(sampled) - stats["late"]
    if on_time < fed.min_clients or samples == 0:
        stats["skipped"] = 1.0
        return state, stats
    new_state = {k: (v + (total[k] / samples).to(v.dtype)) if v.is_floating_point() else v for k, v in state.items()}
    stats["train_loss"] = loss_sum / samples  # the clients' local training loss, sample-weighted
    stats["noise_std_per_client"] = noise_std
    return new_state, stats


def _on_clients(spark, rdd, sampled: tuple[int, ...], fn, task: RoundTask) -> list[dict[str, Any]]:
    """Run `fn(index, rows, task)` inside each sampled client's partition; the rest do nothing."""
    chosen = set(sampled)
    broadcast = spark.sparkContext.broadcast(task)

    def per_partition(index, rows):
        if index in chosen:
            yield fn(index, rows, broadcast.value)

    try:
        return rdd.mapPartitionsWithIndex(per_partition).collect()
    finally:
        broadcast.unpersist()


def _sample(rng: np.random.Generator, n: int, fraction: float) -> tuple[int, ...]:
    k = max(1, round(n * fraction))
    return tuple(sorted(int(i) for i in rng.choice(n, size=k, replace=False)))


def _test_arrays(spark, cfg: JobConfig, pipeline) -> tuple[np.ndarray, np.ndarray]:
    """The driver's own held-out rows (the test file), as arrays for per-round evaluation."""
    with ingest(spark, cfg.data.test_path, cfg.data) as test_input:
        table = to_feature_frame(pipeline, test_input.accepted).toArrow()
    return features_to_numpy(table.column(FEATURES)), table.column(LABEL).to_numpy().astype(np.float32)


@torch.no_grad()
def evaluate_arrays(spec: dict, state: dict, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    model = build_model(spec)
    model.load_state_dict(state)
    model.eval()
    features, labels = torch.tensor(x), torch.tensor(y)  # copies: Arrow's buffers are read-only
    logits = model(features)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
    return {"test_accuracy": float(((logits > 0).float() == labels).float().mean()),
            "test_loss": float(loss)}


def result_lines(result: FederatedResult, cfg: JobConfig) -> str:
    fed = cfg.federated
    sizes = sorted(result.clients.values())
    last = result.history[-1]
    return "\n".join([
        "=== sparkml_dist federated ===",
        f"clients        : {len(result.clients)} by {fed.client_column} (rows {sizes[0]:,} .. {sizes[-1]:,}), "
        f"{fed.client_fraction:.0%} sampled per round",
        f"algorithm      : {fed.algorithm}, {fed.rounds} rounds x {fed.local_epochs} local epoch(s), "
        f"clip {fed.clip_norm}, noise multiplier {fed.noise_multiplier}, secure aggregation {fed.secure_aggregation}",
        "test accuracy  : " + " ".join(f"{h['test_accuracy']:.4f}" for h in result.history),
        f"late / skipped : {int(sum(h['late'] for h in result.history))} client-rounds late, "
        f"{int(sum(h['skipped'] for h in result.history))} rounds skipped",
        f"driver received: {result.received.payloads} payloads, every update shaped like the model's parameters",
        f"final          : test accuracy {last['test_accuracy']:.4f}, loss {last['test_loss']:.4f}",
        f"model          : {result.model_uri}",
    ])
