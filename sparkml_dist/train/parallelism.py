"""Parallelisms: how a model is placed on the ranks, how a step runs, how gradients and
metrics are combined and how weights are saved. The loop calls only this interface, so
data-parallel backends (DDP, Horovod) and model-parallel ones (FSDP, tensor, pipeline,
hybrid; see `sparkml_dist.train.parallel`) plug in alike. Which one a run uses is the training
method's choice (`sparkml_dist.methods`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from sparkml_dist.errors import ConfigError
from sparkml_dist.observe.steps import CommClock
from sparkml_dist.train import shm_allreduce
from sparkml_dist.train.graphed import GraphedStep
from sparkml_dist.train.precision import Precision
from sparkml_dist.train.shm_allreduce import shared_memory_hook

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor
    from torch.nn.parallel import DistributedDataParallel

    from sparkml_dist.data.expand import DeviceExpander
    from sparkml_dist.train.graphed import GraphedStep

log = logging.getLogger(__name__)

# (parameters, **optimizer options) -> the optimizer; a parallelism may add options (fused, capturable)
OptimizerFactory = Callable[..., torch.optim.Optimizer]
CPU = torch.device("cpu")


def group_device(device: torch.device | str) -> torch.device:
    """Where the default process group's collectives take their tensors: the rank's GPU under
    NCCL (which refuses host tensors), host memory under gloo or with no group."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device(device)
    return CPU


def is_sharded(tensor: torch.Tensor) -> bool:
    """A DTensor (FSDP, tensor parallelism): the rank holds a local shard of it."""
    return hasattr(tensor, "to_local")


def group_active(world_size: int) -> bool:
    """Whether collectives run: several ranks, or one rank alone in its process group (its
    collectives are real calls on the group's device, so a one-GPU run checks the NCCL path too).
    A one-rank parallelism inside a larger group (a parameter server's own evaluation) runs none."""
    import torch.distributed as dist

    if world_size > 1:
        return True
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() == 1


class Parallelism:
    """Defaults: every rank holds the whole model and trains on its own shard of the data."""

    name = "base"
    sharded_checkpoints = False  # True: every rank writes its part with torch.distributed.checkpoint
    replicated = True  # every rank ends with the same full parameters (checksums comparable)
    needs_lockstep = False  # every rank must run the same number of steps (no join() for uneven shards)
    times_comm = False  # its collectives are timed apart (observe.steps): gradient syncs it makes itself

    def __init__(self, world_size: int, rank: int = 0):
        self.world_size = world_size
        self.rank = rank
        self.comm_clock: CommClock | None = None  # set before wrap() to time the step's communication
        self.uneven_shards = True  # some rank has fewer batches an epoch (the loop finds out before training)
        self.precision = Precision("fp32", "cpu")  # set before wrap(): autocast and the fp16 gradient scaler
        # set by `bind_device` once the rank's device is known: where this parallelism's own
        # collectives (metrics, counts, verdicts) put their tensors
        self.collective_device = CPU
        # set by the loop before wrap(): compact rows -> the dense batch, on the device; a parallelism
        # that `takes_compact_input` runs it inside its step (a captured graph), others get dense rows
        self.expand: DeviceExpander | None = None
        # set by the loop on the steps the breakdown times on a GPU: collectives the parallelism
        # issues itself wait for the device around them (else their time is the launch's)
        self.sync_timing = False

    def bind_device(self, device: torch.device) -> None:
        """The rank's training device is known: collectives go where the group's backend takes them."""
        self.collective_device = group_device(device)

    @property
    def takes_compact_input(self) -> bool:
        """Whether `train_step` takes the loader's compact rows (and expands them itself)."""
        return False

    def optimizer_options(self, params: list[torch.Tensor], device: torch.device) -> dict[str, Any]:
        """Options for the optimizer over `params` on `device`: on a GPU, AdamW's fused kernel (one
        launch for every parameter) where all of them are plain CUDA tensors."""
        plain = not any(is_sharded(p) for p in params)
        return {"fused": True} if device.type == "cuda" and params and plain else {}

    @property
    def comm_measured(self) -> bool:
        """The step breakdown's comm part is measured (one rank: there is none to measure)."""
        return self.comm_clock is not None and (self.times_comm or self.world_size == 1)

    @property
    def data_rank(self) -> int:
        """Which shard of the data this rank reads (ranks that split one model share a shard)."""
        return self.rank

    @property
    def data_world(self) -> int:
        return self.world_size

    @property
    def metric_share(self) -> float:
        """1.0 on the one rank per data shard whose loss and counts go into the summed metrics."""
        return 1.0

    def wrap(
        self, model: nn.Module, optimizer_factory: OptimizerFactory
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        return model, optimizer_factory(model.parameters())

    def broadcast_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """After a resume on rank 0's checkpoint every rank loads the same file: nothing to do."""

    def join(self, model: nn.Module) -> AbstractContextManager:
        return contextlib.nullcontext()

    def train_step(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: nn.Module, accumulate: int
    ) -> torch.Tensor | None:
        """Forward and backward of one batch; returns the batch's mean loss (a tensor on the
        device, not read here: reading it would wait for the device) where this rank knows it."""
        with self.precision.autocast():
            outputs = model(x)
        loss = loss_fn(outputs.float(), y)  # the loss in fp32 whatever the forward's precision
        self.precision.backward(loss / accumulate)
        return loss.detach()

    def idle_step(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: nn.Module) -> None:
        """A step with zero gradient, for a rank out of batches whose peers still step (lockstep)."""
        with self.precision.autocast():
            outputs = model(x[:1])
        self.precision.backward(loss_fn(outputs.float(), y[:1]) * 0.0)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        self.precision.step(optimizer)

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.zero_grad()  # torch 2 default: set_to_none=True (Horovod's override takes no kwargs)

    def logits(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
        with self.precision.autocast():
            return self.unwrap(model)(x)

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The whole model's weights under the plain model's names, on rank 0 (others may get {})."""
        return {k: v.detach().cpu() for k, v in self.unwrap(model).state_dict().items()}

    def allreduce_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Sum across ranks (callers pass tensors they own, on any device); returns the sums on
        `values`' device. The collective itself runs on `collective_device`."""
        import torch.distributed as dist

        if not group_active(self.world_size):
            return values
        on_group = values.to(self.collective_device)
        dist.all_reduce(on_group)
        return on_group.to(values.device)

    def allreduce_max(self, value: int) -> int:
        import torch.distributed as dist

        if not group_active(self.world_size):
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.collective_device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def allgather_object(self, value: Any) -> list[Any]:
        """Every rank's `value` (small, picklable), in rank order. (torch pickles it into a tensor
        on the group's device itself: the current CUDA device under NCCL, which the backend set.)"""
        import torch.distributed as dist

        if not group_active(self.world_size):
            return [value]
        out = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    @staticmethod
    def unwrap(model: nn.Module) -> nn.Module:
        return cast(nn.Module, model.module) if hasattr(model, "module") else model


class SharedBatch:
    """Mixin for parallelisms whose ranks split one model and so read the same batch."""

    @property
    def data_rank(self) -> int:
        return 0

    @property
    def data_world(self) -> int:
        return 1


def local_param_bytes(model: nn.Module) -> int:
    """Bytes of parameters this rank holds (a DTensor counts its local shard only)."""
    total = 0
    for p in model.parameters():
        local = cast("DTensor", p).to_local() if is_sharded(p) else p
        total += local.numel() * local.element_size()
    return total


class DataParallel(Parallelism):
    """torch.distributed DDP (gloo on CPU, nccl on GPU). `shared_memory`: ranks on one host that
    train on CPU average their gradients through a shared segment instead (train.shm_allreduce).
    `cuda_graph` (auto | on | off): on a GPU, the step captured in CUDA graphs (train.graphed)."""

    name = "ddp"
    times_comm = True

    def __init__(
        self,
        world_size: int,
        rank: int = 0,
        shared_memory: bool = True,
        cuda_graph: str = "off",
        batch_size: int = 0,
    ):
        super().__init__(world_size, rank)
        self.shared_memory = shared_memory
        self.gradient_path = "none" if world_size == 1 else "process group"  # how gradients were averaged
        self.cuda_graph = cuda_graph
        self.batch_size = batch_size
        self.graph: GraphedStep | None = None  # once wrap() captured the step

    def wrap(
        self, model: nn.Module, optimizer_factory: OptimizerFactory
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        from torch.nn.parallel import DistributedDataParallel as DDP

        if self._graphs(model):
            return self._wrap_graphed(model, optimizer_factory)
        if self.world_size > 1:
            shared = self._shared_memory(model)
            # gradients as views of DDP's buckets: no copy between the two each step (about 2% of a step here)
            model = DDP(model, gradient_as_bucket_view=True)  # broadcasts rank 0's parameters
            if shared is not None:
                model.register_comm_hook(shared, shared_memory_hook)
            elif self.comm_clock is not None:
                model.register_comm_hook(self.comm_clock, timed_allreduce)
        return model, optimizer_factory(model.parameters())

    def _graphs(self, model: nn.Module) -> bool:
        """Whether this run's step is captured: `on`, or `auto` where it can be (a GPU, fp32 or bf16,
        parameters of one dtype)."""
        params = [p for p in model.parameters() if p.requires_grad]
        device = params[0].device if params else CPU
        possible = (
            device.type == "cuda"
            and self.precision.scaler is None
            and self.expand is not None
            and len({p.dtype for p in params}) == 1
        )
        if self.cuda_graph == "on" and not possible:
            raise ConfigError(
                f"rank {self.rank}: train.cuda_graph=on needs a GPU (this rank trains on {device}), "
                f"fp32 or bf16, and parameters of one dtype; set train.cuda_graph=auto or off"
            )
        # several ranks' graphs (two graphs around an eager allreduce) have not yet run on several
        # GPUs (docs/gpu.md): `auto` keeps DDP there, `on` asks for them
        return possible and (self.cuda_graph == "on" or (self.cuda_graph == "auto" and self.world_size == 1))

    def _wrap_graphed(self, model: nn.Module, optimizer_factory: OptimizerFactory):
        import torch.distributed as dist

        if self.world_size > 1:  # what DDP's constructor does: every rank starts from rank 0's weights
            with torch.no_grad():
                for tensor in [*model.parameters(), *model.buffers()]:
                    dist.broadcast(tensor, src=0)
            self.gradient_path = "flat allreduce between CUDA graphs"
        if self.expand is None:
            raise RuntimeError(
                "the loop sets Parallelism.expand before wrap() captures a step that takes compact rows"
            )
        optimizer = optimizer_factory(model.parameters(), fused=True, capturable=True)
        self.precision.cache_casts = False
        self.graph = GraphedStep(
            model,
            optimizer,
            self.world_size,
            self.batch_size,
            self.expand.compact_width,
            self.precision,
            self.expand,
            required=self.cuda_graph == "on",
            clock=self.comm_clock,
        )
        return model, optimizer

    @property
    def takes_compact_input(self) -> bool:
        return self.graph is not None

    @property
    def needs_lockstep(self) -> bool:  # type: ignore[override]
        # graphed ranks each issue one allreduce per step: every rank must take every step
        return self.graph is not None and self.world_size > 1

    def train_step(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: nn.Module, accumulate: int
    ) -> torch.Tensor | None:
        if self.graph is not None:
            return self.graph.train_step(x, y, loss_fn)
        return super().train_step(model, x, y, loss_fn, accumulate)

    def idle_step(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: nn.Module) -> None:
        if self.graph is not None:
            self.graph.train_step(x[:1], y[:1] * 0.0, loss_fn)  # weight 0: a step that changes no gradient
            return
        super().idle_step(model, x, y, loss_fn)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.graph is not None:
            self.graph.optimizer_step(timed=self.sync_timing)
            return
        super().optimizer_step(optimizer)

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        if self.graph is None:  # a graphed step zeroes its flat gradient buffer itself
            super().zero_grad(optimizer)

    def _shared_memory(self, model: nn.Module):
        """The shared-memory averaging every rank agreed on, or None (then gloo's allreduce)."""

        if not (self.shared_memory and shm_allreduce.usable(model)):
            return None
        state = shm_allreduce.SharedMemoryAllreduce.connect(
            list(model.parameters()), self.rank, self.world_size
        )
        if state is None:
            return None
        state.clock = self.comm_clock
        self.gradient_path = "shared memory"
        if self.rank == 0:
            log.info("DDP averages gradients through shared memory (%d ranks on one host)", self.world_size)
        return state

    def join(self, model: nn.Module) -> AbstractContextManager:
        # ranks with one batch fewer shadow the others' allreduces; only where shards differ,
        # since DDP's join costs an allreduce of its own every step (about 7% of a compute-bound step here)
        if self.world_size > 1 and self.uneven_shards and self.graph is None:
            return cast("DistributedDataParallel", model).join()
        return contextlib.nullcontext()


def timed_allreduce(clock: CommClock, bucket):  # no annotations: DDP compares them, and ours are strings
    """DDP's default gradient averaging (torch's `allreduce_hook`), with each bucket's launch and
    completion told to `clock`: what the step breakdown's comm part is measured from."""
    import torch.distributed as dist

    clock.launched()
    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size())

    def finished(fut):
        clock.done()
        return fut.value()[0]

    return dist.all_reduce(tensor, async_op=True).get_future().then(finished)


def data_parallel_on_torch(cfg: Any, world_size: int, rank: int) -> Parallelism:
    """train.strategy=ddp on train.backend=torch (launch/backends.py): DDP, its gradients averaged
    through a shared-memory segment or the process group (train.intra_host_allreduce)."""
    return DataParallel(
        world_size,
        rank,
        shared_memory=cfg.intra_host_allreduce == "shared_memory",
        cuda_graph=cfg.cuda_graph,
        batch_size=cfg.batch_size,
    )
