"""The ranks' all-gather and end barrier, through a listener on the driver.

Spark's `BarrierTaskContext.allGather()` and `barrier()` wait for their RPC by sleeping a whole
second between checks, so each call costs at least a second however early the last rank arrives
(measured here: 1.006-1.009 s for two ranks that arrived 40 ms apart). A launch makes two such
calls, so two seconds of every launch were sleep. The driver starts a `LaunchCoordinator` (one TCP
listener on the driver's address, port chosen by the OS, like the output relay: launch.listener);
each rank connects, proves it belongs to this launch with the launch's random token, posts its value and
gets every rank's value back the moment the last rank has posted.

A rank that dies never posts: the others wait until Spark kills the barrier stage's tasks (as in
Spark's own barrier), or until the driver stops the coordinator, which closes their connections.
A rank that dies while it waits has its value withdrawn (its connection is checked twice a
second), so that the ranks of a re-run of the stage never meet a dead task's value.
"""

from __future__ import annotations

import json
import select
import socket
import socketserver
import threading
from collections.abc import Callable
from dataclasses import dataclass

from sparkml_dist.launch.listener import TokenListener
from sparkml_dist.launch.ports import PortRange

_MAX_LINE = 1 << 20  # a rank's value is a short JSON document
_PEER_CHECK_S = 0.5  # how often a waiting rank's connection is checked for its task having died


@dataclass(frozen=True)
class CoordinatorAddress:
    """Where the ranks meet, and the token that admits them (travels in the task closure)."""

    host: str
    port: int
    token: str = ""


class CoordinatorGone(ConnectionError):
    """The driver's coordinator closed the connection before every rank had posted."""


class _Round:
    def __init__(self) -> None:
        self.posted: dict[int, str] = {}
        self.superseded = False


class _Exchanges:
    """The values posted so far, per step: replied to all once every rank has posted. A rank that
    posts a step twice belongs to a re-run of the barrier stage (Spark re-runs all of its tasks),
    so that step starts a fresh round."""

    def __init__(self, num_ranks: int):
        self.num_ranks = num_ranks
        self.stopped = False
        self._rounds: dict[str, _Round] = {}
        self._changed = threading.Condition()

    def post_and_wait(
        self, step: str, rank: int, value: str, still_there: Callable[[], bool]
    ) -> list[str] | None:
        """Every rank's value in rank order; None when the coordinator stopped first, or when the
        poster went away while it waited (its value is withdrawn: a killed task must not stand in
        for the rank in a re-run of the stage)."""
        if not 0 <= rank < self.num_ranks:
            return None
        with self._changed:
            current = self._rounds.get(step)
            if current is None or rank in current.posted:
                if current is not None:
                    current.superseded = True
                current = self._rounds[step] = _Round()
            current.posted[rank] = value
            self._changed.notify_all()
            while len(current.posted) < self.num_ranks and not (self.stopped or current.superseded):
                self._changed.wait(timeout=_PEER_CHECK_S)
                if len(current.posted) < self.num_ranks and not still_there():
                    current.posted.pop(rank, None)
                    return None
            if len(current.posted) < self.num_ranks:
                return None
            return [current.posted[r] for r in range(self.num_ranks)]

    def stop(self) -> None:
        with self._changed:
            self.stopped = True
            self._changed.notify_all()


def _open(conn: socket.socket) -> bool:
    """A waiting rank sends nothing more: its socket turns readable only when the rank has gone."""
    try:
        readable, _, _ = select.select([conn], [], [], 0)
        return not readable or conn.recv(1, socket.MSG_PEEK) != b""
    except OSError:
        return False


class LaunchCoordinator:
    """Driver side: a listener bound to `host` only (launch.listener), for the `num_ranks` ranks
    of one launch."""

    def __init__(self, host: str, num_ranks: int, ports: PortRange | None = None):
        self._exchanges = _Exchanges(num_ranks)
        self._listener = TokenListener(host, "launch coordinator", self._serve, ports)

    @property
    def address(self) -> CoordinatorAddress:
        return CoordinatorAddress(self._listener.host, self._listener.port, self._listener.token)

    @property
    def refused(self) -> int:
        """Connections turned away for want of the launch's token."""
        return self._listener.refused

    def _serve(self, handler: socketserver.StreamRequestHandler) -> None:
        try:
            request = json.loads(handler.rfile.readline(_MAX_LINE))
            values = self._exchanges.post_and_wait(
                str(request["step"]),
                int(request["rank"]),
                str(request["value"]),
                lambda: _open(handler.connection),
            )
        except (ValueError, KeyError, TypeError):
            return
        if values is not None:
            handler.wfile.write(json.dumps(values).encode() + b"\n")

    def stop(self) -> None:
        self._exchanges.stop()  # ranks still waiting get their connection closed
        self._listener.stop()


def all_gather(
    address: CoordinatorAddress, step: str, rank: int, value: str, connect_timeout_s: float = 30.0
) -> list[str]:
    """Rank side: post `value` for `step` and return every rank's value, in rank order, once all
    have posted."""
    try:
        conn = socket.create_connection((address.host, address.port), timeout=connect_timeout_s)
    except OSError as exc:
        raise CoordinatorGone(
            f"rank {rank} cannot reach the launch's coordinator on the driver at "
            f"{address.host}:{address.port} ({exc}): executors must be able to connect to the "
            f"driver's address (spark.driver.host) on any port, as for the rank output relay"
        ) from exc
    with conn:
        conn.settimeout(None)  # as long as the slowest rank takes; a dead rank's stage is killed by Spark
        conn.sendall(
            f"{address.token}\n".encode()
            + json.dumps({"step": step, "rank": rank, "value": value}).encode()
            + b"\n"
        )
        reply = conn.makefile("rb").readline()
    if not reply:
        raise CoordinatorGone(f"rank {rank}: the driver ended the launch before every rank reached {step!r}")
    return json.loads(reply)
