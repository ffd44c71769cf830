"""torch.distributed as a backend: gloo on CPU, nccl when the rank owns a GPU."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sparkml_dist.launch.backend import DriverHandle, joining_the_group, pick_device
from sparkml_dist.launch.context import RankContext
from sparkml_dist.launch.netif import interface_for
from sparkml_dist.launch.ports import PortRange
from sparkml_dist.launch.rendezvous import AGENT_STORE_ENV, BoundStore


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
    # False: only the torchrun environment is set and the rank's own code calls
    # init_process_group() (the TorchDistributor API); the group is still destroyed after it
    init_group: bool = True
    # the launcher hosts the rendezvous store on rank 0's task address (launch.rendezvous)
    hosts_store: bool = True

    def driver_start(
        self, num_ranks: int, driver_host: str, secret: bytes, ports: PortRange | None = None
    ) -> DriverHandle:
        return DriverHandle()  # the store lives in rank 0's task (launch.rendezvous)

    def rendezvous_server(self, world_size: int) -> BoundStore:
        return BoundStore("127.0.0.1", world_size, self.timeout_s)

    def preload(self) -> None:
        # torch's optimizers import torch._dynamo when the first is made (1.3 s): here, before the
        # rendezvous, and kept by a reused worker and inherited by a forked rank
        import torch._dynamo
        import torch.distributed  # noqa: F401

    def rendezvous_gateway(self, ctx: RankContext) -> tuple[str, int]:
        return ctx.master_addr, ctx.master_port

    def rendezvous_env(self, forwarder_port: int) -> dict[str, str]:
        return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(forwarder_port)}

    def rank_env(self, ctx: RankContext) -> dict[str, str]:
        env = {
            "MASTER_ADDR": ctx.master_addr,
            "MASTER_PORT": str(ctx.master_port),
            "RANK": str(ctx.rank),
            "WORLD_SIZE": str(ctx.world_size),
            "LOCAL_RANK": str(ctx.local_rank),
            "LOCAL_WORLD_SIZE": str(ctx.local_size),
            **AGENT_STORE_ENV,
            # every rank waits in init_process_group until all have joined: otherwise a rank whose
            # function has no collective can finish and destroy the group while a slower rank is
            # still inside gloo's full-mesh connect, which then fails ("Connection closed by peer")
            "TORCH_DIST_INIT_BARRIER": "1",
        }
        # gloo's listeners on the interface of the task's own address, not the host's default one
        return env | {"GLOO_SOCKET_IFNAME": interface_for(ctx.host)}

    def rank_init(self, ctx: RankContext) -> None:
        if not self.init_group:
            return
        import torch
        import torch.distributed as dist

        device = pick_device(ctx, self.device)
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))
        with joining_the_group(ctx, "torch.distributed"):
            dist.init_process_group(
                backend="nccl" if device.startswith("cuda") else "gloo",
                init_method="env://",  # joins the store the launcher hosts (rank_env)
                rank=ctx.rank,
                world_size=ctx.world_size,
                timeout=timedelta(seconds=self.timeout_s),
            )

    def rank_shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
