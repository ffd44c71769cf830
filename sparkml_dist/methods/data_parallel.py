"""train.strategy=ddp: data parallelism. Every rank holds the whole model and trains on its own
shard of the rows; gradients are averaged with torch.distributed DDP (gloo on CPU, nccl on GPU)
or, with `train.backend=horovod`, with Horovod AllReduce."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, model_validator

from sparkml_dist.config.schema import Section, TrainConfig
from sparkml_dist.methods.base import LaunchNeeds, register_method
from sparkml_dist.methods.loop import LoopMethod

if TYPE_CHECKING:
    from sparkml_dist.train.strategies import Strategy


class HorovodConfig(Section):
    """Options of the Horovod backend. What Horovod on CPU/Gloo cannot do is refused here."""

    compression: Literal["none", "fp16", "bf16"] = Field(
        "none", description="gradient compression on the wire"
    )
    backward_passes_per_step: int = Field(1, ge=1, description="gradient accumulation before each allreduce")
    reduce_op: Literal["average", "adasum"] = Field("average", description="how gradients are combined")
    sync_batch_norm: bool = Field(
        False, description="synchronise BatchNorm statistics across ranks (GPU only)"
    )
    cycle_time_ms: float = Field(
        1.0, gt=0.0, le=100.0, description="HOROVOD_CYCLE_TIME: background loop period"
    )
    fusion_threshold_mib: int = Field(
        64, ge=0, description="HOROVOD_FUSION_THRESHOLD: tensor fusion buffer size"
    )


class DataParallelConfig(TrainConfig):
    """train.strategy=ddp (the default)."""

    elastic: ClassVar[bool] = True  # any world size: the loader cuts the rows for it

    supported_backends = ("torch", "horovod")
    precisions = ("fp32", "bf16", "fp16")
    cuda_graphs = True

    strategy: Literal["ddp"] = Field("ddp", description="data parallelism: a full replica per rank")
    horovod: HorovodConfig = Field(default_factory=HorovodConfig, description="with train.backend=horovod")
    intra_host_allreduce: Literal["shared_memory", "process_group"] = Field(
        "shared_memory",
        description="with train.backend=torch on CPU: how ranks average gradients. 'shared_memory': "
        "through a segment in /dev/shm when every rank can open it (one host) and it has room for 2 x ranks x "
        "one DDP bucket (at most 25 MiB plus the largest parameter), else the process group (gloo); "
        "'process_group': always gloo's allreduce",
    )

    @model_validator(mode="after")
    def _horovod_options_are_possible(self) -> DataParallelConfig:
        h = self.horovod
        if self.backend == "horovod" and self.intra_host_allreduce != "shared_memory":
            raise ValueError(
                "train.intra_host_allreduce is an option of train.backend=torch; Horovod averages "
                "through its own backend. Remove it or set train.backend=torch"
            )
        if self.backend != "horovod":
            if h != HorovodConfig():
                raise ValueError(
                    "train.horovod.* is set but train.backend is not 'horovod'; set train.backend=horovod"
                )
            return self
        on_gpu = self.device == "cuda"
        if self.cuda_graph == "on":
            raise ValueError(
                "train.cuda_graph=on: Horovod averages gradients from hooks inside backward, which a "
                "CUDA graph cannot capture; use train.backend=torch, or train.cuda_graph=auto/off"
            )
        if h.compression == "bf16":
            raise ValueError(
                "train.horovod.compression=bf16: Horovod 0.28 has no bf16 (it refuses bf16 tensors on "
                "Gloo and on NCCL alike); use 'fp16' or 'none' (train.precision=bf16 still trains in bf16: its "
                "gradients are fp32, and are averaged as such)"
            )
        if h.reduce_op == "adasum":
            raise ValueError(
                "train.horovod.reduce_op=adasum needs Horovod built with MPI; this build uses Gloo "
                "only. Use 'average'"
            )
        if h.sync_batch_norm and not on_gpu:
            raise ValueError(
                "train.horovod.sync_batch_norm: Horovod's SyncBatchNorm runs on GPUs only; "
                "set it to false or train.device=cuda"
            )
        return self


def place_data_parallel(cfg: DataParallelConfig, world_size: int, rank: int) -> Strategy:
    from sparkml_dist.train.strategies import DataParallel

    if cfg.backend == "horovod":
        from sparkml_dist.train.horovod_strategy import HorovodDataParallel

        return HorovodDataParallel(
            world_size, rank, cfg.horovod.compression, cfg.horovod.backward_passes_per_step
        )
    return DataParallel(
        world_size,
        rank,
        shared_memory=cfg.intra_host_allreduce == "shared_memory",
        cuda_graph=cfg.cuda_graph,
        batch_size=cfg.batch_size,
    )


class DataParallelMethod(LoopMethod):
    def needs(self, cfg: DataParallelConfig) -> LaunchNeeds:
        if cfg.backend == "horovod":  # its backend always forks: hvd.init() cannot run twice in one process
            return LaunchNeeds(
                cfg.num_ranks,
                "horovod",
                True,
                {
                    "cycle_time_ms": cfg.horovod.cycle_time_ms,
                    "fusion_threshold_mib": cfg.horovod.fusion_threshold_mib,
                },
            )
        return super().needs(cfg)


DDP = register_method(
    DataParallelMethod(
        name="ddp",
        config=DataParallelConfig,
        placement=place_data_parallel,
        fresh_process=False,
        summary="data parallelism (DDP, or Horovod with train.backend=horovod): a full replica per rank, "
        "gradients averaged; the default and the fastest when the model fits one device",
    )
)
