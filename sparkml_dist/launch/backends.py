"""The communication backends by name (`train.backend`): one registry entry per backend.

An entry (`BackendSpec`) carries the backend class the launcher starts, what the training
section may set for it and must not set for the others (`own_keys`), the checks of what it
cannot do, the launcher options it takes from the section, and how data parallelism places a
rank on it (a 'module:function' string: torch is imported only on the ranks). Nothing here
imports torch or Horovod: validating a config reads this registry. A new backend is a module
with its class and one `BACKENDS.register(...)` here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkml_dist.launch.backend import DEFAULT_BACKEND, Backend
from sparkml_dist.launch.horovod_backend import HorovodBackend, check_horovod, horovod_launch_options
from sparkml_dist.launch.torch_backend import TorchBackend
from sparkml_dist.registry import Registry, resolve

if TYPE_CHECKING:
    from sparkml_dist.train.parallelism import Parallelism

__all__ = ["BACKENDS", "BackendSpec", "get_backend", "register_backend"]


def _no_check(cfg: Any) -> None:
    return None


def _no_options(cfg: Any) -> Mapping[str, Any]:
    return {}


@dataclass(frozen=True)
class BackendSpec:
    """One `train.backend`.

    `backend(device=..., timeout_s=..., **options)` makes the launcher's `Backend`.
    `data_parallel` ('module:function', `(train section, world_size, rank) -> Parallelism`) is how
    train.strategy=ddp runs a rank on it. `forks_every_launch`: every rank runs in a fresh child
    process whatever the method asks. `own_keys`: keys of the train section that are its options
    (refused with another backend). `check(train section)` raises ValueError for what it cannot
    do; `launch_options(train section)` are its keyword options."""

    name: str
    backend: Callable[..., Backend]
    data_parallel: str
    forks_every_launch: bool = False
    own_keys: tuple[str, ...] = ()
    check: Callable[[Any], None] = _no_check
    launch_options: Callable[[Any], Mapping[str, Any]] = _no_options

    def place_data_parallel(self, cfg: Any, world_size: int, rank: int) -> Parallelism:
        return resolve(self.data_parallel)(cfg, world_size, rank)


BACKENDS: Registry[BackendSpec] = Registry("train.backend")


def register_backend(spec: BackendSpec, *, replace: bool = False) -> BackendSpec:
    """Make `spec` a `train.backend` value (ddp runs on it; the launcher starts its backend class)."""
    return BACKENDS.register(spec.name, spec, replace=replace)


register_backend(
    BackendSpec(
        "torch",
        TorchBackend,
        "sparkml_dist.train.parallelism:data_parallel_on_torch",
        own_keys=("intra_host_allreduce",),
    )
)
register_backend(
    BackendSpec(
        "horovod",
        HorovodBackend,
        "sparkml_dist.train.horovod_parallel:data_parallel_on_horovod",
        # hvd.init() cannot run twice in one process: every launch forks its ranks
        forks_every_launch=True,
        own_keys=("horovod",),
        check=check_horovod,
        launch_options=horovod_launch_options,
    )
)


def get_backend(name: str, device: str = "auto", timeout_s: int = 300, **options) -> Backend:
    """The backend by name; `options` are backend-specific (Horovod: cycle_time_ms, fusion_threshold_mib;
    torch: needs_fresh_process)."""
    return BACKENDS.get(name).backend(device=device, timeout_s=timeout_s, **options)


def backend_names() -> list[str]:
    """The registered backends, the default first (as an error lists them)."""
    return [DEFAULT_BACKEND, *(n for n in BACKENDS.names() if n != DEFAULT_BACKEND)]
