"""Barrier-stage launcher: N ranks in one Spark barrier stage, rendezvous from
BarrierTaskContext, a pluggable communication backend, per-rank error reports."""

from sparkml_dist.launch.backends import Backend, TorchBackend, get_backend
from sparkml_dist.launch.context import RankContext
from sparkml_dist.launch.launcher import run_barrier

__all__ = ["Backend", "RankContext", "TorchBackend", "get_backend", "run_barrier"]
