"""Training methods, one registry entry per `train.strategy` value.

    from sparkml_dist.methods import TrainMethod, register_method, get_method

Built in: ddp (with the torch or Horovod backend), fsdp, tensor, pipeline, hybrid (placements in
the one rank loop: `LoopMethod`), async (parameter servers: its own rank program) and federated
(a driver-side algorithm). docs/architecture.md shows how to add one.
"""

from sparkml_dist.methods.base import (
    LaunchNeeds,
    TrainMethod,
    TrainRequest,
    WarmStart,
    get_method,
    method_names,
    register_method,
)
from sparkml_dist.methods.loop import LoopMethod, make_job

__all__ = [
    "LaunchNeeds",
    "LoopMethod",
    "TrainMethod",
    "TrainRequest",
    "WarmStart",
    "get_method",
    "make_job",
    "method_names",
    "register_method",
]
