"""train.strategy=ddp: data parallelism. Every rank holds the whole model and trains on its own
shard of the rows; gradients are averaged with torch.distributed DDP (gloo on CPU, nccl on GPU)
or, with `train.backend=horovod`, with Horovod AllReduce."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field, model_validator

from sparkml_dist.config.section import Section
from sparkml_dist.config.train import TrainConfig
from sparkml_dist.launch.backends import BACKENDS, backend_names
from sparkml_dist.methods.base import LaunchNeeds, register_method
from sparkml_dist.methods.loop import LoopMethod

if TYPE_CHECKING:
    from sparkml_dist.train.parallelism import Parallelism


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

    @classmethod
    def backends(cls) -> tuple[str, ...]:
        return tuple(backend_names())  # every registered backend says how ddp places a rank on it

    @model_validator(mode="after")
    def _the_backends_own_keys(self) -> DataParallelConfig:
        """Another backend's options are refused (they would be ignored), then the chosen
        backend checks what it cannot do."""
        for name, spec in BACKENDS:
            if name == self.backend:
                continue
            for key in spec.own_keys:
                if getattr(self, key) != type(self).model_fields[key].get_default(call_default_factory=True):
                    raise ValueError(
                        f"train.{key} is an option of train.backend={name}, and train.backend is "
                        f"{self.backend}: remove it or set train.backend={name}"
                    )
        BACKENDS.get(self.backend).check(self)
        return self


def place_data_parallel(cfg: DataParallelConfig, world_size: int, rank: int) -> Parallelism:
    return BACKENDS.get(cfg.backend).place_data_parallel(cfg, world_size, rank)


class DataParallelMethod(LoopMethod[DataParallelConfig]):
    def needs(self, cfg: DataParallelConfig) -> LaunchNeeds:
        spec = BACKENDS.get(cfg.backend)
        return LaunchNeeds(
            cfg.num_ranks,
            cfg.backend,
            self.fresh_process or spec.forks_every_launch,
            dict(spec.launch_options(cfg)),
        )


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
