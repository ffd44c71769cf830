"""Batches on the training device.

`HostFeed` (CPU): the loader's dense numpy batches as tensors, without a copy.

`CudaFeed` (GPU): the device never waits for the host. A background thread runs the loader
(Parquet decode, shuffle; rows kept compact: one float per feature block), packs each batch's
rows and targets into one pinned host buffer and starts its `non_blocking` copy on a side
stream; the step's stream waits on that copy's event only, never on the host. The one-hot
expansion then runs on the device (`data.expand.DeviceExpander`), so the host never builds the
dense matrix. Pinned buffers are reused in a ring, each only after its previous copy finished.
"""

from __future__ import annotations

import queue
import threading
from typing import Iterator, Protocol

import numpy as np
import torch

Batch = tuple[torch.Tensor, torch.Tensor]  # (rows [B, width], targets [B, 2]: label, weight)


class BatchSource(Protocol):
    """What a feed reads: `ShardLoader` or `FrameShardLoader`."""

    batch_size: int

    @property
    def batch_width(self) -> int: ...

    @property
    def num_batches(self) -> int: ...

    def epoch(self, epoch: int, skip_batches: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]: ...


class HostFeed:
    def __init__(self, loader: BatchSource):
        self.loader = loader

    def epoch(self, epoch: int, skip_batches: int = 0) -> Iterator[Batch]:
        for x, y in self.loader.epoch(epoch, skip_batches=skip_batches):
            yield torch.from_numpy(x), torch.from_numpy(y)

    def zeros(self) -> Batch:
        """One all-zero row and target (weight 0): what a rank out of batches steps on."""
        return torch.zeros(1, self.loader.batch_width), torch.zeros(1, 2)


_END = object()


class CudaFeed:
    def __init__(self, loader: BatchSource, device: torch.device, depth: int = 4):
        self.loader = loader
        self.device = device
        self.depth = depth  # batches copied ahead of the step
        self.width = loader.batch_width
        self.stream = torch.cuda.Stream(device)
        # ring of pinned buffers: depth in the queue, one in the step's hands, one being filled
        self.ring = [torch.empty(loader.batch_size, self.width + 2, pin_memory=True) for _ in range(depth + 2)]
        self.copied: list[torch.cuda.Event | None] = [None] * len(self.ring)

    def zeros(self) -> Batch:
        return (torch.zeros(1, self.width, device=self.device), torch.zeros(1, 2, device=self.device))

    def epoch(self, epoch: int, skip_batches: int = 0) -> Iterator[Batch]:
        ready: queue.Queue = queue.Queue(maxsize=self.depth)
        stop = threading.Event()
        worker = threading.Thread(target=self._produce, args=(epoch, skip_batches, ready, stop),
                                  name="cuda-feed", daemon=True)
        worker.start()
        current = torch.cuda.current_stream(self.device)
        try:
            while True:
                item = ready.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                packed, copied = item
                current.wait_event(copied)  # the step waits for this copy on the device, not here
                packed.record_stream(current)  # its memory is not reused before the step is done with it
                yield packed[:, :self.width], packed[:, self.width:]
        finally:
            stop.set()
            while worker.is_alive():  # unblock a producer waiting on a full queue
                try:
                    ready.get_nowait()
                except queue.Empty:
                    worker.join(0.01)

    def _produce(self, epoch: int, skip_batches: int, ready: queue.Queue, stop: threading.Event) -> None:
        try:
            with torch.cuda.device(self.device):
                for index, (x, y) in enumerate(self.loader.epoch(epoch, skip_batches=skip_batches)):
                    if stop.is_set():
                        return
                    ready.put(self._copy(index % len(self.ring), x, y))
        except BaseException as exc:  # noqa: BLE001 - handed to the step's thread, which raises it
            ready.put(exc)
        finally:
            ready.put(_END)

    def _copy(self, slot: int, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.cuda.Event]:
        if self.copied[slot] is not None:
            self.copied[slot].synchronize()  # this pinned buffer's last copy to the device is done
        rows = len(x)
        host = self.ring[slot][:rows]
        view = host.numpy()
        view[:, :self.width] = x
        view[:, self.width:] = y
        with torch.cuda.stream(self.stream):
            packed = host.to(self.device, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(self.stream)
        self.copied[slot] = copied
        return packed, copied


def make_feed(loader: BatchSource, device: torch.device) -> HostFeed | CudaFeed:
    return CudaFeed(loader, device) if device.type == "cuda" else HostFeed(loader)
