"""Energy per rank, by the best source the host offers, always saying which:

- `nvml`: the rank's GPU's own energy counter (`nvmlDeviceGetTotalEnergyConsumption`, Volta and
  later), a measurement;
- `rapl`: the CPU packages' counters under `/sys/class/powercap` (Intel RAPL; AMD's are exposed
  there too), a measurement of the host, of which a rank is charged its share of the host's busy
  CPU time over the same interval;
- `estimate`: where neither can be read (most containers): the rank's process CPU-seconds x
  `observe.cpu_watts_per_core` (a server CPU's TDP divided by its cores). An estimate, and
  recorded as one.

The CPU part and the GPU part are kept apart, each with its method, so that an estimate is never
added into a figure that is called a measurement.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import psutil

from sparkml_dist.observe.system import busy_seconds, nvml_handle

log = logging.getLogger(__name__)

POWERCAP = Path("/sys/class/powercap")


@dataclass(frozen=True)
class EnergyReading:
    """Joules since the meter started, by part."""

    cpu_joules: float
    cpu_method: str  # rapl | estimate
    gpu_joules: float = 0.0
    gpu_method: str = ""  # nvml, or "" without a GPU

    @property
    def joules(self) -> float:
        return self.cpu_joules + self.gpu_joules

    @property
    def method(self) -> str:
        return "+".join(m for m in (self.gpu_method, self.cpu_method) if m)


class RaplCounters:
    """The package-level RAPL domains (`intel-rapl:N`, not their sub-zones), read with wrap-around."""

    def __init__(self, root: Path = POWERCAP) -> None:
        self.zones = [
            z
            for z in sorted(root.glob("intel-rapl:*"))
            if z.name.count(":") == 1 and (z / "energy_uj").exists()
        ]
        self._last = self._raw() if self.zones else []
        self.total_uj = 0

    @property
    def readable(self) -> bool:
        return bool(self.zones) and all(v is not None for v in self._last)

    def _raw(self) -> list[int | None]:
        out: list[int | None] = []
        for zone in self.zones:
            try:
                out.append(int((zone / "energy_uj").read_text()))
            except (OSError, ValueError):  # root-only since the PLATYPUS fix on most distributions
                out.append(None)
        return out

    def joules(self) -> float:
        """Joules since construction, all packages."""
        now = self._raw()
        for zone, before, after in zip(self.zones, self._last, now):
            if before is None or after is None:
                continue
            delta = after - before
            if delta < 0:  # the counter wrapped at max_energy_range_uj
                delta += int((zone / "max_energy_range_uj").read_text())
            self.total_uj += delta
        self._last = now
        return self.total_uj / 1e6


class EnergyMeter:
    """A rank's joules since `start`, by NVML (its GPU), RAPL or the CPU-time estimate."""

    def __init__(
        self, cpu_watts_per_core: float, cuda_index: int | None = None, rapl_root: Path = POWERCAP
    ) -> None:
        self.watts_per_core = cpu_watts_per_core
        self._process = psutil.Process()
        self._rapl = RaplCounters(rapl_root)
        self._gpu = None
        self._cpu0 = self._process_cpu()
        self._host0 = busy_seconds(psutil.cpu_times())
        if cuda_index is not None:
            self._gpu = self._nvml(cuda_index)

    @property
    def cpu_method(self) -> str:
        return "rapl" if self._rapl.readable else "estimate"

    def _process_cpu(self) -> float:
        t = self._process.cpu_times()
        return t.user + t.system

    @staticmethod
    def _nvml(cuda_index: int):
        found = nvml_handle(cuda_index)
        if found is None:
            return None
        nvml, handle = found
        try:
            return (
                nvml,
                handle,
                nvml.nvmlDeviceGetTotalEnergyConsumption(handle),
            )  # mJ since the driver loaded
        except Exception as exc:
            log.info("GPU energy not measured: %s", exc)
            return None

    def cpu_seconds(self) -> float:
        return self._process_cpu() - self._cpu0

    def read(self) -> EnergyReading:
        cpu_s = self.cpu_seconds()
        if self._rapl.readable:
            host_s = busy_seconds(psutil.cpu_times()) - self._host0
            share = min(1.0, cpu_s / host_s) if host_s > 0 else 0.0
            cpu_joules = self._rapl.joules() * share
        else:
            cpu_joules = cpu_s * self.watts_per_core
        if self._gpu is None:
            return EnergyReading(cpu_joules, self.cpu_method)
        nvml, handle, start = self._gpu
        gpu_joules = (nvml.nvmlDeviceGetTotalEnergyConsumption(handle) - start) / 1000.0
        return EnergyReading(cpu_joules, self.cpu_method, gpu_joules, "nvml")
