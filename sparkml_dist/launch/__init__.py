"""Barrier-stage launcher: N ranks in one Spark barrier stage, rendezvous from
BarrierTaskContext, a pluggable communication backend, per-rank error reports."""

from sparkml_dist.launch.backends import Backend, TorchBackend, backend_for, get_backend
from sparkml_dist.launch.context import RankContext
from sparkml_dist.launch.launcher import run_barrier

__all__ = ["Backend", "RankContext", "backend_for", "TorchBackend", "get_backend", "run_barrier"]
