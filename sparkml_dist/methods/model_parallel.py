"""Model parallelism inside the rank loop, for models too large for one device: fsdp shards
parameters, gradients and optimizer state; tensor splits each attention and MLP layer; pipeline
puts consecutive blocks on consecutive ranks; hybrid is FSDP across groups of tensor-parallel
ranks. All but fsdp cut a transformer's layers (model.kind=transformer)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, model_validator

from sparkml_dist.config.schema import JobConfig
from sparkml_dist.config.section import Section
from sparkml_dist.config.train import TrainConfig
from sparkml_dist.methods.base import register_method
from sparkml_dist.methods.loop import LoopMethod
from sparkml_dist.models.kinds import MODEL_KINDS, kinds_that_cut_into_layers

if TYPE_CHECKING:
    from sparkml_dist.train.parallelism import Parallelism


def _needs_transformer(cfg: TrainConfig, job: JobConfig) -> None:
    if not MODEL_KINDS.get(job.model.kind).cuts_into_layers:
        raise ValueError(
            f"train.strategy={cfg.strategy} cuts a transformer's layers into shards, which it cannot do "
            f"for model.kind={job.model.kind}; set model.kind={' or '.join(kinds_that_cut_into_layers())}, "
            f"or use train.strategy=ddp or fsdp (they take any model, custom ones included)"
        )


def _tensor_parallel_fits(job: JobConfig, size: int) -> None:
    t = job.model.transformer
    if t.heads % size:
        raise ValueError(
            f"model.transformer.heads ({t.heads}) must be divisible by the tensor-parallel size ({size})"
        )
    if t.mlp_hidden % size:
        raise ValueError(
            f"model.transformer.mlp_hidden ({t.mlp_hidden}) must be divisible by the tensor-parallel "
            f"size ({size})"
        )


class FsdpConfig(TrainConfig):
    elastic: ClassVar[bool] = True  # any world size: the loader cuts the rows for it
    strategy: Literal["fsdp"] = Field(
        "fsdp", description="FSDP2: parameters, gradients and optimizer state sharded"
    )


class TensorConfig(TrainConfig):
    dataframe_input: ClassVar[bool] = False
    strategy: Literal["tensor"] = Field("tensor", description="tensor parallelism over all ranks (DTensor)")

    def check_job(self, job: JobConfig) -> None:
        _needs_transformer(self, job)
        _tensor_parallel_fits(job, self.num_ranks)


class PipelineOptions(Section):
    microbatches: int = Field(4, ge=1, description="micro-batches per batch")
    schedule: Literal["gpipe", "1f1b"] = Field("1f1b", description="pipeline schedule")


class PipelineConfig(TrainConfig):
    dataframe_input: ClassVar[bool] = False
    strategy: Literal["pipeline"] = Field(
        "pipeline", description="consecutive transformer blocks on consecutive ranks"
    )
    parallel: PipelineOptions = Field(default_factory=PipelineOptions, description="the pipeline's schedule")

    @model_validator(mode="after")
    def _batches_split(self) -> PipelineConfig:
        if self.num_ranks < 2:
            raise ValueError(
                f"train.strategy=pipeline puts consecutive blocks on consecutive ranks and needs at "
                f"least 2 (train.num_ranks is {self.num_ranks}); for one rank use train.strategy=ddp"
            )
        if self.batch_size % self.parallel.microbatches:
            raise ValueError(
                f"train.batch_size ({self.batch_size}) must be divisible by "
                f"train.parallel.microbatches ({self.parallel.microbatches})"
            )
        return self

    def check_job(self, job: JobConfig) -> None:
        _needs_transformer(self, job)
        if job.model.transformer.layers < self.num_ranks:
            raise ValueError(
                f"train.strategy=pipeline puts at least one block per rank: model.transformer.layers "
                f"({job.model.transformer.layers}) must be >= train.num_ranks ({self.num_ranks})"
            )


class HybridOptions(Section):
    tensor_parallel: int = Field(
        2, ge=1, description="ranks per tensor-parallel group (data parallel = num_ranks / this)"
    )


class HybridConfig(TrainConfig):
    dataframe_input: ClassVar[bool] = False
    strategy: Literal["hybrid"] = Field(
        "hybrid", description="FSDP across groups of tensor-parallel ranks (2-D mesh)"
    )
    parallel: HybridOptions = Field(
        default_factory=HybridOptions, description="the mesh's tensor-parallel size"
    )

    @model_validator(mode="after")
    def _mesh_fits(self) -> HybridConfig:
        tp = self.parallel.tensor_parallel
        if tp < 2 or self.num_ranks % tp or self.num_ranks // tp < 2:
            raise ValueError(
                f"train.strategy=hybrid needs train.num_ranks ({self.num_ranks}) = data parallel (>=2) "
                f"x train.parallel.tensor_parallel ({tp}, >=2), e.g. 4 ranks as 2x2"
            )
        return self

    def check_job(self, job: JobConfig) -> None:
        _needs_transformer(self, job)
        _tensor_parallel_fits(job, self.parallel.tensor_parallel)


def place_fsdp(cfg: FsdpConfig, world_size: int, rank: int) -> Parallelism:
    # torch, numpy: not while a config picks its method
    from sparkml_dist.train.parallel.mesh import FullyShardedDataParallel

    return FullyShardedDataParallel(world_size, rank)


def place_tensor(cfg: TensorConfig, world_size: int, rank: int) -> Parallelism:
    # torch, numpy: not while a config picks its method
    from sparkml_dist.train.parallel.mesh import TensorParallel

    return TensorParallel(world_size, rank)


def place_pipeline(cfg: PipelineConfig, world_size: int, rank: int) -> Parallelism:
    # torch, numpy: not while a config picks its method
    from sparkml_dist.train.parallel.pipeline import PipelineParallel

    return PipelineParallel(
        world_size, rank, cfg.parallel.microbatches, cfg.parallel.schedule, cfg.batch_size
    )


def place_hybrid(cfg: HybridConfig, world_size: int, rank: int) -> Parallelism:
    # torch, numpy: not while a config picks its method
    from sparkml_dist.train.parallel.mesh import HybridParallel

    return HybridParallel(world_size, rank, cfg.parallel.tensor_parallel)


FSDP = register_method(
    LoopMethod(
        "fsdp",
        FsdpConfig,
        place_fsdp,
        summary="FSDP2 (fully_shard): each rank holds 1/N of parameters, gradients and optimizer state",
    )
)
TENSOR = register_method(
    LoopMethod(
        "tensor",
        TensorConfig,
        place_tensor,
        summary="tensor parallelism (DTensor): attention and MLP split column/row-wise over all ranks",
    )
)
PIPELINE = register_method(
    LoopMethod(
        "pipeline",
        PipelineConfig,
        place_pipeline,
        summary="pipeline parallelism (torch.distributed.pipelining, GPipe or 1F1B) over transformer blocks",
    )
)
HYBRID = register_method(
    LoopMethod(
        "hybrid",
        HybridConfig,
        place_hybrid,
        summary="2-D mesh: tensor parallel inside groups of train.parallel.tensor_parallel ranks, FSDP across them",
    )
)
