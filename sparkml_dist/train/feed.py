"""Batches on the training device.

`HostFeed` (CPU): the loader's dense numpy batches as tensors, without a copy.

`CudaFeed` (GPU): the device never waits for the host, and the host does only what it must. A
background thread runs the loader (Parquet decode; rows kept compact: one float per feature
block), packs each shuffle buffer's rows and targets into one pinned host buffer and starts its
`non_blocking` copy on a side stream; the step's stream waits on that copy's event only. The
shuffle (a random gather: on the host the costliest part of the loader, ~38 ms per 262k rows on
this project's CPU machine) and the one-hot expansion (`data.expand.DeviceExpander`) run on the
device. Pinned buffers are reused in a ring, each only after its previous copy finished.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Protocol

import numpy as np
import torch

from sparkml_dist.data.loader import batched

Batch = tuple[torch.Tensor, torch.Tensor]  # (rows [B, width], targets [B, 2]: label, weight)


class BatchSource(Protocol):
    """What a feed reads: `ShardLoader` or `FrameShardLoader`."""

    batch_size: int

    @property
    def batch_width(self) -> int: ...

    @property
    def num_batches(self) -> int: ...

    # labels are None only where the rows have no label column (scoring's reads, never training's)
    def epoch(self, epoch: int, skip_batches: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray | None]]: ...


class HostFeed:
    def __init__(self, loader: BatchSource):
        self.loader = loader

    def epoch(self, epoch: int, skip_batches: int = 0) -> Iterator[Batch]:
        for x, y in self.loader.epoch(epoch, skip_batches=skip_batches):
            if y is None:
                raise ValueError("a training feed reads labelled rows; these have no label column")
            yield torch.from_numpy(x), torch.from_numpy(y)

    def zeros(self) -> Batch:
        """One all-zero row and target (weight 0): what a rank out of batches steps on."""
        return torch.zeros(1, self.loader.batch_width), torch.zeros(1, 2)


_END = object()


class CudaFeed:
    def __init__(self, loader: BatchSource, device: torch.device, depth: int = 2):
        self.loader = loader
        self.device = device
        self.depth = depth  # shuffle buffers copied ahead of the step
        self.width = loader.batch_width
        self.stream = torch.cuda.Stream(device)
        # ring of pinned buffers (rows and targets packed, and the permutation): depth in the
        # queue, one in the step's hands, one being filled; each grows to the largest buffer
        self.ring: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * (depth + 2)
        self.copied: list[torch.cuda.Event | None] = [None] * len(self.ring)

    def zeros(self) -> Batch:
        return (torch.zeros(1, self.width, device=self.device), torch.zeros(1, 2, device=self.device))

    def epoch(self, epoch: int, skip_batches: int = 0) -> Iterator[Batch]:
        """The loader's batches, on the device. A `ShardLoader` hands over whole shuffle buffers
        (a few row groups, in the order read, with their permutation): each is copied in one go,
        permuted on the device and cut into batches there, exactly as the host would have cut
        them (`data.loader.batched`), so a resumed epoch skips to the same batch. Any other
        loader's batches are copied one by one."""
        if hasattr(self.loader, "buffers"):
            source, skip = self.loader.buffers(epoch), skip_batches
        else:
            source, skip = ((x, y, None) for x, y in self.loader.epoch(epoch, skip_batches=skip_batches)), 0
        yield from packed_batches(self._on_device(source), self.width, self.loader.batch_size, skip)

    def _on_device(
        self, source: Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None]]
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        """Each buffer's packed rows and permutation on the device, once the step's stream may use them."""
        ready: queue.Queue = queue.Queue(maxsize=self.depth)
        stop = threading.Event()
        worker = threading.Thread(
            target=self._produce, args=(source, ready, stop), name="cuda-feed", daemon=True
        )
        worker.start()
        current = torch.cuda.current_stream(self.device)
        try:
            while True:
                item = ready.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                packed, order, copied = item
                current.wait_event(copied)  # the step's stream waits for this copy on the device, not here
                packed.record_stream(current)  # its memory is not reused before the step is done with it
                if order is not None:
                    order.record_stream(current)
                yield packed, order
        finally:
            stop.set()
            while worker.is_alive():  # unblock a producer waiting on a full queue
                try:
                    ready.get_nowait()
                except queue.Empty:
                    worker.join(0.01)

    def _produce(self, source, ready: queue.Queue, stop: threading.Event) -> None:
        try:
            with torch.cuda.device(self.device):
                for index, (x, y, order) in enumerate(source):
                    if stop.is_set():
                        return
                    ready.put(self._copy(index % len(self.ring), x, y, order))
        except BaseException as exc:
            ready.put(exc)
        finally:
            ready.put(_END)

    def _copy(self, slot: int, x: np.ndarray, y: np.ndarray, order: np.ndarray | None):
        previous = self.copied[slot]
        if previous is not None:
            previous.synchronize()  # this pinned buffer's last copy to the device is done
        rows = len(x)
        held = self.ring[slot]
        if held is None or len(held[0]) < rows:
            held = (
                torch.empty(rows, self.width + 2, pin_memory=True),
                torch.empty(rows, dtype=torch.int64, pin_memory=True),
            )
            self.ring[slot] = held
        host, host_order = held[0][:rows], held[1][:rows]
        view = host.numpy()
        view[:, : self.width] = x
        view[:, self.width :] = y
        if order is not None:
            host_order.numpy()[:] = order
        with torch.cuda.stream(self.stream):
            packed = host.to(self.device, non_blocking=True)
            on_device = host_order.to(self.device, non_blocking=True) if order is not None else None
            copied = torch.cuda.Event()
            copied.record(self.stream)
        self.copied[slot] = copied
        return packed, on_device, copied


def packed_batches(
    buffers: Iterable[tuple[torch.Tensor, torch.Tensor | None]],
    width: int,
    batch_size: int,
    skip_batches: int,
) -> Iterator[Batch]:
    """Shuffle buffers of packed rows ([rows, width + 2]: the rows, then label and weight), each
    permuted by its order where it has one (one gather, where the tensors are), cut into the
    batches the host would cut from the same buffers (`data.loader.batched`)."""

    def permuted():
        for packed, order in buffers:
            if order is not None:
                packed = packed.index_select(0, order)
            yield packed[:, :width], packed[:, width:]

    return batched(permuted(), batch_size, skip_batches, torch.cat)


def make_feed(loader: BatchSource, device: torch.device) -> HostFeed | CudaFeed:
    return CudaFeed(loader, device) if device.type == "cuda" else HostFeed(loader)
