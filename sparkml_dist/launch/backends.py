"""Communication backends. A backend object is small config that travels to the ranks; any
driver-side service it needs (a rendezvous server) lives in the handle `driver_start` returns."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from sparkml_dist.launch.context import RankContext


class DriverHandle:
    """Driver-side state of a backend for one launch; `extra` is passed to every rank."""

    def __init__(self) -> None:
        self.extra: dict[str, str] = {}

    def stop(self) -> None:
        pass


class Backend(Protocol):
    name: str

    def driver_start(self, num_ranks: int, driver_host: str) -> DriverHandle: ...

    def rank_env(self, ctx: RankContext) -> dict[str, str]: ...

    def rank_init(self, ctx: RankContext) -> None: ...

    def rank_shutdown(self) -> None: ...


def pick_device(ctx: RankContext, preference: str) -> str:
    """'cuda:<i>' for the GPU Spark assigned this task (or its local rank), else 'cpu'."""
    import torch

    if preference == "cpu" or not torch.cuda.is_available():
        if preference == "cuda":
            raise RuntimeError(f"rank {ctx.rank}: train.device=cuda but torch sees no GPU on {ctx.host}")
        return "cpu"
    return f"cuda:{gpu_index(ctx, torch.cuda.device_count())}"


def gpu_index(ctx: RankContext, device_count: int) -> int:
    """The GPU a rank uses: the address Spark assigned to its task (spark.task.resource.gpu.amount),
    else its local rank, so ranks sharing a host never share a GPU."""
    if ctx.gpus:
        index = int(ctx.gpus[0])
        if index >= device_count:
            raise RuntimeError(f"rank {ctx.rank}: Spark assigned GPU {index} but torch sees {device_count} GPU(s) "
                               f"on {ctx.host}; check the discovery script and CUDA_VISIBLE_DEVICES")
        return index
    if ctx.local_size > device_count:
        raise RuntimeError(f"rank {ctx.rank}: {ctx.local_size} ranks on {ctx.host} but only {device_count} GPU(s); "
                           f"set spark.task.resource.gpu.amount=1 so Spark places one rank per GPU")
    return ctx.local_rank


@dataclass(frozen=True)
class TorchBackend:
    """torch.distributed: gloo on CPU, nccl when the rank owns a GPU. Rendezvous over TCP at rank 0."""

    device: str = "auto"
    timeout_s: int = 300
    name: str = "torch"
    # fork a fresh process per rank: DTensor / DCP keep process-wide caches keyed by the mesh's
    # shape, which a reused Spark worker that now holds another rank would hit (wrong shard
    # offsets in a checkpoint); the model-parallel strategies ask for it, DDP does not need it
    needs_fresh_process: bool = False

    def driver_start(self, num_ranks: int, driver_host: str) -> DriverHandle:
        return DriverHandle()

    def rank_env(self, ctx: RankContext) -> dict[str, str]:
        env = {
            "MASTER_ADDR": ctx.master_addr,
            "MASTER_PORT": str(ctx.master_port),
            "RANK": str(ctx.rank),
            "WORLD_SIZE": str(ctx.world_size),
            "LOCAL_RANK": str(ctx.local_rank),
            "LOCAL_WORLD_SIZE": str(ctx.local_size),
        }
        if ctx.master_addr in ("127.0.0.1", "localhost"):
            env["GLOO_SOCKET_IFNAME"] = "lo"  # all ranks on loopback: keep gloo off other NICs
            env["TP_SOCKET_IFNAME"] = "lo"  # and TensorPipe (torch RPC, the async strategy)
        return env

    def rank_init(self, ctx: RankContext) -> None:
        import torch
        import torch.distributed as dist

        device = pick_device(ctx, self.device)
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))
        dist.init_process_group(
            backend="nccl" if device.startswith("cuda") else "gloo",
            init_method=f"tcp://{ctx.master_addr}:{ctx.master_port}",
            rank=ctx.rank,
            world_size=ctx.world_size,
            timeout=timedelta(seconds=self.timeout_s),
        )

    def rank_shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def get_backend(name: str, device: str = "auto", timeout_s: int = 300, **options) -> Backend:
    """The backend by name; `options` are backend-specific (Horovod: cycle_time_ms, fusion_threshold_mib)."""
    if name == "torch":
        return TorchBackend(device=device, timeout_s=timeout_s, **options)
    if name == "horovod":
        from sparkml_dist.launch.horovod_backend import HorovodBackend

        return HorovodBackend(device=device, timeout_s=timeout_s, **options)
    raise ValueError(f"unknown backend {name!r}; known: torch, horovod")


def backend_for(train) -> Backend:
    """The backend a TrainConfig asks for, with its options."""
    options = {"needs_fresh_process": train.strategy != "ddp"}
    if train.backend == "horovod":  # always forks
        options = {"cycle_time_ms": train.horovod.cycle_time_ms, "fusion_threshold_mib": train.horovod.fusion_threshold_mib}
    return get_backend(train.backend, train.device, train.timeout_s, **options)
