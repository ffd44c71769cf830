"""Training strategies: how a model is placed on the ranks, how a step runs, how gradients and
metrics are combined and how weights are saved. The loop calls only this interface, so
data-parallel backends (DDP, Horovod) and model-parallel ones (FSDP, tensor, pipeline,
hybrid; see `sparkml_dist.train.parallel`) plug in alike. Which one a run uses is the training
method's choice (`sparkml_dist.methods`)."""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, ContextManager

import torch
from torch import nn

from sparkml_dist.observe.steps import CommClock

log = logging.getLogger(__name__)

OptimizerFactory = Callable[[Any], torch.optim.Optimizer]


class Strategy:
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

    def wrap(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        return model, optimizer_factory(model.parameters())

    def broadcast_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """After a resume on rank 0's checkpoint every rank loads the same file: nothing to do."""

    def join(self, model: nn.Module) -> ContextManager:
        return contextlib.nullcontext()

    def train_step(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: nn.Module,
                   accumulate: int) -> torch.Tensor | None:
        """Forward and backward of one batch; returns the batch's mean loss where this rank knows it."""
        loss = loss_fn(model(x), y)
        (loss / accumulate).backward()
        return loss.detach()

    def idle_step(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: nn.Module) -> None:
        """A step with zero gradient, for a rank out of batches whose peers still step (lockstep)."""
        (loss_fn(model(x[:1]), y[:1]) * 0.0).backward()

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    def logits(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
        return self.unwrap(model)(x)

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The whole model's weights under the plain model's names, on rank 0 (others may get {})."""
        return {k: v.detach().cpu() for k, v in self.unwrap(model).state_dict().items()}

    def allreduce_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Sum across ranks, in place (callers pass tensors they own); returns `values`."""
        import torch.distributed as dist

        if self.world_size > 1:
            dist.all_reduce(values)
        return values

    def allreduce_max(self, value: int) -> int:
        import torch.distributed as dist

        if self.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def allgather_object(self, value: Any) -> list[Any]:
        """Every rank's `value` (small, picklable), in rank order."""
        import torch.distributed as dist

        if self.world_size == 1:
            return [value]
        out = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    @staticmethod
    def unwrap(model: nn.Module) -> nn.Module:
        return model.module if hasattr(model, "module") else model


class SharedBatch:
    """Mixin for strategies whose ranks split one model and so read the same batch."""

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
        local = p.to_local() if hasattr(p, "to_local") else p
        total += local.numel() * local.element_size()
    return total


class DataParallel(Strategy):
    """torch.distributed DDP (gloo on CPU, nccl on GPU). `shared_memory`: ranks on one host that
    train on CPU average their gradients through a shared segment instead (train.shm_allreduce)."""

    name = "ddp"
    times_comm = True

    def __init__(self, world_size: int, rank: int = 0, shared_memory: bool = True):
        super().__init__(world_size, rank)
        self.shared_memory = shared_memory
        self.gradient_path = "none" if world_size == 1 else "process group"  # how gradients were averaged

    def wrap(self, model: nn.Module, optimizer_factory: OptimizerFactory) -> tuple[nn.Module, torch.optim.Optimizer]:
        from torch.nn.parallel import DistributedDataParallel as DDP

        from sparkml_dist.train.shm_allreduce import shared_memory_hook

        if self.world_size > 1:
            shared = self._shared_memory(model)
            # gradients as views of DDP's buckets: no copy between the two each step (about 2% of a step here)
            model = DDP(model, gradient_as_bucket_view=True)  # broadcasts rank 0's parameters
            if shared is not None:
                model.register_comm_hook(shared, shared_memory_hook)
            elif self.comm_clock is not None:
                model.register_comm_hook(self.comm_clock, timed_allreduce)
        return model, optimizer_factory(model.parameters())

    def _shared_memory(self, model: nn.Module):
        """The shared-memory averaging every rank agreed on, or None (then gloo's allreduce)."""
        from sparkml_dist.train import shm_allreduce

        if not (self.shared_memory and shm_allreduce.usable(model)):
            return None
        state = shm_allreduce.SharedMemoryAllreduce.connect(list(model.parameters()), self.rank, self.world_size)
        if state is None:
            return None
        state.clock = self.comm_clock
        self.gradient_path = "shared memory"
        if self.rank == 0:
            log.info("DDP averages gradients through shared memory (%d ranks on one host)", self.world_size)
        return state

    def join(self, model: nn.Module) -> ContextManager:
        # ranks with one batch fewer shadow the others' allreduces; only where shards differ,
        # since DDP's join costs an allreduce of its own every step (about 7% of a compute-bound step here)
        if self.world_size > 1 and self.uneven_shards:
            return model.join()
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
