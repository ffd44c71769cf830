"""Strategies on a DeviceMesh: FSDP2 (`fully_shard`), tensor parallelism (`parallelize_module`)
and their 2-D hybrid. Parameters become DTensors; checkpoints are sharded (DCP)."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from sparkml_dist.train.parallelism import OptimizerFactory, Parallelism, SharedBatch

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor


def _device_type(model: nn.Module) -> str:
    return next(model.parameters()).device.type


def even_shard_dim(mesh_size: int):
    """FSDP2 placement: shard each parameter on its first dim the mesh divides evenly (a
    [1, d] head weight shards on d, not on its single row). Uneven shards train correctly
    but are not resharded by DCP on load (pytorch#153283); those load via full tensors."""
    from torch.distributed.tensor import Shard

    def place(param: torch.Tensor):
        # decided from the global shape, so every rank picks the same dim even when tensor
        # parallelism left the local shards uneven (a 15-row table as 8 + 7 rows)
        split: dict[int, int] = {}
        for mesh_dim, placement in enumerate(getattr(param, "placements", ())):
            if isinstance(placement, Shard):
                mesh = cast("DTensor", param).device_mesh  # it has placements: a DTensor
                split[placement.dim] = split.get(placement.dim, 1) * mesh.size(mesh_dim)
        for dim, size in enumerate(param.shape):
            if size % (mesh_size * split.get(dim, 1)) == 0:
                return Shard(dim)
        return Shard(0)

    return place


def shard_fully(model: nn.Module, mesh) -> nn.Module:
    """FSDP2: one all-gather group per transformer block (or per Linear of an MLP), then the rest."""
    from torch.distributed.fsdp import fully_shard

    blocks = getattr(model, "blocks", None)
    units = (
        list(blocks.values())
        if blocks is not None
        else [m for m in model.modules() if isinstance(m, nn.Linear)]
    )
    place = even_shard_dim(mesh.size())
    for unit in units:
        fully_shard(unit, mesh=mesh, shard_placement_fn=place)
    fully_shard(model, mesh=mesh, shard_placement_fn=place)
    return model


def tensor_parallel_plan(model: nn.Module) -> dict:
    """Megatron-style: q/k/v and fc1 column-wise, attention out and fc2 row-wise (one allreduce
    per attention and per MLP), the token table row-wise."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

    plan: dict[str, ParallelStyle] = {"embed.tokens": RowwiseParallel(input_layouts=Replicate())}
    for name in cast(nn.ModuleDict, model.blocks):
        plan.update({f"blocks.{name}.attn.{p}": ColwiseParallel() for p in ("q", "k", "v")})
        plan[f"blocks.{name}.attn.out"] = RowwiseParallel()
        plan[f"blocks.{name}.mlp.fc1"] = ColwiseParallel()
        plan[f"blocks.{name}.mlp.fc2"] = RowwiseParallel()
    return plan


class MeshParallelism(Parallelism):
    sharded_checkpoints = True
    replicated = False
    needs_lockstep = True  # FSDP and DTensor collectives run inside forward/backward: no join()

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """A collective: every rank gathers each parameter in state_dict order and rank 0 keeps
        them, so the other ranks never hold more than one full parameter at a time."""
        full = {}
        for name, value in model.state_dict().items():
            tensor = value.full_tensor() if hasattr(value, "full_tensor") else value
            if self.rank == 0:
                full[name] = tensor.detach().cpu()
        return full

    @staticmethod
    def unwrap(model: nn.Module) -> nn.Module:
        return model


class FullyShardedDataParallel(MeshParallelism):
    """Parameters, gradients and optimizer state sharded over all ranks (ZeRO-3 style)."""

    name = "fsdp"

    def wrap(
        self, model: nn.Module, optimizer_factory: OptimizerFactory
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(_device_type(model), (self.world_size,))
        model = shard_fully(model, mesh)
        return model, optimizer_factory(model.parameters())


class TensorParallel(SharedBatch, MeshParallelism):
    """Every rank holds 1/N of each attention and MLP layer; all ranks see the same batch."""

    name = "tensor"

    @property
    def metric_share(self) -> float:
        return 1.0 if self.rank == 0 else 0.0

    def wrap(
        self, model: nn.Module, optimizer_factory: OptimizerFactory
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import parallelize_module

        mesh = init_device_mesh(_device_type(model), (self.world_size,))
        model = parallelize_module(model, mesh, tensor_parallel_plan(model))
        return model, optimizer_factory(model.parameters())


class HybridParallel(MeshParallelism):
    """A 2-D mesh (dp, tp): tensor parallel inside groups of `tensor_parallel` ranks, FSDP
    across the groups. Rank r sits at (r // tp, r % tp)."""

    name = "hybrid"

    def __init__(self, world_size: int, rank: int, tensor_parallel: int):
        super().__init__(world_size, rank)
        self.tp = tensor_parallel

    @property
    def data_rank(self) -> int:
        return self.rank // self.tp

    @property
    def data_world(self) -> int:
        return self.world_size // self.tp

    @property
    def metric_share(self) -> float:
        return 1.0 if self.rank % self.tp == 0 else 0.0

    def wrap(
        self, model: nn.Module, optimizer_factory: OptimizerFactory
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import parallelize_module

        mesh = init_device_mesh(_device_type(model), (self.data_world, self.tp), mesh_dim_names=("dp", "tp"))
        model = parallelize_module(model, mesh["tp"], tensor_parallel_plan(model))
        model = shard_fully(model, mesh["dp"])
        return model, optimizer_factory(model.parameters())
