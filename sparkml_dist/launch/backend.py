"""The communication backend interface. A backend object is small config that travels to the
ranks. Its rendezvous server runs in rank 0's task (`rendezvous_server`, behind the launch's
gateway) when it `hosts_store`, so that nothing the ranks need lives on the driver, which a Spark
Connect client is not; any driver-side service a backend still needs lives in the handle
`driver_start` returns. Implementations: `torch_backend`, `horovod_backend`; looked up in `backends`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol

from sparkml_dist.errors import RendezvousError
from sparkml_dist.launch.context import RankContext
from sparkml_dist.launch.ports import PortRange

# train.backend's default: the one every method runs on (its entry is in launch.backends)
DEFAULT_BACKEND = "torch"


class DriverHandle:
    """Driver-side state of a backend for one launch; `extra` is passed to every rank."""

    def __init__(self) -> None:
        self.extra: dict[str, str] = {}

    def stop(self) -> None:
        pass


class HostedRendezvous(Protocol):
    """A backend's rendezvous server in rank 0's task, listening on loopback at `port`."""

    @property
    def port(self) -> int: ...

    def close(self) -> None: ...


class Backend(Protocol):
    # read-only properties: a backend may declare them as class attributes or set them in __init__
    @property
    def name(self) -> str: ...

    @property
    def needs_fresh_process(self) -> bool:
        """Run each rank in a forked child of the Spark Python worker (a fresh process per launch)."""
        ...

    @property
    def hosts_store(self) -> bool:
        """Rank 0's task hosts the backend's rendezvous server (`rendezvous_server`) behind the
        launch's gateway; else the driver hosts it (behind a gateway of its own, `driver_start`)."""
        ...

    def rendezvous_server(self, world_size: int) -> HostedRendezvous:
        """Rank 0's task starts it on loopback, when the backend `hosts_store`."""
        ...

    def driver_start(
        self, num_ranks: int, driver_host: str, secret: bytes, ports: PortRange | None = None
    ) -> DriverHandle:
        """Start what the driver hosts for one launch. A listener that executors reach binds
        `driver_host` only, on a port of `ports` when given (`spark.sparkml_dist.driver.ports`)."""

    def rendezvous_gateway(self, ctx: RankContext) -> tuple[str, int]:
        """Where the launch's authenticated rendezvous gateway listens."""

    def rendezvous_env(self, forwarder_port: int) -> dict[str, str]:
        """The rank's environment that points its rendezvous client at its loopback forwarder."""

    def preload(self) -> None:
        """Import what `rank_init` needs. Every rank calls it first, all at once: a cold import of
        torch takes about a second, and imported later, behind the rendezvous, the ranks would
        take turns waiting for each other's."""

    def rank_env(self, ctx: RankContext) -> dict[str, str]: ...

    def rank_init(self, ctx: RankContext) -> None: ...

    def rank_shutdown(self) -> None: ...


@contextlib.contextmanager
def joining_the_group(ctx: RankContext, library: str) -> Iterator[None]:
    """A failure to join the process group becomes a `RendezvousError`: it happened before the
    rank function ran, so the launcher may launch the stage again (a peer's connect that times out
    or is reset by a transient network fault)."""
    try:
        yield
    except Exception as exc:
        raise RendezvousError(
            f"rank {ctx.rank} of {ctx.world_size} (host {ctx.host}) could not join the {library} "
            f"process group: {type(exc).__name__}: {exc}"
        ) from exc


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
            raise RuntimeError(
                f"rank {ctx.rank}: Spark assigned GPU {index} but torch sees {device_count} GPU(s) "
                f"on {ctx.host}; check the discovery script and CUDA_VISIBLE_DEVICES"
            )
        return index
    if ctx.local_size > device_count:
        raise RuntimeError(
            f"rank {ctx.rank}: {ctx.local_size} ranks on {ctx.host} but only {device_count} GPU(s); "
            f"set spark.task.resource.gpu.amount=1 so Spark places one rank per GPU"
        )
    return ctx.local_rank
