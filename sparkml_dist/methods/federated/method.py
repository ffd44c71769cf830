"""train.strategy=federated: federated learning over Spark partitions, one client per value of
`federated.client_column`. A driver-side algorithm (not a barrier stage): each round the driver
broadcasts the global weights, sampled clients train inside their own partitions and only
parameter-shaped updates come back (`sparkml_dist.methods.federated`). Options: the `federated` section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from sparkml_dist.config.schema import JobConfig
from sparkml_dist.config.train import TrainConfig
from sparkml_dist.methods.base import LaunchNeeds, TrainMethod, TrainRequest, register_method
from sparkml_dist.train.records import RankStats, TrainedModel, TrainOutcome

if TYPE_CHECKING:
    from sparkml_dist.methods.federated.server import FederatedResult


class FederatedTrainConfig(TrainConfig):
    dataframe_input: ClassVar[bool] = False
    strategy: Literal["federated"] = Field(
        "federated", description="federated rounds over client partitions (options: the federated section)"
    )

    def check_job(self, job: JobConfig) -> None:
        if job.federated.client_column is None:
            raise ValueError(
                "train.strategy=federated needs federated.client_column: the column whose values are "
                "the clients, e.g. occupation"
            )


@dataclass(frozen=True)
class FederatedMethod(TrainMethod):
    name: str = "federated"
    config: type[TrainConfig] = FederatedTrainConfig
    summary: str = (
        "federated averaging (FedAvg/FedProx) over clients = values of a column, rows kept in their "
        "partitions; clipping, noise and secure aggregation"
    )

    def needs(self, cfg: TrainConfig) -> LaunchNeeds:
        return LaunchNeeds(0)  # no barrier stage: the driver runs the rounds, clients are ordinary tasks

    def run(self, request: TrainRequest, slow_clients: dict[str, float] | None = None) -> TrainOutcome:
        """`slow_clients` (tests): client value -> seconds of delay per batch."""
        # pyspark, torch: not while a config picks its method
        from sparkml_dist.methods.federated.server import run_federated

        return outcome_of(run_federated(request.spark, request.cfg, request.sink, slow_clients), request.cfg)


def outcome_of(result: FederatedResult, cfg: JobConfig) -> TrainOutcome:
    model = TrainedModel(
        result.spec, result.weights, result.feature_pipeline, result.training_schema, result.target
    )
    clients = tuple(
        RankStats(rank=i, role="client", samples=rows) for i, rows in enumerate(result.clients.values())
    )
    return TrainOutcome("federated", model, tuple(result.records), clients, unit="round", detail=result)


FEDERATED = register_method(FederatedMethod())
