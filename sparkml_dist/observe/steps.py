"""The step-time breakdown: how long each training step spent waiting for data, computing forward
and backward, communicating and in the optimizer.

Communication is measured where it happens, not inferred: the parallelism (train/parallelism.py) reports each collective's
launch and completion (`CommClock`: a DDP comm hook, Horovod's synchronize, a parameter server's
pull and push). What counts is the *exposed* part, the time a step could not compute because it
waited for a collective; allreduce running under backward's compute is overlapped and costs none.
Compute is then the forward+backward span less the exposed communication inside it, so the four
parts add up to the step (up to the loop's own bookkeeping).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

PHASES = ("data", "compute", "comm", "optimizer")


class CommClock:
    """Collectives of the current step, as (start, end) intervals of exposed waiting.

    Asynchronous collectives (DDP buckets) call `launched()` when a bucket goes out and `done()`
    from the completion callback; the wait they expose is from the last launch (the end of
    backward's compute) to the last completion. Blocking ones wrap the wait in `blocking()`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_launch: float | None = None
        self._last_done: float | None = None
        self._blocking: list[tuple[float, float]] = []

    def launched(self) -> None:
        with self._lock:
            self._last_launch = time.perf_counter()

    def done(self) -> None:
        now = time.perf_counter()  # on the collective's completion thread
        with self._lock:
            self._last_done = now if self._last_done is None else max(self._last_done, now)

    def blocking(self) -> _Blocking:
        return _Blocking(self)

    def take(self) -> list[tuple[float, float]]:
        """This step's exposed intervals; the clock starts over for the next step."""
        with self._lock:
            spans = list(self._blocking)
            if (
                self._last_launch is not None
                and self._last_done is not None
                and self._last_done > self._last_launch
            ):
                spans.append((self._last_launch, self._last_done))
            self._last_launch = self._last_done = None
            self._blocking = []
        return spans


class _Blocking:
    def __init__(self, clock: CommClock) -> None:
        self._clock = clock

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *exc) -> None:
        end = time.perf_counter()
        with self._clock._lock:
            self._clock._blocking.append((self._start, end))


def _overlap(spans: list[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)


@dataclass
class StepTimes:
    """Seconds per step of one epoch on one rank, phase by phase."""

    data: list[float] = field(default_factory=list)
    compute: list[float] = field(default_factory=list)
    comm: list[float] = field(default_factory=list)
    optimizer: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)  # step start to the next step's start, measured

    def add(
        self,
        start: float,
        data_ready: float,
        backward_done: float,
        optimizer_done: float,
        end: float,
        comm: list[tuple[float, float]],
    ) -> None:
        in_backward = _overlap(comm, data_ready, backward_done)
        in_optimizer = _overlap(comm, backward_done, optimizer_done)
        self.data.append(data_ready - start)
        self.compute.append(backward_done - data_ready - in_backward)
        self.comm.append(in_backward + in_optimizer)
        self.optimizer.append(optimizer_done - backward_done - in_optimizer)
        self.total.append(end - start)

    def means_ms(self) -> dict[str, float]:
        """Mean ms per step of each part and of the whole step (empty: no step was timed). Means,
        not medians: the epoch's time is steps x mean, so the parts add up to the step; medians of
        the parts do not (measured: 10% apart on a 2-rank DDP epoch, where comm and compute trade
        places from step to step)."""
        if not self.total:
            return {}
        out = {p: 1000 * float(np.mean(getattr(self, p))) for p in PHASES}
        out["total"] = 1000 * float(np.mean(self.total))
        return out
