"""Horovod data parallelism: DistributedOptimizer, rank-0 broadcast of parameters and optimizer
state, optional fp16 compression and gradient accumulation, hvd.join for uneven shards."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from sparkml_dist.train.parallelism import Parallelism


class HorovodDataParallel(Parallelism):
    name = "horovod"
    times_comm = True  # the allreduces launched in backward are waited for in optimizer_step

    def __init__(
        self, world_size: int, rank: int = 0, compression: str = "none", backward_passes_per_step: int = 1
    ):
        super().__init__(world_size, rank)
        self.compression = compression
        self.backward_passes_per_step = backward_passes_per_step

    def wrap(self, model: nn.Module, optimizer_factory) -> tuple[nn.Module, torch.optim.Optimizer]:
        import horovod.torch as hvd

        optimizer = optimizer_factory(model.parameters())
        compression = hvd.Compression.fp16 if self.compression == "fp16" else hvd.Compression.none
        optimizer = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            compression=compression,
            backward_passes_per_step=self.backward_passes_per_step,
        )
        self.broadcast_state(model, optimizer)
        return model, optimizer

    def optimizer_step(self, optimizer: Any) -> None:  # horovod's DistributedOptimizer: untyped
        timed = self.comm_clock.blocking() if self.comm_clock is not None else contextlib.nullcontext()
        with timed:  # the wait for backward's allreduces, timed apart
            for handle, _ in list(optimizer._handles.values()):
                if isinstance(handle, int):  # launched in backward; None: not yet, a callable: already done
                    _wait_quietly(handle)
            optimizer.synchronize()  # the waited-for handles return at once; it launches any left
        self.precision.unscale(optimizer)  # fp16: the averaged gradients at their true size
        with optimizer.skip_synchronize():
            self.precision.step(optimizer)

    def optimizer_options(self, params, device) -> dict:
        return {}  # DistributedOptimizer rebuilds the optimizer's class around its own step: plain AdamW

    def broadcast_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        import horovod.torch as hvd

        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    def join(self, model: nn.Module) -> AbstractContextManager:
        return self._joined()

    @contextlib.contextmanager
    def _joined(self) -> Iterator[None]:
        import horovod.torch as hvd

        yield
        hvd.join()  # a rank out of batches keeps serving the others' allreduces until all are done

    def allreduce_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Sum across ranks; returns the sums on `values`' device. Horovod's CPU operations (Gloo)
        take them in host memory, in either build (with NCCL, CUDA tensors go to NCCL)."""
        import horovod.torch as hvd

        on_host = values.to(self.collective_device)
        handle = hvd.allreduce_async_(on_host, op=hvd.Sum, name=_stable_name("sum", on_host))
        _wait_quietly(handle)
        return hvd.synchronize(handle).to(values.device)

    def allreduce_max(self, value: int) -> int:
        import horovod.torch as hvd

        tensor = torch.tensor([value], device=self.collective_device)
        handle = hvd.allreduce_async(tensor, op=hvd.Max, name=_stable_name("max", tensor))
        _wait_quietly(handle)
        return int(hvd.synchronize(handle).item())

    def allgather_object(self, value):
        import horovod.torch as hvd

        return list(hvd.allgather_object(value))

    @staticmethod
    def unwrap(model: nn.Module) -> nn.Module:
        return model


def _stable_name(op: str, tensor: torch.Tensor) -> str:
    """The same name for every call with this op, dtype and shape. Horovod names an unnamed tensor
    after a per-call counter, so each call is new to its response cache and goes through the full
    negotiation with the coordinator (gather, then broadcast: about 1 ms of a 1 MiB allreduce's 2 here);
    a name seen before is settled by a bit-vector exchange. The gradients DistributedOptimizer
    reduces are named after their parameters already. Calls are synchronous, so no two calls
    with one name are ever in flight together."""
    return f"sparkml_dist.{op}.{str(tensor.dtype).removeprefix('torch.')}.{'x'.join(map(str, tensor.shape)) or 'scalar'}"


POLL_INTERVAL_S = 20e-6


def _wait_quietly(handle: int) -> None:
    """Sleep between polls until Horovod has finished `handle`. Horovod's own wait (`synchronize`,
    and so every synchronous op) spins on `std::this_thread::yield()`; where the ranks have no
    spare core, that spin takes the CPU from Horovod's background thread, which is the one doing
    the allreduce. Sleeping instead, 2 ranks on 2 cores: a 1 MiB allreduce 1.7-1.9 ms against
    2.4-3.4 ms, 64 MiB 46 ms against 52-70 ms (docs/benchmarks.md, allreduce_horovod_vs_gloo)."""
    import horovod.torch as hvd

    while not hvd.poll(handle):
        time.sleep(POLL_INTERVAL_S)


def data_parallel_on_horovod(cfg: Any, world_size: int, rank: int) -> Parallelism:
    """train.strategy=ddp on train.backend=horovod (launch/backends.py)."""
    return HorovodDataParallel(
        world_size, rank, cfg.horovod.compression, cfg.horovod.backward_passes_per_step
    )
