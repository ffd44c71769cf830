"""What a rank measures about itself while it trains: system samples and energy, handed over per
epoch as a `RankUsage` that travels to rank 0 with the epoch's other per-rank figures."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sparkml_dist.observe.energy import EnergyMeter, EnergyReading
from sparkml_dist.observe.system import SystemSample, SystemSampler


@dataclass(frozen=True)
class RankUsage:
    """One rank over one epoch."""

    cpu_joules: float = math.nan
    gpu_joules: float = 0.0
    energy_method: str = ""
    cpu_seconds: float = math.nan
    samples: tuple[SystemSample, ...] = ()


class RankMonitor:
    """Started when training starts, read at each epoch's end, stopped at the run's end."""

    def __init__(
        self, rank: int, interval_s: float, cpu_watts_per_core: float, cuda_index: int | None = None
    ):
        self._sampler = SystemSampler(rank, interval_s, cuda_index) if interval_s > 0 else None
        self._meter = EnergyMeter(cpu_watts_per_core, cuda_index)
        self._last = EnergyReading(0.0, self._meter.cpu_method)
        self._last_cpu_s = 0.0

    def __enter__(self) -> RankMonitor:
        if self._sampler is not None:
            self._sampler.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._sampler is not None:
            self._sampler.stop()

    def epoch_usage(self) -> RankUsage:
        """Energy and CPU time since the previous call, and the samples taken since."""
        now, cpu_s = self._meter.read(), self._meter.cpu_seconds()
        usage = RankUsage(
            now.cpu_joules - self._last.cpu_joules,
            now.gpu_joules - self._last.gpu_joules,
            now.method,
            cpu_s - self._last_cpu_s,
            self._sampler.take(sample_now=True) if self._sampler else (),
        )
        self._last, self._last_cpu_s = now, cpu_s
        return usage
