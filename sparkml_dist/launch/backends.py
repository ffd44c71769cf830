"""The communication backends by name (`train.backend`)."""

from __future__ import annotations

from collections.abc import Callable

from sparkml_dist.launch.backend import Backend
from sparkml_dist.launch.horovod_backend import HorovodBackend
from sparkml_dist.launch.torch_backend import TorchBackend
from sparkml_dist.registry import Registry

# name -> a factory taking (device=..., timeout_s=..., **backend-specific options)
BACKENDS: Registry[Callable[..., Backend]] = Registry("train.backend")
BACKENDS.register("torch", TorchBackend)
BACKENDS.register("horovod", HorovodBackend)


def get_backend(name: str, device: str = "auto", timeout_s: int = 300, **options) -> Backend:
    """The backend by name; `options` are backend-specific (Horovod: cycle_time_ms, fusion_threshold_mib;
    torch: needs_fresh_process)."""
    return BACKENDS.get(name)(device=device, timeout_s=timeout_s, **options)
