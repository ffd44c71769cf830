"""Barrier-stage launcher: N ranks in one Spark barrier stage, rendezvous from
BarrierTaskContext, a pluggable communication backend, per-rank error reports, relaunch."""

from sparkml_dist.launch.backend import Backend, DriverHandle
from sparkml_dist.launch.backends import BACKENDS, get_backend
from sparkml_dist.launch.context import RankContext
from sparkml_dist.launch.horovod_backend import HorovodBackend
from sparkml_dist.launch.launcher import RankFn, run_barrier
from sparkml_dist.launch.relaunch import Launched, run_with_relaunch
from sparkml_dist.launch.torch_backend import TorchBackend

__all__ = ["BACKENDS", "Backend", "DriverHandle", "HorovodBackend", "Launched", "RankContext", "RankFn",
           "TorchBackend", "get_backend", "run_barrier", "run_with_relaunch"]
