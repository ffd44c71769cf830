"""train.strategy=async's keys: how many ranks serve the parameters, and what a stale update
becomes."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from sparkml_dist.config.section import Section
from sparkml_dist.config.train import TrainConfig


class AsyncOptions(Section):
    servers: int = Field(
        1, ge=1, description="ranks 0..servers-1 hold the parameters (sharded by name); the rest are workers"
    )
    max_staleness: int = Field(
        4, ge=0, description="an update computed on parameters this many versions old or older is stale"
    )
    stale_policy: Literal["drop", "downweight"] = Field(
        "drop", description="drop a too-stale update, or scale it by 1/(1+staleness)"
    )


class AsyncConfig(TrainConfig):
    dataframe_input: ClassVar[bool] = False
    strategy: Literal["async"] = Field("async", description="parameter servers and asynchronous SGD")
    async_ps: AsyncOptions = Field(
        default_factory=AsyncOptions, description="servers and the staleness policy"
    )

    @model_validator(mode="after")
    def _has_workers(self) -> AsyncConfig:
        if self.num_ranks <= self.async_ps.servers:
            raise ValueError(
                f"train.strategy=async needs workers: train.num_ranks ({self.num_ranks}) must exceed "
                f"train.async_ps.servers ({self.async_ps.servers})"
            )
        return self
