"""Per-rank system metrics, sampled on a background thread under MLflow's system-metric names.

MLflow names its system metrics `system/<node id>/<name>` (`mlflow.system_metrics`); a rank is
the node here, so rank 1's CPU is `system/rank1/cpu_utilization_percentage`. The host-wide
figures keep MLflow's meaning (ranks on one host report the same host); the `process_*` ones are
the rank's own process, which is what tells two ranks on one host apart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

import psutil

log = logging.getLogger(__name__)

_MB = 1e6


@dataclass(frozen=True)
class SystemSample:
    """One reading of one rank: `values` by MLflow metric name (without the `system/` prefix)."""

    rank: int
    index: int  # the rank's sample count: the MLflow step
    timestamp_ms: int
    values: Mapping[str, float]

    def metric_names(self) -> dict[str, float]:
        return {f"system/rank{self.rank}/{k}": v for k, v in self.values.items()}


def busy_seconds(times) -> float:
    """The busy part of `psutil.cpu_times()` (all but idle and iowait), in seconds."""
    return sum(getattr(times, f, 0.0) for f in ("user", "system", "nice", "irq", "softirq", "steal"))


def nvml_handle(cuda_index: int):
    """(the pynvml module, the NVML handle of CUDA device `cuda_index`), or None without NVML."""
    try:
        import pynvml
        import torch

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(cuda_index).uuid)
        # NVML numbers GPUs physically; CUDA_VISIBLE_DEVICES renumbers them: match by UUID
        return pynvml, pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except Exception as exc:
        log.info(
            "GPU metrics and energy off: NVML not readable (%s); `pip install nvidia-ml-py` for them", exc
        )
        return None


class _Gpu:
    """NVML readings of the rank's own GPU (`nvidia-ml-py`), or nothing where there is none."""

    def __init__(self, cuda_index: int | None) -> None:
        self.index = cuda_index
        self.nvml = nvml_handle(cuda_index) if cuda_index is not None else None

    def read(self) -> dict[str, float]:
        if self.nvml is None:
            return {}
        (nvml, handle), i = self.nvml, self.index
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        return {
            f"gpu_{i}_utilization_percentage": float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
            f"gpu_{i}_memory_usage_megabytes": memory.used / _MB,
            f"gpu_{i}_power_usage_watts": nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
        }


class SystemSampler:
    """Samples every `interval_s` until `stop()`; `take()` hands over what accumulated."""

    def __init__(self, rank: int, interval_s: float, cuda_index: int | None = None) -> None:
        self.rank = rank
        self.interval_s = interval_s
        self._process = psutil.Process()
        self._gpu = _Gpu(cuda_index)
        self._samples: list[SystemSample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._count = 0
        self._net0 = psutil.net_io_counters()
        self._last = self._cpu_clock()
        self._thread = threading.Thread(
            target=self._run, name=f"sparkml_dist-system-metrics-{rank}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def take(self, sample_now: bool = False) -> tuple[SystemSample, ...]:
        """The samples since the last call; with `sample_now`, one more taken first (an epoch's end:
        every epoch then has a reading, however short it was)."""
        if sample_now:
            self._sample()
        with self._lock:
            out, self._samples = tuple(self._samples), []
        return out

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        with self._lock:
            try:
                values = self._read()
            except Exception as exc:
                log.debug("rank %d: system sample failed: %s", self.rank, exc)
                return
            self._samples.append(SystemSample(self.rank, self._count, int(time.time() * 1000), values))
            self._count += 1

    def _cpu_clock(self) -> tuple[float, float, float, float]:
        """(wall, host busy, host total, process) CPU seconds: utilisation is their change between two
        readings (psutil's own cpu_percent keeps its last reading per thread; samples come from two)."""
        host = psutil.cpu_times()
        busy = busy_seconds(host)
        total = busy + host.idle + getattr(host, "iowait", 0.0)
        proc = self._process.cpu_times()
        return time.perf_counter(), busy, total, proc.user + proc.system

    def _utilisation(self) -> tuple[float, float]:
        now = self._cpu_clock()
        (wall0, busy0, total0, proc0), (wall1, busy1, total1, proc1) = self._last, now
        self._last = now
        # a share of the host's time: within [0, 100], which float rounding of the two sums can
        # otherwise overstep (100.00000000227374 seen under load)
        host = min(100.0, max(0.0, 100.0 * (busy1 - busy0) / (total1 - total0))) if total1 > total0 else 0.0
        process = 100.0 * (proc1 - proc0) / (wall1 - wall0) if wall1 > wall0 else 0.0
        return host, process

    def _read(self) -> dict[str, float]:
        memory = psutil.virtual_memory()
        net = psutil.net_io_counters()
        host_cpu, process_cpu = self._utilisation()
        values = {
            "cpu_utilization_percentage": host_cpu,
            "system_memory_usage_megabytes": memory.used / _MB,
            "system_memory_usage_percentage": memory.percent,
            "network_receive_megabytes": (net.bytes_recv - self._net0.bytes_recv) / _MB,
            "network_transmit_megabytes": (net.bytes_sent - self._net0.bytes_sent) / _MB,
            "process_cpu_percentage": process_cpu,  # 100: one core busy
            "process_rss_megabytes": self._process.memory_info().rss / _MB,
        }
        values.update(self._gpu.read())
        return values
