"""Rank output streamed to the driver's log as it is written.

Spark shows a task's output only in its executor's log, after the fact. The driver starts an
`OutputRelay` (one TCP listener on the driver's address, port chosen by the OS); each rank's
`RelaySink` connects, proves it belongs to this launch with the launch's random token
(launch.listener), and sends its lines. The driver logs them as `[rank N] line` on the `sparkml_dist.ranks` logger.
"""

from __future__ import annotations

import logging
import queue
import socket
import socketserver
import threading
from dataclasses import dataclass

from sparkml_dist.launch.listener import TokenListener
from sparkml_dist.launch.ports import PortRange

log = logging.getLogger("sparkml_dist.ranks")


def log_rank_line(rank: int | str, line: str) -> None:
    """A rank's output line on the driver's log, as the relay and the Connect launch write it."""
    log.info("[rank %s] %s", rank, line)


@dataclass(frozen=True)
class RelayAddress:
    """Where a rank sends its lines, and the token that admits it (travels in the task closure)."""

    host: str
    port: int
    token: str


class OutputRelay:
    """Driver side: a listener bound to `host` only, admitting connections that present the
    launch's token (launch.listener)."""

    def __init__(self, host: str, emit=None, ports: PortRange | None = None):
        self._emit = emit or self._log_line
        self._listener = TokenListener(host, "output relay", self._serve, ports)

    @property
    def address(self) -> RelayAddress:
        return RelayAddress(self._listener.host, self._listener.port, self._listener.token)

    @property
    def refused(self) -> int:
        """Connections turned away for want of the launch's token."""
        return self._listener.refused

    def _serve(self, handler: socketserver.StreamRequestHandler) -> None:
        for raw in handler.rfile:
            rank, _, line = raw.decode(errors="replace").rstrip("\n").partition("\t")
            self._emit(rank, line)

    @staticmethod
    def _log_line(rank: str, line: str) -> None:
        log_rank_line(rank, line)

    def stop(self) -> None:
        self._listener.stop()


class RelaySink:
    """Rank side: queues lines and sends them from a background thread, so a slow or unreachable
    driver never slows the rank; lines that cannot be sent are dropped (the rank's own log keeps them)."""

    def __init__(self, address: RelayAddress, rank: int):
        self._rank = rank
        self._lines: queue.Queue[str | None] = queue.Queue(maxsize=10000)
        self._thread = threading.Thread(
            target=self._send_all, args=(address,), name="sparkml_dist-sink", daemon=True
        )
        self._thread.start()

    def __call__(self, line: str) -> None:
        try:
            self._lines.put_nowait(line)
        except queue.Full:
            pass

    def close(self, timeout_s: float = 5.0) -> None:
        try:
            self._lines.put(None, timeout=timeout_s)
        except queue.Full:
            return  # the sender is gone
        self._thread.join(timeout=timeout_s)

    def _send_all(self, address: RelayAddress) -> None:
        try:
            conn = socket.create_connection((address.host, address.port), timeout=10)
        except OSError:
            conn = None
        try:
            if conn is not None:
                conn.sendall(address.token.encode() + b"\n")
            while (line := self._lines.get()) is not None:
                if conn is not None:
                    conn.sendall(f"{self._rank}\t{line}\n".encode(errors="replace"))
        except OSError:
            pass  # the driver went away; the rank carries on
        finally:
            if conn is not None:
                conn.close()
