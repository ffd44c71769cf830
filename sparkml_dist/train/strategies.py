"""Data-parallel strategies: how gradients are averaged, initial state shared, uneven shards
joined and metrics summed. The loop calls only this interface, so backends plug in."""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch
from torch import nn


class DataParallel:
    """torch.distributed DDP (gloo on CPU, nccl on GPU)."""

    name = "ddp"

    def __init__(self, world_size: int):
        self.world_size = world_size

    def wrap(self, model: nn.Module, optimizer_factory) -> tuple[nn.Module, torch.optim.Optimizer]:
        from torch.nn.parallel import DistributedDataParallel as DDP

        if self.world_size > 1:
            model = DDP(model)  # broadcasts rank 0's parameters at construction
        return model, optimizer_factory(model.parameters())

    def broadcast_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """After a resume on rank 0's checkpoint every rank loads the same file: nothing to do."""

    def join(self, model: nn.Module) -> ContextManager:
        if self.world_size > 1:
            return model.join()  # ranks with one batch fewer shadow the others' allreduces
        return contextlib.nullcontext()

    def allreduce_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Sum across ranks, in place (callers pass tensors they own); returns `values`."""
        import torch.distributed as dist

        if self.world_size > 1:
            dist.all_reduce(values)
        return values

    def allgather_floats(self, values: list[float]) -> list[list[float]]:
        import torch.distributed as dist

        if self.world_size == 1:
            return [values]
        out = [None] * self.world_size
        dist.all_gather_object(out, values)
        return out

    @staticmethod
    def unwrap(model: nn.Module) -> nn.Module:
        return model.module if hasattr(model, "module") else model


def make_strategy(backend: str, world_size: int, **options) -> DataParallel:
    if backend == "torch":
        return DataParallel(world_size)
    if backend == "horovod":
        from sparkml_dist.train.horovod_strategy import HorovodDataParallel

        return HorovodDataParallel(world_size, **options)
    raise ValueError(f"unknown backend {backend!r}")
