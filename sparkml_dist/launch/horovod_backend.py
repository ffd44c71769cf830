"""Horovod backend without horovod.spark: Horovod's Gloo rendezvous HTTP server runs in rank 0's
task, on loopback (Horovod's own helper binds all interfaces and admits anyone), as torch's store
does (launch.rendezvous). The one port the ranks reach is the launch's authenticated gateway on
rank 0's task address (launch.gateway): each rank's Horovod joins through its own loopback
forwarder, which proves the launch's secret. Nothing lives on the driver, so Horovod trains from a
Spark Connect client as from a classic driver. Each barrier task gets the Horovod rank
environment derived from BarrierTaskContext."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from sparkml_dist.launch.backend import DriverHandle, joining_the_group, pick_device
from sparkml_dist.launch.context import RankContext
from sparkml_dist.launch.netif import interface_for
from sparkml_dist.launch.ports import PortRange


class LoopbackRendezvous:
    """One Horovod rendezvous server per launch (fresh key/value state) on loopback, served by a
    thread of rank 0's task until `close`."""

    def __init__(self) -> None:
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

        self._server = RendezvousHTTPServer(("127.0.0.1", 0), RendezvousHandler, 0)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="hvd-rendezvous", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


@dataclass(frozen=True)
class HorovodBackend:
    device: str = "auto"
    timeout_s: int = 300
    cycle_time_ms: float = 1.0
    fusion_threshold_mib: int = 64
    timeline: bool = False  # HOROVOD_TIMELINE=DYNAMIC: ranks may hvd.start_timeline() (profiling)
    name: str = "horovod"
    # hvd.init() segfaults in a reused Spark Python worker: each rank runs in a forked child
    needs_fresh_process: bool = True
    hosts_store: bool = True  # Horovod's rendezvous server runs in rank 0's task, behind the gateway

    def driver_start(
        self, num_ranks: int, driver_host: str, secret: bytes, ports: PortRange | None = None
    ) -> DriverHandle:
        return DriverHandle()  # the rendezvous lives in rank 0's task

    def rendezvous_server(self, world_size: int) -> LoopbackRendezvous:
        return LoopbackRendezvous()

    def preload(self) -> None:
        # not Horovod, which the forked child that calls hvd.init() imports; torch and the
        # torch._dynamo its optimizers import when the first is made (1.3 s): the Python worker
        # keeps them for every rank it forks, instead of each child importing them again
        import torch._dynamo  # noqa: F401

    def rendezvous_gateway(self, ctx: RankContext) -> tuple[str, int]:
        return ctx.master_addr, ctx.master_port

    def rendezvous_env(self, forwarder_port: int) -> dict[str, str]:
        return {
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(forwarder_port),
        }

    def rank_env(self, ctx: RankContext) -> dict[str, str]:
        return {
            **ctx.extra,
            # rank 0's gateway; `rendezvous_env` points the rank's own Horovod at its forwarder
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": ctx.master_addr,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(ctx.master_port),
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_TIMEOUT_SECONDS": str(self.timeout_s),
            "HOROVOD_CYCLE_TIME": str(self.cycle_time_ms),
            "HOROVOD_FUSION_THRESHOLD": str(self.fusion_threshold_mib * 1024 * 1024),
            "HOROVOD_GLOO_IFACE": interface_for(ctx.host),
            "HOROVOD_HOSTNAME": ctx.host,
            "HOROVOD_RANK": str(ctx.rank),
            "HOROVOD_SIZE": str(ctx.world_size),
            "HOROVOD_LOCAL_RANK": str(ctx.local_rank),
            "HOROVOD_LOCAL_SIZE": str(ctx.local_size),
            "HOROVOD_CROSS_RANK": str(ctx.cross_rank),
            "HOROVOD_CROSS_SIZE": str(ctx.cross_size),
        } | ({"HOROVOD_TIMELINE": "DYNAMIC"} if self.timeline else {})

    def rank_init(self, ctx: RankContext) -> None:
        import horovod.torch as hvd
        import torch

        device = pick_device(ctx, self.device)
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))
        with joining_the_group(ctx, "Horovod"):
            hvd.init()
        if hvd.rank() != ctx.rank or hvd.size() != ctx.world_size:
            raise RuntimeError(
                f"horovod rank {hvd.rank()}/{hvd.size()} disagrees with barrier rank {ctx.rank}/{ctx.world_size}"
            )

    def rank_shutdown(self) -> None:
        import horovod.torch as hvd

        if hvd.is_initialized():
            hvd.shutdown()


def check_horovod(cfg: Any) -> None:
    """What Horovod on CPU/Gloo cannot do with the train section (ddp's keys): refused at load."""
    h = cfg.horovod
    if cfg.cuda_graph == "on":
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
            "train.horovod.reduce_op=adasum needs Horovod built with MPI; this build uses Gloo only. Use 'average'"
        )
    if h.sync_batch_norm and cfg.device != "cuda":
        raise ValueError(
            "train.horovod.sync_batch_norm: Horovod's SyncBatchNorm runs on GPUs only; "
            "set it to false or train.device=cuda"
        )


def horovod_launch_options(cfg: Any) -> dict[str, Any]:
    """The launcher's Horovod options from the train section."""
    return {
        "cycle_time_ms": cfg.horovod.cycle_time_ms,
        "fusion_threshold_mib": cfg.horovod.fusion_threshold_mib,
    }
