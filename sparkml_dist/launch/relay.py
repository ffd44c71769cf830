"""Rank output streamed to the driver's log as it is written.

Spark shows a task's output only in its executor's log, after the fact. The driver starts an
`OutputRelay` (one TCP listener on the driver's address, port chosen by the OS); each rank's
`RelaySink` connects, proves it belongs to this launch with the launch's random token, and sends
its lines. The driver logs them as `[rank N] line` on the `sparkml_dist.ranks` logger.
"""

from __future__ import annotations

import hmac
import logging
import queue
import secrets
import socket
import socketserver
import threading
from dataclasses import dataclass

log = logging.getLogger("sparkml_dist.ranks")
_TOKEN_BYTES = 16


@dataclass(frozen=True)
class RelayAddress:
    """Where a rank sends its lines, and the token that admits it (travels in the task closure)."""

    host: str
    port: int
    token: str


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        first = self.rfile.readline(256).decode(errors="replace").strip()
        if not hmac.compare_digest(first, self.server.token):  # type: ignore[attr-defined]
            return  # not this launch's rank: say nothing, read nothing more
        for raw in self.rfile:
            rank, _, line = raw.decode(errors="replace").rstrip("\n").partition("\t")
            self.server.emit(rank, line)  # type: ignore[attr-defined]


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = False

    def __init__(self, host: str, token: str, emit):
        super().__init__((host, 0), _Handler)
        self.token = token
        self.emit = emit


class OutputRelay:
    """Driver side: a listener bound to `host` only, admitting connections that present the token."""

    def __init__(self, host: str, emit=None):
        self._token = secrets.token_hex(_TOKEN_BYTES)
        self._server = _Server(host, self._token, emit or self._log_line)
        # stop() waits for the serving loop's next poll: 50 ms, not socketserver's 0.5 s, at the end of every launch
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="sparkml_dist-relay", daemon=True)
        self._thread.start()

    @property
    def address(self) -> RelayAddress:
        host, port = self._server.server_address[:2]
        return RelayAddress(str(host), int(port), self._token)

    @staticmethod
    def _log_line(rank: str, line: str) -> None:
        log.info("[rank %s] %s", rank, line)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class RelaySink:
    """Rank side: queues lines and sends them from a background thread, so a slow or unreachable
    driver never slows the rank; lines that cannot be sent are dropped (the rank's own log keeps them)."""

    def __init__(self, address: RelayAddress, rank: int):
        self._rank = rank
        self._lines: queue.Queue[str | None] = queue.Queue(maxsize=10000)
        self._thread = threading.Thread(target=self._send_all, args=(address,), name="sparkml_dist-sink", daemon=True)
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
