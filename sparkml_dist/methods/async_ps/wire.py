"""The parameter servers' wire: authenticated TCP that carries tensors as raw bytes, never pickles.

torch RPC (TensorPipe) has no authentication and unpickles the arguments it receives, so
whoever reaches one of its ports can run code in a rank. Here each server listens on its task's
own address, on a port the kernel picks (no free-port race). A connection first proves the
launch's secret both ways: each side sends 32 fresh random bytes and answers the other's with
an HMAC-SHA256 under the secret. Only then does it carry requests: a length-prefixed JSON
header (the operation, and each tensor's name, dtype and shape) followed by the tensors' raw
bytes. A tensor is read only into the name, dtype and shape the reader already holds; anything
else closes the connection. A refused connection is logged with the peer's address and counted.

Requests: `pull` -> the server's version and its parameters; `push` (gradients and the version
they were computed on) -> whether the server applied them.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import os
import socket
import struct
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from sparkml_dist.launch.rendezvous import bound_listener

log = logging.getLogger(__name__)

NONCE_BYTES = 32
PROOF_BYTES = 32
LABEL = b"sparkml_dist parameter server v1|"
MAX_HEADER_BYTES = 1 << 20
HANDSHAKE_TIMEOUT_S = 10.0
_DTYPES = {
    str(d).removeprefix("torch."): d for d in (torch.float32, torch.float64, torch.float16, torch.bfloat16)
}
_LENGTH = struct.Struct(">I")

Tensors = dict[str, torch.Tensor]
Layout = dict[str, tuple[torch.dtype, tuple[int, ...]]]  # what a reader holds: name -> (dtype, shape)


class WireError(ConnectionError):
    """The peer closed, did not prove the secret, or sent what the reader does not hold."""


class Server(Protocol):
    """What the wire serves (`async_ps.ParameterServer`)."""

    def pull(self) -> tuple[int, Tensors]: ...

    def push(self, grads: Tensors, seen: int) -> bool: ...

    def layout(self) -> Layout: ...


def _proof(secret: bytes, role: bytes, theirs: bytes, mine: bytes) -> bytes:
    return hmac.new(secret, LABEL + role + b"|" + theirs + mine, hashlib.sha256).digest()


def _recv_exactly(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        read = sock.recv_into(view[got:], n - got)
        if read == 0:
            raise WireError("the peer closed the connection")
        got += read
    return buf


def send_frame(sock: socket.socket, header: dict, tensors: Tensors | None = None) -> None:
    tensors = {k: t.detach().contiguous().cpu() for k, t in (tensors or {}).items()}
    header = header | {
        "tensors": [[k, str(t.dtype).removeprefix("torch."), list(t.shape)] for k, t in tensors.items()]
    }
    encoded = json.dumps(header).encode()
    sock.sendall(_LENGTH.pack(len(encoded)) + encoded)
    for t in tensors.values():
        if t.numel():
            sock.sendall(t.reshape(-1).view(torch.uint8).numpy().data)


def recv_frame(sock: socket.socket, holds: Layout) -> tuple[dict, Tensors]:
    """A header and its tensors, each only into a name, dtype and shape that `holds` has."""
    (length,) = _LENGTH.unpack(_recv_exactly(sock, _LENGTH.size))
    if length > MAX_HEADER_BYTES:
        raise WireError(f"a {length}-byte header (at most {MAX_HEADER_BYTES})")
    header = json.loads(_recv_exactly(sock, length))
    tensors: Tensors = {}
    for name, dtype_name, shape in header.pop("tensors", []):
        dtype, want = _DTYPES.get(dtype_name), holds.get(name)
        if want is None or dtype != want[0] or tuple(shape) != want[1]:
            raise WireError(f"a tensor {name!r} ({dtype_name}, {shape}) that this side does not hold as such")
        count = torch.Size(want[1]).numel()
        if count == 0:
            tensors[name] = torch.empty(want[1], dtype=dtype)
            continue
        raw = _recv_exactly(sock, count * dtype.itemsize)
        tensors[name] = torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(want[1])
    return header, tensors


class ServerEndpoint:
    """One server's listener on `host` (its task's address), serving `server` to proven peers."""

    def __init__(self, host: str, secret: bytes, server: Server, name: str):
        self._secret, self._server, self._name = secret, server, name
        self._listener = bound_listener(host)
        self.address = (host, self._listener.getsockname()[1])
        self.refused = 0
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name=f"{name}-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._open.add(conn)
            threading.Thread(
                target=self._serve, args=(conn, peer), name=f"{self._name}-conn", daemon=True
            ).start()

    def _serve(self, conn: socket.socket, peer: tuple) -> None:
        try:
            if not self._admit(conn, peer):
                return
            holds = self._server.layout()
            while True:
                header, tensors = recv_frame(conn, holds)
                if header.get("op") == "pull":
                    version, params = self._server.pull()
                    send_frame(conn, {"version": version}, params)
                elif header.get("op") == "push":
                    send_frame(conn, {"applied": self._server.push(tensors, int(header["seen"]))})
                else:
                    raise WireError(f"an unknown request {header.get('op')!r}")
        except (OSError, ValueError) as exc:  # WireError is an OSError; a bad header a ValueError
            if not self._closed and not (isinstance(exc, WireError) and "peer closed" in str(exc)):
                log.warning("%s: closed the connection from %s:%s: %s", self._name, peer[0], peer[1], exc)
        finally:
            with self._lock:
                self._open.discard(conn)
            conn.close()

    def _admit(self, conn: socket.socket, peer: tuple) -> bool:
        conn.settimeout(HANDSHAKE_TIMEOUT_S)
        nonce = os.urandom(NONCE_BYTES)
        conn.sendall(nonce)
        answer: bytes | bytearray
        try:
            answer = _recv_exactly(conn, NONCE_BYTES + PROOF_BYTES)
        except (OSError, WireError):
            answer = b""
        theirs, proof = bytes(answer[:NONCE_BYTES]), bytes(answer[NONCE_BYTES:])
        if not answer or not hmac.compare_digest(proof, _proof(self._secret, b"client", nonce, theirs)):
            log.warning(
                "%s refused a connection from %s:%s: it did not prove the job's secret",
                self._name,
                peer[0],
                peer[1],
            )
            with self._lock:  # counted after the log line: whoever waits on the count sees the line
                self.refused += 1
            return False
        conn.sendall(_proof(self._secret, b"server", theirs, nonce))
        conn.settimeout(None)
        # a frame is several writes (header, then each tensor): without this, Nagle's algorithm
        # and the peer's delayed ACK hold each answer for about 40 ms
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return True

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._open = list(self._open), set()
        self._listener.close()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@dataclass
class ServerConnection:
    """A worker's connection to one server. Requests are sent and answered separately, so a worker
    asks every server first and then reads the answers (the servers work in parallel)."""

    sock: socket.socket
    address: tuple[str, int]

    @classmethod
    def open(cls, address: tuple[str, int], secret: bytes, timeout_s: float) -> ServerConnection:
        sock = socket.create_connection(address, timeout=HANDSHAKE_TIMEOUT_S)
        try:
            nonce = bytes(_recv_exactly(sock, NONCE_BYTES))
            mine = os.urandom(NONCE_BYTES)
            sock.sendall(mine + _proof(secret, b"client", nonce, mine))
            answer = bytes(_recv_exactly(sock, PROOF_BYTES))
            if not hmac.compare_digest(answer, _proof(secret, b"server", mine, nonce)):
                raise WireError(
                    f"the parameter server at {address[0]}:{address[1]} did not prove the job's secret"
                )
        except (OSError, WireError) as exc:
            sock.close()
            raise WireError(
                f"could not join the parameter server at {address[0]}:{address[1]}: {exc}"
            ) from exc
        sock.settimeout(timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(sock, address)

    def send_pull(self) -> None:
        with self._naming_the_server():
            send_frame(self.sock, {"op": "pull"})

    def recv_pull(self, holds: Layout) -> tuple[int, Tensors]:
        with self._naming_the_server():
            header, params = recv_frame(self.sock, holds)
        return int(header["version"]), params

    def send_push(self, grads: Tensors, seen: int) -> None:
        with self._naming_the_server():
            send_frame(self.sock, {"op": "push", "seen": seen}, grads)

    def recv_push(self) -> bool:
        with self._naming_the_server():
            return bool(recv_frame(self.sock, {})[0]["applied"])

    @contextlib.contextmanager
    def _naming_the_server(self):
        try:
            yield
        except OSError as exc:  # a broken pipe, a timeout, or a WireError of the frame
            raise WireError(f"parameter server at {self.address[0]}:{self.address[1]}: {exc}") from exc

    def close(self) -> None:
        self.sock.close()


def layout_of(tensors: Mapping[str, torch.Tensor]) -> Layout:
    return {k: (t.dtype, tuple(t.shape)) for k, t in tensors.items()}
