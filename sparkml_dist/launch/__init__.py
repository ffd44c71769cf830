"""Barrier-stage launcher: N ranks in one Spark barrier stage, rendezvous from
BarrierTaskContext, a pluggable communication backend, per-rank error reports, relaunch.

Names are imported on first use: a rank imports `launch.backend` and `launch.context` without
pyspark (training code runs where there is no Spark: `bench.gpu`, the rank's own process)."""

from __future__ import annotations

from sparkml_dist.exports import lazy_getattr

_EXPORTS = {
    "Backend": "sparkml_dist.launch.backend",
    "DriverHandle": "sparkml_dist.launch.backend",
    "BACKENDS": "sparkml_dist.launch.backends",
    "get_backend": "sparkml_dist.launch.backends",
    "RankContext": "sparkml_dist.launch.context",
    "HorovodBackend": "sparkml_dist.launch.horovod_backend",
    "RankFn": "sparkml_dist.launch.launcher",
    "run_barrier": "sparkml_dist.launch.launcher",
    "Launched": "sparkml_dist.launch.relaunch",
    "run_with_relaunch": "sparkml_dist.launch.relaunch",
    "TorchBackend": "sparkml_dist.launch.torch_backend",
}
__all__ = sorted(_EXPORTS)  # noqa: PLE0605 -- a list; the names resolve lazily (__getattr__)


__getattr__ = lazy_getattr("sparkml_dist.launch", _EXPORTS, globals())
