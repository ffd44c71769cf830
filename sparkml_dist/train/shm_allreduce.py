"""Gradient averaging through shared memory, for DDP ranks that train on CPU on one host.

Gloo's allreduce moves every gradient bucket through loopback TCP: both ranks copy it into
socket buffers, the kernel copies it again, and gloo's threads reduce it, all on the cores the
ranks train on. Ranks that can map the same file in /dev/shm need none of that: each copies its
bucket into its slot of a shared segment, waits at a barrier of one flag per rank, and sums the
slots in rank order into its own bucket (the same bytes on every rank, so the replicas stay
equal). Measured in docs/benchmarks.md (train_scaling_2_ranks_vs_no_comm_ceiling).

`connect` finds out whether the ranks share a /dev/shm by trying it: rank 0 creates a segment
under a random name, every rank opens it and checks a random token, and unless all of them
did, every rank keeps the process group's allreduce (ranks on several hosts, containers with
private /dev/shm, other operating systems). The segment is mode 0600 and unlinked as soon as
every rank has it open, so no other job can open it and nothing is left behind if a rank dies."""

from __future__ import annotations

import logging
import mmap
import os
import platform
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from sparkml_dist.observe.steps import CommClock

log = logging.getLogger(__name__)

SEGMENT_DIR = Path("/dev/shm")
_HEADER = 4096  # token, then one int64 flag per rank; slots start page-aligned after it
_TOKEN_BYTES = 16
_FLAGS_AT = 64
_DDP_BUCKET_BYTES = 25 * 1024 * 1024  # DDP's default bucket_cap_mb: no bucket holds more, plus one parameter
_SPIN_S = 0.002  # yield-polling this long first (peers arrive within microseconds), then sleep-polling
_LIVENESS_EVERY_S = 0.5


class AllreducePeerLost(RuntimeError):
    """A peer rank died, or did not reach the barrier within the process group's timeout (its name
    is one launch.reports counts as a peer's failure, so the loop names the rank that stopped)."""


class SharedMemoryAllreduce:
    """A DDP comm hook's state; register with `model.register_comm_hook(state, shared_memory_hook)`
    on a DDP with the default bucket size (a bucket that outgrows the slots goes through gloo)."""

    def __init__(self, segment: mmap.mmap, rank: int, world_size: int, slot_bytes: int, peers: list[int]):
        self._segment = segment
        self.rank = rank
        self.world_size = world_size
        self.slot_bytes = slot_bytes
        self._peers = peers  # the other ranks' pids, or [] where this process cannot see them
        self.timeout_s = (
            _process_group_timeout_s()
        )  # a rank that never arrives fails as a gloo collective would
        self._flags = torch.frombuffer(segment, dtype=torch.int64, count=world_size, offset=_FLAGS_AT)
        self._generation = 0
        self._views: dict[tuple, torch.Tensor] = {}
        self.clock: CommClock | None = (
            None  # a CommClock (observe.steps) that times each bucket's exposed wait
        )

    @classmethod
    def connect(
        cls, parameters: list[torch.Tensor], rank: int, world_size: int
    ) -> SharedMemoryAllreduce | None:
        """Every rank calls this at once (it runs collectives); None on every rank unless all share a segment."""
        if _FLAGS_AT + 8 * world_size > _HEADER:  # more ranks than flags (the same answer on every rank)
            return None
        slot_bytes = _slot_bytes(parameters)
        size = _HEADER + 2 * world_size * slot_bytes
        here = _stores_stay_ordered()
        created = _create_segment(size) if rank == 0 and here else None
        offer = [None if created is None else (created[0], created[1])]
        dist.broadcast_object_list(offer, src=0)
        segment: mmap.mmap | None
        if created:
            segment = created[2]
        else:
            segment = _open_segment(*offer[0], size) if offer[0] and here else None
        everyone: list[int | None] = [None] * world_size
        dist.all_gather_object(everyone, os.getpid() if segment is not None else None)
        if rank == 0 and created:
            os.unlink(created[0])  # every rank that could open it has; the mappings outlive the name
        if segment is None or any(pid is None for pid in everyone):
            if segment is not None:
                segment.close()
            log.info("DDP ranks do not share /dev/shm: gradients are averaged by the process group")
            return None
        peers = [pid for r, pid in enumerate(everyone) if r != rank and pid is not None]
        visible = all(_alive(pid) for pid in peers)  # not in another pid namespace
        return cls(segment, rank, world_size, slot_bytes, peers if visible else [])

    def allreduce(self, bucket) -> torch.futures.Future:
        buffer = bucket.buffer()
        nbytes = buffer.numel() * buffer.element_size()
        if nbytes > self.slot_bytes:  # every rank's bucket is the same size, so all take this path
            buffer.div_(self.world_size)
            dist.all_reduce(buffer)
            return _done(buffer)
        region = (
            self._generation % 2
        )  # two regions: a rank may write the next bucket while a peer reads this one
        slots = [self._slot(region, r, buffer) for r in range(self.world_size)]
        torch.div(
            buffer, self.world_size, out=slots[self.rank]
        )  # divided on the way in, as DDP's own hook does
        self._barrier()
        torch.add(slots[0], slots[1], out=buffer)  # in rank order on every rank: the same bytes everywhere
        for slot in slots[2:]:
            buffer.add_(slot)
        return _done(buffer)

    def _slot(self, region: int, rank: int, like: torch.Tensor) -> torch.Tensor:
        key = (region, rank, like.dtype, like.numel())
        if key not in self._views:
            offset = _HEADER + (region * self.world_size + rank) * self.slot_bytes
            self._views[key] = torch.frombuffer(
                self._segment, dtype=like.dtype, count=like.numel(), offset=offset
            )
        return self._views[key]

    def _barrier(self) -> None:
        """Raise this rank's flag to the next generation; return once every rank's flag is there.
        The flag is stored after the slot's copy, and x86 keeps stores in order (see `_stores_stay_ordered`)."""
        self._generation += 1
        self._flags[self.rank] = self._generation
        start = time.monotonic()
        next_check = start + _LIVENESS_EVERY_S
        while int(self._flags.min()) < self._generation:
            now = time.monotonic()
            if now - start < _SPIN_S:
                os.sched_yield()
                continue
            time.sleep(0.0001)
            if now >= next_check:
                next_check = now + _LIVENESS_EVERY_S
                self._check_peers(now - start)

    def _check_peers(self, waited_s: float) -> None:
        gone = [pid for pid in self._peers if not _alive(pid)]
        if gone or waited_s > self.timeout_s:
            behind = [r for r in range(self.world_size) if int(self._flags[r]) < self._generation]
            why = f"process {gone[0]} exited" if gone else f"timed out after {waited_s:.0f} s"
            raise AllreducePeerLost(
                f"gradient allreduce in shared memory: rank(s) {behind} never arrived ({why})"
            )


def shared_memory_hook(
    state: SharedMemoryAllreduce, bucket
):  # no annotations on the bucket: DDP inspects them
    """The DDP comm hook: averages `bucket` across the ranks through `state`'s segment."""
    if state.clock is None:
        return state.allreduce(bucket)
    with state.clock.blocking():  # it runs inside backward: all of it is exposed
        return state.allreduce(bucket)


def usable(model: torch.nn.Module) -> bool:
    """Whether this model's ranks may try `connect`: CPU tensors under gloo. The same on every rank
    (one config, one backend), so either all of them run connect's collectives or none does."""
    return all(p.device.type == "cpu" for p in model.parameters()) and dist.get_backend() == "gloo"


def _stores_stay_ordered() -> bool:
    """x86-64's total store order makes a flag written after the data a safe signal without fences;
    elsewhere this rank declines (in connect, so that every rank falls back together)."""
    return platform.machine().lower() in ("x86_64", "amd64")


def _slot_bytes(parameters: list[torch.Tensor]) -> int:
    trainable = [p for p in parameters if p.requires_grad]
    total = sum(p.numel() * p.element_size() for p in trainable)
    largest = max((p.numel() * p.element_size() for p in trainable), default=0)
    return _aligned(min(total, _DDP_BUCKET_BYTES + largest))


def _aligned(nbytes: int, to: int = 4096) -> int:
    return max(to, (nbytes + to - 1) // to * to)


def _create_segment(size: int) -> tuple[str, bytes, mmap.mmap] | None:
    if not SEGMENT_DIR.is_dir():
        return None
    path = str(SEGMENT_DIR / f"sparkml_dist-{secrets.token_hex(16)}")
    token = secrets.token_bytes(_TOKEN_BYTES)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        log.info("no shared memory segment for DDP (%s)", e)
        return None
    try:
        # allocated now, not sparse: a /dev/shm too small for the slots (Docker's default is 64 MiB)
        # fails here with ENOSPC instead of killing a rank with SIGBUS at its first write
        os.posix_fallocate(fd, 0, size)
        segment = mmap.mmap(fd, size)
    except OSError as e:
        os.close(fd)
        os.unlink(path)
        log.info(
            "no shared memory segment of %d bytes for DDP (%s): gradients go through the process group",
            size,
            e,
        )
        return None
    os.close(fd)
    segment[:_TOKEN_BYTES] = token
    return path, token, segment


def _open_segment(path: str, token: bytes, size: int) -> mmap.mmap | None:
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None  # another host, or a private /dev/shm
    try:
        segment = mmap.mmap(fd, size)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    if segment[:_TOKEN_BYTES] != token:
        segment.close()
        return None
    return segment


def _process_group_timeout_s() -> float:
    try:
        world: Any = dist.group.WORLD  # private API, guarded: the default below where it moved
        return world._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    except Exception:
        return dist.default_pg_timeout.total_seconds()


def _alive(pid: int) -> bool:
    """Running, not exited: an exited process its parent has not reaped yet is still signalable."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc: signalable is all we know
    return state not in ("Z", "X")


def _done(buffer: torch.Tensor) -> torch.futures.Future:
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(buffer)
    return future
