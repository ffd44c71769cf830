"""A training method defined outside the package, as a user would write one: local SGD (each rank
steps on its own and the ranks average their parameters every `train.average_every` steps).
One module, one `register_method` call; tests/test_methods.py runs it through the pipeline."""

from __future__ import annotations

from typing import Literal

import torch
import torch.distributed as dist
from pydantic import Field
from torch import nn

from sparkml_dist import LoopMethod, Parallelism, TrainConfig, register_method


class LocalSgdConfig(TrainConfig):
    strategy: Literal["local_sgd"] = "local_sgd"
    average_every: int = Field(8, ge=1, description="optimizer steps between parameter averages")


class AveragingOptimizer:
    """Steps the wrapped optimizer; every `every` steps, replaces each parameter by its mean over ranks."""

    def __init__(self, optimizer: torch.optim.Optimizer, model: nn.Module, every: int, world_size: int):
        self.optimizer, self.model, self.every, self.world_size = optimizer, model, every, world_size
        self.steps = 0

    def step(self) -> None:
        self.optimizer.step()
        self.steps += 1
        if self.steps % self.every == 0:
            average_parameters(self.model, self.world_size)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)


@torch.no_grad()
def average_parameters(model: nn.Module, world_size: int) -> None:
    if world_size == 1:
        return
    for p in model.parameters():
        dist.all_reduce(p.data)
        p.data /= world_size


class LocalSgd(Parallelism):
    needs_lockstep = True  # the averages are collectives: every rank runs the same number of steps

    def __init__(self, world_size: int, rank: int, every: int):
        super().__init__(world_size, rank)
        self.every = every

    def wrap(self, model, optimizer_factory):
        return model, AveragingOptimizer(
            optimizer_factory(model.parameters()), model, self.every, self.world_size
        )

    def full_state_dict(self, model):
        average_parameters(model, self.world_size)  # every rank calls it: the exported model is the mean
        return super().full_state_dict(model)


def place_local_sgd(cfg: LocalSgdConfig, world_size: int, rank: int) -> Parallelism:
    return LocalSgd(world_size, rank, cfg.average_every)


LOCAL_SGD = register_method(
    LoopMethod(
        "local_sgd",
        LocalSgdConfig,
        place_local_sgd,
        fresh_process=False,
        summary="local SGD: ranks step alone, parameters averaged every N steps",
    )
)
