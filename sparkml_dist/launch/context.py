"""What a rank knows about itself, and the scoped side effects a rank needs (env, output tail)."""

from __future__ import annotations

import collections
import io
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PartitionData:
    """A rank's share of a DataFrame, spilled by the barrier task to an Arrow IPC file on local disk."""

    path: str
    rows_per_rank: tuple[int, ...]  # every rank's row count, in rank order

    @property
    def rows_each_epoch(self) -> int:
        """Rows every rank takes per epoch: the largest share, so all ranks take the same steps."""
        return max(self.rows_per_rank)


@dataclass(frozen=True)
class RankContext:
    rank: int
    world_size: int
    local_rank: int
    local_size: int
    cross_rank: int  # index of this rank's host among the hosts
    cross_size: int  # number of hosts
    host: str
    master_addr: str
    master_port: int
    gpus: tuple[str, ...] = ()
    extra: Mapping[str, str] = field(default_factory=dict)  # backend-specific, from the driver
    partition: PartitionData | None = None  # launched over a DataFrame: this rank's rows, spilled locally
    # the launch's secret (fresh random bytes, this stage's tasks only): services a rank opens to
    # its peers admit only those that prove it (train.ps_wire)
    secret: bytes = field(default=b"", repr=False, compare=False)

    @property
    def is_chief(self) -> bool:
        return self.rank == 0


def layout(addresses: list[str], rank: int, gpus: tuple[str, ...] = ()) -> dict:
    """Rank layout from the barrier tasks' addresses (host:port per rank, in rank order)."""
    hosts = [a.rsplit(":", 1)[0] for a in addresses]
    unique_hosts = list(dict.fromkeys(hosts))
    host = hosts[rank]
    same_host = [r for r, h in enumerate(hosts) if h == host]
    return {
        "rank": rank,
        "world_size": len(hosts),
        "local_rank": same_host.index(rank),
        "local_size": len(same_host),
        "cross_rank": unique_hosts.index(host),
        "cross_size": len(unique_hosts),
        "host": host,
        "master_addr": hosts[0],
        "gpus": gpus,
    }


@contextmanager
def env_scope(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the block and restore the previous state afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update({k: str(v) for k, v in values.items()})
    try:
        yield
    finally:
        for k, old in saved.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old


class _Tee(io.TextIOBase):
    def __init__(self, target, tail: collections.deque, on_line: Callable[[str], None] | None, echo: bool):
        self._target = target
        self._tail = tail
        self._on_line = on_line
        self._echo = echo
        self._partial = ""

    def write(self, s: str) -> int:
        if self._echo:
            self._target.write(s)
        lines = (self._partial + s).split("\n")
        self._partial = lines.pop()
        self._tail.extend(lines)
        if self._on_line is not None:
            for line in lines:
                self._on_line(line)
        return len(s)

    def flush(self) -> None:
        self._target.flush()


@contextmanager
def captured_output(
    max_lines: int = 40, on_line: Callable[[str], None] | None = None, echo: bool = True
) -> Iterator[collections.deque]:
    """Tee stdout/stderr and the library's log records; yields the deque of the last lines.
    `on_line` also gets every complete line (the driver relay); `echo=False` keeps them out of
    the worker's own stdout (a local master's workers print to the driver's terminal already)."""
    tail: collections.deque = collections.deque(maxlen=max_lines)
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Tee(out, tail, on_line, echo), _Tee(err, tail, on_line, echo)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    lib_logger = logging.getLogger("sparkml_dist")
    old_level = lib_logger.level
    lib_logger.addHandler(handler)
    lib_logger.setLevel(logging.INFO)
    try:
        yield tail
    finally:
        lib_logger.removeHandler(handler)
        lib_logger.setLevel(old_level)
        sys.stdout, sys.stderr = out, err
