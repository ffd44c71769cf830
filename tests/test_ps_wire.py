"""The parameter servers' wire: bound to the task's address, admits only holders of the launch's
secret (both ways), and reads tensors only into names, dtypes and shapes it holds: never a pickle."""

import socket
import time

import psutil
import pytest
import torch

from sparkml_dist.methods.async_ps.wire import (
    ServerConnection,
    ServerEndpoint,
    WireError,
    layout_of,
    send_frame,
)
from sparkml_dist.methods.async_ps.worker import ParameterServer

SECRET = b"p" * 32


@pytest.fixture
def endpoint():
    params = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.zeros(3)}
    server = ParameterServer(params, lr=0.1, weight_decay=0.0, max_staleness=4, policy="drop")
    ep = ServerEndpoint("127.0.0.1", SECRET, server, "parameter server (test)")
    try:
        yield ep, server
    finally:
        ep.close()


def eventually(check, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)
    return check()


def test_a_worker_with_the_secret_pulls_and_pushes(endpoint):
    ep, server = endpoint
    mine = [
        c
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == ep.address[1]
    ]
    assert [c.laddr.ip for c in mine] == ["127.0.0.1"], "the task's address only, not every interface"
    conn = ServerConnection.open(ep.address, SECRET, timeout_s=10)
    try:
        conn.send_pull()
        version, params = conn.recv_pull(server.layout())
        assert version == 0 and torch.equal(params["w"], torch.arange(6, dtype=torch.float32).reshape(2, 3))
        conn.send_push({"w": torch.ones(2, 3), "b": torch.ones(3)}, seen=0)
        assert conn.recv_push() is True and server.version == 1
        assert not torch.equal(server.params["w"].detach(), params["w"]), "the push was applied"
    finally:
        conn.close()
    assert ep.refused == 0


def test_connections_without_the_secret_are_refused_and_logged(endpoint, caplog):
    ep, server = endpoint
    with socket.create_connection(ep.address, timeout=10) as raw:
        assert len(raw.recv(64)) == 32, "a challenge first"
        raw.sendall(b"\0" * 64)  # a nonce and a wrong proof
        assert raw.recv(64) == b"", "closed without serving"
    with pytest.raises(WireError, match="could not join the parameter server"):
        ServerConnection.open(ep.address, b"w" * 32, timeout_s=10)  # another launch's secret
    assert eventually(lambda: ep.refused == 2)
    assert (
        "refused a connection from 127.0.0.1" in caplog.text
        and "did not prove the job's secret" in caplog.text
    )
    assert server.version == 0


def test_a_worker_refuses_a_server_that_cannot_prove_the_secret():
    impostor = socket.create_server(("127.0.0.1", 0))
    try:

        def serve():
            conn, _ = impostor.accept()
            conn.sendall(b"n" * 32)
            conn.recv(64)
            conn.sendall(b"x" * 32)  # not the server's proof
            time.sleep(1)
            conn.close()

        import threading

        threading.Thread(target=serve, daemon=True).start()
        with pytest.raises(WireError, match="did not prove the job's secret"):
            ServerConnection.open(impostor.getsockname(), SECRET, timeout_s=10)
    finally:
        impostor.close()


def test_a_tensor_the_server_does_not_hold_closes_the_connection_unread(endpoint, caplog):
    ep, server = endpoint
    conn = ServerConnection.open(ep.address, SECRET, timeout_s=10)
    try:
        with pytest.raises(OSError):  # the server closes as soon as it reads the header: a broken pipe or EOF
            send_frame(
                conn.sock, {"op": "push", "seen": 0}, {"w": torch.ones(3, 2), "b": torch.ones(3)}
            )  # wrong shape
            conn.recv_push()
    finally:
        conn.close()
    assert server.version == 0 and eventually(lambda: "does not hold as such" in caplog.text)


def test_layouts_name_dtype_and_shape():
    assert layout_of({"x": torch.zeros(2, 1, dtype=torch.float64)}) == {"x": (torch.float64, (2, 1))}
