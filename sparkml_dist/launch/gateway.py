"""Authenticated access to the rendezvous store.

torch's TCPStore has no authentication: whoever reaches its port can read and write the keys
the ranks rendezvous with. Here the store server listens on loopback only, and the one port
other hosts can reach is a gateway that first challenges each connection. It sends 32 random
bytes, and only a peer that returns their HMAC-SHA256 under the job's secret is piped through
to the store. The secret is fresh random bytes per launch, handed to this stage's tasks only.
Everything else is refused and logged.

Each rank's own TCPStore client reaches the gateway through a forwarder in its own process.
The forwarder listens on loopback and pipes only connections that this process opened, or a
process it started (a training script the rank runs). It looks up the connecting socket's
inode in /proc/net/tcp and finds it among those processes' /proc/<pid>/fd. So another local
process cannot borrow the rank's proof. Linux only, like the rest of the launcher.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import socket
import threading
from typing import Callable

from sparkml_dist.launch.rendezvous import bound_listener

log = logging.getLogger(__name__)

NONCE_BYTES = 32
_LABEL = b"sparkml_dist rendezvous v1|"
HANDSHAKE_TIMEOUT_S = 10.0


def proof(secret: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, _LABEL + nonce, hashlib.sha256).digest()


class _Listener:
    """A bound listener with an accept thread; `handle(conn, peer)` runs on a thread per connection."""

    def __init__(self, host: str, handle: Callable[[socket.socket, tuple], None], name: str):
        self._socket = bound_listener(host)
        self.host, self.port = host, self._socket.getsockname()[1]
        self._handle = handle
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept_loop, name=name, daemon=True).start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, peer = self._socket.accept()
            except OSError:
                return  # closed
            self._track(conn)
            threading.Thread(target=self._handle_safely, args=(conn, peer), daemon=True).start()

    def _handle_safely(self, conn: socket.socket, peer: tuple) -> None:
        try:
            self._handle(conn, peer)
        except OSError:
            _close(conn)

    def _track(self, *socks: socket.socket) -> None:
        with self._lock:
            if self._closed:
                for s in socks:
                    _close(s)
            self._open.update(socks)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            opened, self._open = list(self._open), set()
        _close(self._socket)
        for s in opened:
            _close(s)


class StoreGateway(_Listener):
    """On rank 0's task address: challenge, then pipe to the loopback store at `store_port`."""

    def __init__(self, host: str, store_port: int, secret: bytes):
        self.store_port = store_port
        self.secret = secret
        self.refused = 0
        super().__init__(host, self._serve, "sparkml_dist-rendezvous-gateway")

    def _serve(self, conn: socket.socket, peer: tuple) -> None:
        conn.settimeout(HANDSHAKE_TIMEOUT_S)
        nonce = os.urandom(NONCE_BYTES)
        conn.sendall(nonce)
        answer = _recv_exactly(conn, NONCE_BYTES)
        if answer is None or not hmac.compare_digest(answer, proof(self.secret, nonce)):
            self.refused += 1
            log.warning("rendezvous gateway %s:%d refused a connection from %s:%d: it did not prove the job's "
                        "secret", self.host, self.port, peer[0], peer[1])
            _close(conn)
            return
        conn.settimeout(None)
        store = socket.create_connection(("127.0.0.1", self.store_port))
        self._track(store)
        _pipe(conn, store)


class LocalForwarder(_Listener):
    """In a rank's own process, on loopback: this process's store clients connect here; each
    connection is carried to the gateway with the job's proof."""

    def __init__(self, gateway_host: str, gateway_port: int, secret: bytes):
        self.gateway = (gateway_host, gateway_port)
        self.secret = secret
        self.refused = 0
        super().__init__("127.0.0.1", self._serve, "sparkml_dist-rendezvous-forwarder")

    def _serve(self, conn: socket.socket, peer: tuple) -> None:
        if not opened_by_this_process(peer[1], self.port):
            self.refused += 1
            log.warning("rendezvous forwarder 127.0.0.1:%d refused a connection from port %d: not this rank's process",
                        self.port, peer[1])
            _close(conn)
            return
        upstream = socket.create_connection(self.gateway, timeout=HANDSHAKE_TIMEOUT_S)
        self._track(upstream)
        nonce = _recv_exactly(upstream, NONCE_BYTES)
        if nonce is None:
            raise OSError(f"the rendezvous gateway {self.gateway[0]}:{self.gateway[1]} closed during the handshake")
        upstream.sendall(proof(self.secret, nonce))
        upstream.settimeout(None)
        _pipe(conn, upstream)


def opened_by_this_process(peer_port: int, listen_port: int) -> bool:
    """Is the loopback socket 127.0.0.1:peer_port -> 127.0.0.1:listen_port held by this process or
    one it started (a training script the rank runs as a child)? torch's client may connect from
    an IPv6 socket to the v4-mapped address, so /proc/net/tcp6 is read too."""
    inode = _socket_inode(peer_port, listen_port)
    if inode is None:
        return False
    target = f"socket:[{inode}]"
    for pid in _this_process_and_descendants():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return True
            except OSError:
                continue
    return False


def _this_process_and_descendants() -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                parent = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, frontier = [os.getpid()], [os.getpid()]
    while frontier:
        frontier = [c for p in frontier for c in children.get(p, [])]
        found.extend(frontier)
    return found


def _socket_inode(peer_port: int, listen_port: int) -> str | None:
    local, remote = f"0100007F:{peer_port:04X}", f"0100007F:{listen_port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as rows:
                next(rows)
                for row in rows:
                    fields = row.split()
                    if fields[1].endswith(local) and fields[2].endswith(remote) and fields[9] != "0":
                        return fields[9]
        except OSError:
            continue
    return None


def _pipe(a: socket.socket, b: socket.socket) -> None:
    """Copy both ways; when either side ends, both sockets close (which ends the other copy)."""

    def copy(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _close(a)
            _close(b)

    threading.Thread(target=copy, args=(b, a), daemon=True).start()
    copy(a, b)


def _recv_exactly(conn: socket.socket, n: int) -> bytes | None:
    data = b""
    try:
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                return None
            data += chunk
    except OSError:
        return None
    return data


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
