"""The rendezvous gateway's and forwarder's own process (standard library only; run as a script).

A separate process, not threads in the rank's: C++ code in the rank (TensorPipe's agent,
measured) blocks on store traffic while holding the GIL, so a Python thread that carries that
traffic inside the same interpreter would never run.

    python -I -c "<this source>" gateway|forward BIND_HOST TARGET_HOST TARGET_PORT ALLOWED_PID PORTS

PORTS: 0 for a port the kernel picks, else FIRST-LAST (`spark.sparkml_dist.driver.ports`).

stdin: the secret in hex on the first line; the process exits when stdin closes (its launcher
ended or died). stdout: `PORT <n>` once listening (or `NO_FREE_PORT <range>`, then it exits),
then `REFUSED <why>` per refused connection.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import socket
import sys
import threading

NONCE_BYTES = 32
LABEL = b"sparkml_dist rendezvous v1|"
HANDSHAKE_TIMEOUT_S = 10.0
_print_lock = threading.Lock()


def proof(secret: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, LABEL + nonce, hashlib.sha256).digest()


def serve_gateway(
    conn: socket.socket, peer: tuple, secret: bytes, target: tuple[str, int], _allowed: int
) -> None:
    """Challenge first; pipe to the store only after the right answer."""
    conn.settimeout(HANDSHAKE_TIMEOUT_S)
    nonce = os.urandom(NONCE_BYTES)
    conn.sendall(nonce)
    answer = recv_exactly(conn, NONCE_BYTES)
    if answer is None or not hmac.compare_digest(answer, proof(secret, nonce)):
        report(
            f"rendezvous gateway refused a connection from {peer[0]}:{peer[1]}: it did not prove the job's secret"
        )
        close(conn)
        return
    conn.settimeout(None)
    pipe(conn, socket.create_connection(target))


def serve_forwarder(
    conn: socket.socket, peer: tuple, secret: bytes, target: tuple[str, int], allowed: int
) -> None:
    """Only the rank's own process tree; then prove the secret to the gateway and pipe."""
    listen_port = conn.getsockname()[1]
    if not opened_by(allowed, peer[1], listen_port):
        report(
            f"rendezvous forwarder 127.0.0.1:{listen_port} refused a connection from port {peer[1]}: "
            f"not the rank's process or one it started"
        )
        close(conn)
        return
    upstream = socket.create_connection(target, timeout=HANDSHAKE_TIMEOUT_S)
    nonce = recv_exactly(upstream, NONCE_BYTES)
    if nonce is None:
        report(f"rendezvous gateway {target[0]}:{target[1]} closed during the handshake (a wrong secret?)")
        close(upstream)
        close(conn)
        return
    upstream.sendall(proof(secret, nonce))
    upstream.settimeout(None)
    pipe(conn, upstream)


def opened_by(root_pid: int, peer_port: int, listen_port: int) -> bool:
    """Is the loopback socket 127.0.0.1:peer_port -> :listen_port held by `root_pid` or a process it
    started? (torch may connect from an IPv6 socket to the v4-mapped address: /proc/net/tcp6.)"""
    inode = socket_inode(peer_port, listen_port)
    if inode is None:
        return False
    target = f"socket:[{inode}]"
    for pid in process_tree(root_pid):
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


def socket_inode(peer_port: int, listen_port: int) -> str | None:
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


def process_tree(root: int) -> list[int]:
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
    found, frontier = [root], [root]
    while frontier:
        frontier = [c for p in frontier for c in children.get(p, [])]
        found.extend(frontier)
    return found


def pipe(a: socket.socket, b: socket.socket) -> None:
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
            close(a)
            close(b)

    threading.Thread(target=copy, args=(b, a), daemon=True).start()
    copy(a, b)


def recv_exactly(conn: socket.socket, n: int) -> bytes | None:
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


def close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def report(line: str) -> None:
    with _print_lock:
        print(f"REFUSED {line}", flush=True)


def bind_in(listener: socket.socket, host: str, ports: str) -> bool:
    """A kernel-picked port ("0"), else the first free one of "FIRST-LAST" (launch.ports parsed
    and checked it); False when every port of the range is taken."""
    if ports == "0":
        listener.bind((host, 0))
        return True
    first, last = (int(p) for p in ports.split("-"))
    for port in range(first, last + 1):
        try:
            listener.bind((host, port))
            return True
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    return False


def main(argv: list[str]) -> None:
    mode, bind_host, target_host, target_port, allowed, ports = argv
    secret = bytes.fromhex(sys.stdin.readline().strip())
    serve = {"gateway": serve_gateway, "forward": serve_forwarder}[mode]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if not bind_in(listener, bind_host, ports):  # never closed and reopened
        print(f"NO_FREE_PORT {ports}", flush=True)
        return
    listener.listen(128)
    print(f"PORT {listener.getsockname()[1]}", flush=True)

    def accept_loop() -> None:
        while True:
            conn, peer = listener.accept()
            threading.Thread(target=handle, args=(conn, peer), daemon=True).start()

    def handle(conn: socket.socket, peer: tuple) -> None:
        try:
            serve(conn, peer, secret, (target_host, int(target_port)), int(allowed))
        except OSError:
            close(conn)

    threading.Thread(target=accept_loop, daemon=True).start()
    sys.stdin.read()  # until the launcher closes it, or dies
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
