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
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkml_dist.config.schema import JobConfig
from sparkml_dist.data.dataset import split_frame
from sparkml_dist.data.features import ScoringPipeline, build_feature_pipeline, feature_names
from sparkml_dist.data.ingest import LABEL, WEIGHT, ingest
from sparkml_dist.data.labels import check_task, encode_labels, fit_target
from sparkml_dist.data.layout import VALUES, FeatureLayout
from sparkml_dist.data.loader import feature_columns, stored_features
from sparkml_dist.data.sources import ROW_ID, schema_of, with_types_of
from sparkml_dist.errors import ConfigError
from sparkml_dist.inference.predict import network_outputs
from sparkml_dist.methods.federated import secure
from sparkml_dist.methods.federated.checkpoints import (
    RoundsDone,
    clear_rounds,
    fingerprint,
    load_rounds,
    rounds_dir,
    save_round,
)
from sparkml_dist.methods.federated.client import RoundTask, client_update, public_key
from sparkml_dist.methods.federated.placement import (
    FEATURES,
    INDEX,
    TARGET,
    WEIGHT_OF_ROW,
    ClientRows,
    FrameClients,
    RddClients,
)
from sparkml_dist.methods.federated.privacy import RoundNoise, effective_multiplier, epsilon
from sparkml_dist.models.custom import check_custom_model, task_spec
from sparkml_dist.models.factory import build_model, model_spec
from sparkml_dist.models.spec import ModelSpec
from sparkml_dist.models.weights import state_dict_to_bytes
from sparkml_dist.spark.kind import is_connect
from sparkml_dist.storage.hadoop import atomic_dir
from sparkml_dist.storage.paths import OutputPaths
from sparkml_dist.tasks.base import Target
from sparkml_dist.train.records import EpochRecord, Evaluation

log = logging.getLogger(__name__)
CLIENT = "_client"


class UnexpectedPayload(RuntimeError):
    """A client sent something other than a parameter-shaped update: refused, never used."""


class FederatedRoundError(RuntimeError):
    """A round cannot be aggregated (a keyed client sent nothing): says why and what to do."""


@dataclass
class ReceivedLog:
    """What the driver received from clients: per payload, its keys and tensor shapes."""

    shapes: dict[str, tuple[int, ...]]
    payloads: int = 0
    largest_value: float = 0.0  # the largest |entry| of any single update seen (masked ones are huge)

    def check(self, payload: dict[str, Any]) -> None:
        allowed = {
            "client",
            "samples",
            "update",
            "masked",
            "late",
            "norm",
            "clipped",
            "loss",
            "public",
            "sealed",
        }
        if set(payload) - allowed:
            raise UnexpectedPayload(
                f"client {payload.get('client')}: unexpected fields {sorted(set(payload) - allowed)}"
            )
        update = payload.get("update")
        if update is not None:
            if {k: tuple(v.shape) for k, v in update.items()} != self.shapes:
                raise UnexpectedPayload(
                    f"client {payload['client']}: update is not shaped like the model's parameters"
                )
            self.largest_value = max(self.largest_value, max(float(v.abs().max()) for v in update.values()))
        masked = payload.get("masked")
        if masked is not None:
            size = sum(math.prod(shape) for shape in self.shapes.values())
            if not isinstance(masked, np.ndarray) or masked.dtype != np.uint64 or masked.shape != (size,):
                raise UnexpectedPayload(
                    f"client {payload['client']}: a masked update must be {size} ring words "
                    f"(uint64), one per model parameter"
                )
            self.largest_value = max(self.largest_value, float(np.abs(secure.dequantise(masked)).max()))
        self.payloads += 1


@dataclass
class FederatedResult:
    """The rounds' outcome: the global model, one record per round (evaluated on the driver's own
    test rows), the clients and what the driver received from them."""

    spec: ModelSpec
    weights: bytes
    feature_pipeline: str  # location of the pipeline fitted from Spark aggregates
    clients: dict[str, int]  # client value -> its rows (counted where they live)
    target: Target
    training_schema: dict[str, str]
    records: list[EpochRecord] = field(default_factory=list)
    received: ReceivedLog | None = None

    @property
    def score(self) -> float:
        """The final round's held-out metric on the driver's test rows (accuracy, or rmse)."""
        return self.records[-1].evaluated.value


RoundSink = Callable[[EpochRecord], object]  # an EpochSink: what it answers is not asked


def run_federated(
    spark: SparkSession,
    cfg: JobConfig,
    sink: RoundSink | None = None,
    slow_clients: dict[str, float] | None = None,
) -> FederatedResult:
    """The federated rounds over the clients of `federated.client_column`; `sink` gets each round's
    record. `slow_clients`: client value -> seconds of delay per batch (to exercise the round timeout)."""
    fed = cfg.federated
    if fed.client_column is None:
        raise ConfigError(
            "federated.client_column: name the column whose values are the clients, e.g. occupation"
        )
    with ingest(spark, cfg.data.train_path, cfg.data, key="data.train_path") as train_input:
        data = train_input.data
        check_task(cfg, data)
        # the target from Spark aggregates over every client (class counts, or the label's scale)
        target = fit_target(cfg, data, train_input.accepted)
        rows = encode_labels(train_input.accepted, target, data).known
        fit_rows, _ = split_frame(rows, data.validation_fraction, data.split_seed)
        pipeline = build_feature_pipeline(data, cfg.features).fit(fit_rows)
        names = feature_names(pipeline, fit_rows)
        spec = model_spec(cfg.model, len(names), names, target.kind.output_dim(target), task_spec(target))
        if spec.custom is not None:
            check_custom_model(spec.input_dim, spec.custom)
        clients, placed, layout = placed_clients(
            spark, pipeline, rows, fed.client_column, data.weight_column is not None
        )
        try:
            test = _test_arrays(spark, cfg, pipeline, target, schema_of(data))
            state, records, received = _run_rounds(
                cfg, spec, target, clients, placed, layout, test, slow_clients or {}, sink
            )
        finally:
            placed.release()
    pipeline_dir = OutputPaths.of(cfg).under("federated", "feature_pipeline")
    with atomic_dir(spark, pipeline_dir) as staging:  # travels inside the model: it scores raw rows
        pipeline.write().save(staging)
    clear_rounds(rounds_dir(cfg))  # finished: a new run of the job trains afresh
    schema = {c.name: f"{c.type}/{c.role}" for c in data.columns}
    return FederatedResult(
        spec, state_dict_to_bytes(state), pipeline_dir, clients, target, schema, records, received
    )


def _run_rounds(
    cfg: JobConfig,
    spec: ModelSpec,
    target: Target,
    clients: dict[str, int],
    placed: ClientRows,
    layout: FeatureLayout | None,
    test: HeldOut,
    slow_clients: dict[str, float],
    sink: RoundSink | None,
) -> tuple[dict, list[EpochRecord], ReceivedLog]:
    """The rounds from a fresh model, or from the last round an earlier run of this job completed
    (federated.checkpoints): sample clients, aggregate their updates, evaluate on `test`."""
    fed = cfg.federated
    torch.manual_seed(cfg.train.seed)
    state = build_model(spec).state_dict()
    received = ReceivedLog({k: tuple(v.shape) for k, v in state.items()})
    delays = {list(clients).index(c): s for c, s in slow_clients.items()}
    rng = np.random.default_rng(fed.seed)
    records: list[EpochRecord] = []
    where, config_fingerprint = rounds_dir(cfg), fingerprint(cfg)
    done = load_rounds(where, config_fingerprint)
    if done is not None:  # an earlier run of this job died after these rounds
        state, records = done.state, list(done.records)
        rng.bit_generator.state = done.sampler_state
        received.payloads, received.largest_value = done.payloads, done.largest_value
        log.info(
            "federated: resuming at round %d/%d from the checkpoint under %s",
            done.next_round + 1,
            fed.rounds,
            where,
        )
    for round_index in range(done.next_round if done else 0, fed.rounds):
        sampled = _sample(rng, len(clients), fed.client_fraction)
        started = time.perf_counter()
        state, stats = run_round(
            placed, cfg, spec, target, state, round_index, sampled, received, delays, layout
        )
        samples = int(stats.pop("samples"))
        if fed.noise_multiplier > 0:  # what the rounds so far spent, this one included
            stats["dp_epsilon"] = spent_epsilon([*(r.counters for r in records), stats], fed.dp_delta)
        e = evaluate_arrays(spec, state, test, target)
        record = EpochRecord(
            round_index,
            stats.pop("train_loss"),
            samples,
            samples / max(time.perf_counter() - started, 1e-9),
            e,
            counters=stats,
        )
        records.append(record)
        save_round(
            where,
            RoundsDone(
                round_index + 1,
                state,
                tuple(records),
                dict(rng.bit_generator.state),
                received.payloads,
                received.largest_value,
            ),
            config_fingerprint,
        )
        if sink is not None:
            sink(record)
        log.info(
            "round %d/%d: %d clients, %d late, %d clipped, test %s %.4f",
            round_index + 1,
            fed.rounds,
            stats["clients"],
            stats["late"],
            stats["clipped"],
            e.metric,
            e.value,
        )
    return state, records, received


def spent_epsilon(rounds: Sequence[Mapping[str, float]], delta: float) -> float:
    """(epsilon, delta)-DP of the released rounds (skipped rounds release nothing)."""
    return epsilon(
        [RoundNoise(r["dp_sample_rate"], r["dp_noise_multiplier"]) for r in rounds if "dp_sample_rate" in r],
        delta,
    )


def client_partitions(pipeline, rows: DataFrame, column: str, weighted: bool = False):
    """One partition per client value, cached where it is: (features, label, weight) rows only,
    the features compact (a value or a category's index per source column) when the pipeline
    compiles; returns the clients and their row counts, the RDD and the features' layout."""
    clients, index, frame, layout = _client_columns(pipeline, rows, column, weighted)
    rdd = (
        frame.select(CLIENT, FEATURES, TARGET, WEIGHT_OF_ROW)
        .rdd.map(lambda r: (r[0], (r[1], r[2], r[3])))
        .partitionBy(len(clients), lambda c: index[c])
        .values()
        .cache()
    )
    return clients, rdd, layout


def placed_clients(
    spark, pipeline, rows: DataFrame, column: str, weighted: bool = False
) -> tuple[dict[str, int], ClientRows, FeatureLayout | None]:
    """The clients, their rows where a round reaches them (`placement`), and the features' layout:
    one partition per client on a classic session, a DataFrame keyed by client on Spark Connect."""
    if not is_connect(spark):
        clients, rdd, layout = client_partitions(pipeline, rows, column, weighted)
        return clients, RddClients(spark, rdd, len(clients)), layout
    clients, index, frame, layout = _client_columns(pipeline, rows, column, weighted)
    by_index = F.create_map(*[F.lit(x) for pair in index.items() for x in pair])
    keyed = frame.select(by_index[F.col(CLIENT)].alias(INDEX), ROW_ID, FEATURES, TARGET, WEIGHT_OF_ROW)
    return clients, FrameClients(keyed, len(clients)), layout


def _client_columns(pipeline, rows: DataFrame, column: str, weighted: bool):
    """(clients and their row counts, each client's index, the rows as (row id, client, features,
    label, weight), the features' layout)."""
    keyed = rows.withColumn(CLIENT, F.coalesce(F.col(column).cast("string"), F.lit("__missing__")))
    counts = keyed.groupBy(CLIENT).count().orderBy(F.desc("count"), CLIENT).collect()
    clients = {r[CLIENT]: r["count"] for r in counts}
    index = {c: i for i, c in enumerate(clients)}
    extra = (CLIENT, WEIGHT) if weighted else (CLIENT,)
    weight = F.col(WEIGHT).cast("float") if weighted else F.lit(1.0).cast("float")
    frame, layout = ScoringPipeline.of(pipeline).frame(keyed, extra=extra)
    features = (
        F.concat(  # the compact row: a float per block, a VALUES block's array as it is
            *[
                F.col(b.column) if b.kind == VALUES else F.array(F.col(b.column).cast("float"))
                for b in layout.blocks
            ]
        )
        if layout is not None
        else F.col(feature_columns(None)[0])
    )
    selected = frame.select(
        ROW_ID, CLIENT, features.alias(FEATURES), F.col(LABEL).alias(TARGET), weight.alias(WEIGHT_OF_ROW)
    )
    return clients, index, selected, layout


def run_round(
    placed: ClientRows,
    cfg: JobConfig,
    spec: ModelSpec,
    target: Target,
    state: dict,
    round_index: int,
    sampled: tuple[int, ...],
    received: ReceivedLog,
    delays: dict[int, float],
    layout: FeatureLayout | None = None,
) -> tuple[dict, dict[str, float]]:
    fed = cfg.federated
    stats = {
        "clients": float(len(sampled)),
        "late": 0.0,
        "clipped": 0.0,
        "skipped": 0.0,
        "update_norm": 0.0,
        "train_loss": float("nan"),
        "samples": 0.0,
    }
    if len(sampled) < fed.min_clients:
        stats["skipped"] = 1.0
        return state, stats
    noise_std = fed.noise_multiplier * (fed.clip_norm or 0.0) / math.sqrt(len(sampled))
    task = RoundTask(
        round_index,
        sampled,
        spec,
        state_dict_to_bytes(state),
        fed.local_epochs,
        fed.batch_size,
        fed.learning_rate,
        fed.proximal_mu if fed.algorithm == "fedprox" else 0.0,
        fed.clip_norm,
        noise_std,
        fed.round_timeout_s,
        target=target,
        class_weights=target.balanced_weights() if cfg.train.class_weight == "balanced" else None,
        loss_kind=cfg.train.loss,
        slow_clients=tuple(delays.items()),
        layout=layout,
        precision=cfg.train.precision,
    )
    if fed.secure_aggregation:
        task = replace(task, round_salt=os.urandom(16))
        keys = placed.on_clients(sampled, public_key, task)
        for payload in keys:
            received.check(payload)
        task = replace(
            task,
            publics={p["client"]: p["public"] for p in keys},
            sealed={p["client"]: p["sealed"] for p in keys},
        )
    payloads = placed.on_clients(sampled, client_update, task)
    if task.publics is not None:
        _check_every_keyed_client_answered(task.publics, payloads, round_index)
    samples, loss_sum = 0, 0.0
    for payload in payloads:
        received.check(payload)
        samples += payload["samples"]
        loss_sum += payload["loss"] * payload["samples"]
        stats["late"] += payload["late"]
        stats["clipped"] += payload["clipped"]
        stats["update_norm"] = max(stats["update_norm"], payload["norm"])
    on_time = len(sampled) - stats["late"]
    if on_time < fed.min_clients or samples == 0:
        stats["skipped"] = 1.0
        return state, stats
    total = _sum_of_updates(payloads, state)
    stats["dp_sample_rate"] = len(sampled) / placed.count
    stats["dp_noise_multiplier"] = effective_multiplier(
        fed.noise_multiplier, [p["samples"] for p in payloads]
    )
    new_state = {
        k: (v + (total[k] / samples).to(v.dtype)) if v.is_floating_point() else v for k, v in state.items()
    }
    stats["train_loss"] = loss_sum / samples  # the clients' local training loss, sample-weighted
    stats["samples"] = float(samples)
    stats["noise_std_per_client"] = noise_std
    return new_state, stats


def _check_every_keyed_client_answered(
    publics: dict[int, bytes], payloads: list[dict], round_index: int
) -> None:
    missing = sorted(set(publics) - {p["client"] for p in payloads})
    if missing:
        raise FederatedRoundError(
            f"round {round_index + 1}: client(s) {missing} took part in the key exchange but sent no masked update; "
            f"without their masks the sum cannot be unmasked (this secure aggregation has no dropout recovery). "
            f"Re-run the job: it resumes at this round with fresh keys"
        )


def _sum_of_updates(payloads: list[dict], state: dict) -> dict[str, torch.Tensor]:
    """The sample-weighted sum of the updates; masked ones are summed as integers in the ring, where
    the masks cancel exactly, and only the sum is dequantised."""
    if payloads and "masked" in payloads[0]:
        ring = np.zeros_like(payloads[0]["masked"])
        for payload in payloads:
            ring = ring + payload["masked"]  # uint64: wraps, as the ring does
        flat, total, offset = torch.from_numpy(secure.dequantise(ring)), {}, 0
        for k, v in state.items():
            total[k] = flat[offset : offset + v.numel()].reshape(v.shape)
            offset += v.numel()
        return total
    total = {k: torch.zeros(v.shape, dtype=torch.float64) for k, v in state.items()}
    for payload in payloads:
        for k, u in payload["update"].items():
            total[k] += u
    return total


def _sample(rng: np.random.Generator, n: int, fraction: float) -> tuple[int, ...]:
    k = max(1, round(n * fraction))
    return tuple(sorted(int(i) for i in rng.choice(n, size=k, replace=False)))


@dataclass(frozen=True)
class HeldOut:
    """The driver's test rows as arrays: features (compact when `layout` is set, see
    data/layout.py) and packed (label, weight) targets."""

    x: np.ndarray
    y: np.ndarray
    layout: FeatureLayout | None = None


def _test_arrays(spark, cfg: JobConfig, pipeline, target: Target, schema: Mapping[str, str]) -> HeldOut:
    """The driver's own held-out rows (the test file; rows whose label the target does not know
    left out, read with the training rows' types, `schema`), for per-round evaluation."""
    with ingest(
        spark, cfg.data.test_path, with_types_of(cfg.data, schema), key="data.test_path"
    ) as test_input:
        rows = encode_labels(test_input.accepted, target, test_input.data).known
        weighted = test_input.data.weight_column is not None
        frame, layout = ScoringPipeline.of(pipeline).frame(rows, extra=(WEIGHT,) if weighted else ())
        table = frame.toArrow()
    y = np.ones((table.num_rows, 2), np.float32)
    y[:, 0] = table.column(LABEL).to_numpy()
    if weighted:
        y[:, 1] = table.column(WEIGHT).to_numpy()
    return HeldOut(
        stored_features(table, layout, where=f"{cfg.data.test_path} (federated test rows)"), y, layout
    )


def evaluate_arrays(
    spec: ModelSpec, state: dict, test: HeldOut, target: Target, batch_rows: int = 4096
) -> Evaluation:
    model = build_model(spec)
    model.load_state_dict(state)
    model.eval()
    outputs = torch.from_numpy(network_outputs(model, test.x, batch_rows, test.layout))
    sums = target.kind.held_out_sums(target, outputs, torch.tensor(test.y))
    loss_sum, metric_sum, weight_sum = (float(v) for v in sums)
    return target.kind.held_out(target, loss_sum, metric_sum, weight_sum, rows="test")


def result_lines(result: FederatedResult, cfg: JobConfig, model_uri: str) -> str:
    fed = cfg.federated
    sizes = sorted(result.clients.values())
    last = result.records[-1].evaluated
    counters = result.records[-1].counters
    payloads = result.received.payloads if result.received is not None else 0
    return "\n".join(
        [
            "=== sparkml_dist federated ===",
            f"clients        : {len(result.clients)} by {fed.client_column} (rows {sizes[0]:,} .. {sizes[-1]:,}), "
            f"{fed.client_fraction:.0%} sampled per round",
            f"algorithm      : {fed.algorithm}, {fed.rounds} rounds x {fed.local_epochs} local epoch(s), "
            f"clip {fed.clip_norm}, noise multiplier {fed.noise_multiplier}, secure aggregation {fed.secure_aggregation}",
            f"test {last.metric:10s}: " + " ".join(f"{r.evaluated.value:.4f}" for r in result.records),
            *(
                [
                    f"privacy        : ({counters['dp_epsilon']:.2f}, {fed.dp_delta:g})-DP at the client level "
                    f"(Opacus RDP accountant)"
                ]
                if "dp_epsilon" in counters
                else []
            ),
            f"late / skipped : {int(sum(r.counters['late'] for r in result.records))} client-rounds late, "
            f"{int(sum(r.counters['skipped'] for r in result.records))} rounds skipped",
            f"driver received: {payloads} payloads, every update shaped like the model's parameters",
            f"final          : test {last.metric} {last.value:.4f}, loss {last.loss:.4f}",
            f"model          : {model_uri}",
        ]
    )
