"""Barrier-stage launcher: N ranks in one Spark barrier stage, rendezvous from
BarrierTaskContext, a pluggable communication backend, per-rank error reports, relaunch.

Names are imported on first use: a rank imports `launch.backend` and `launch.context` without
pyspark (training code runs where there is no Spark: `bench.gpu`, the rank's own process)."""

from __future__ import annotations

import importlib
from typing import Any

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
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sparkml_dist.launch' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
