"""Pipeline parallelism: rank r runs stage r of the transformer (the embedding on the first,
the head on the last, the blocks split evenly) with torch.distributed.pipelining's GPipe or
1F1B schedule over micro-batches. All stages read the same batches.

Every batch is padded to `batch_size` so micro-batch shapes never change. A target row is
(label, weight); the weights are rescaled to m x weight / (the batch's weight) and padding rows
get 0, so the schedule's mean over micro-batches of `sum(weight x loss)` is exactly the batch's
weighted mean loss, as in data-parallel training.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch import nn

from sparkml_dist.train.parallelism import OptimizerFactory, Parallelism, SharedBatch

if TYPE_CHECKING:
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    from sparkml_dist.models.transformer import TabularTransformer


class PipelineParallel(SharedBatch, Parallelism):
    name = "pipeline"
    sharded_checkpoints = True
    replicated = False

    def __init__(self, world_size: int, rank: int, microbatches: int, schedule: str, batch_size: int):
        super().__init__(world_size, rank)
        self.microbatches = microbatches
        self.schedule_name = schedule
        self.batch_size = batch_size
        self.schedule: PipelineScheduleSingle | None = None  # made at the first step, with the task's loss
        self.stage: PipelineStage | None = None
        self.hidden = (0, 0)  # (tokens, width) of the activations sent between stages

    @property
    def is_last(self) -> bool:
        return self.rank == self.world_size - 1

    @property
    def metric_share(self) -> float:
        return 1.0 if self.is_last else 0.0

    def wrap(
        self, model: nn.Module, optimizer_factory: OptimizerFactory
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        from torch.distributed.pipelining import PipelineStage

        transformer = cast("TabularTransformer", model)  # the only kind that `cuts_into_layers`
        if transformer.embed is None:
            raise ValueError("pipeline parallelism cuts a whole transformer; this one is a stage already")
        self.hidden = (transformer.embed.token_ids.numel(), transformer.embed.values.shape[1])
        model = transformer.keep_stage(self.rank, self.world_size)
        device = next(model.parameters()).device
        self.stage = PipelineStage(model, self.rank, self.world_size, device)
        return model, optimizer_factory(model.parameters())

    def _schedule(self, loss_fn: Any):  # a tasks.losses.TargetLoss: its weighted_sum
        if self.schedule is None:
            assert self.stage is not None  # wrap() made it
            from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

            schedule_class = ScheduleGPipe if self.schedule_name == "gpipe" else Schedule1F1B
            self.schedule = schedule_class(
                self.stage, n_microbatches=self.microbatches, loss_fn=loss_fn.weighted_sum
            )
        return self.schedule

    def train_step(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: nn.Module, accumulate: int
    ) -> torch.Tensor | None:
        schedule = self._schedule(loss_fn)
        if self.rank == 0:
            schedule.step(self._pad(x))
            return None
        if not self.is_last:
            schedule.step()
            return None
        weights = y[:, 1] * (self.microbatches / y[:, 1].sum().clamp_min(1e-12))
        target = self._pad(torch.stack([y[:, 0], weights], dim=1))
        losses: list[torch.Tensor] = []
        schedule.step(target=target, losses=losses)
        return torch.stack([loss.detach() for loss in losses]).sum() / self.microbatches

    def logits(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
        """Evaluation without the schedule: the whole batch passes stage to stage (point-to-point)."""
        if self.rank == 0:
            hidden = model(x)
        else:
            hidden = x.new_empty(len(x), *self.hidden)
            dist.recv(hidden, src=self.rank - 1)
            hidden = model(hidden)
        if self.is_last:
            return hidden
        dist.send(hidden.contiguous(), dst=self.rank + 1)
        return None

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Each stage's weights, gathered on rank 0 (a collective)."""
        mine = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        parts: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(mine, parts, dst=0)
        return {k: v for part in parts for k, v in part.items()} if parts is not None else {}

    def _pad(self, t: torch.Tensor) -> torch.Tensor:
        missing = self.batch_size - len(t)
        return t if missing == 0 else torch.cat([t, t.new_zeros(missing, *t.shape[1:])])

    @staticmethod
    def unwrap(model: nn.Module) -> nn.Module:
        return model
