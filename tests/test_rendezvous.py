"""The rendezvous store the launcher hosts: bound to one address, on a port nobody can take first, and
reached from other hosts only through a gateway that admits holders of the launch's secret."""

import socket
import subprocess
import sys
import time
from datetime import timedelta

import psutil
import pytest
import torch.distributed as dist

from sparkml_dist.launch.gateway import LocalForwarder, StoreGateway
from sparkml_dist.launch.rendezvous import BoundStore


def _listeners(port: int) -> list:
    """This process's TCP listeners on `port`."""
    return [
        c
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    ]


def test_the_store_listens_on_the_given_address_only_and_serves_clients():
    with BoundStore("127.0.0.1", world_size=2, timeout_s=10) as bound:
        mine = _listeners(bound.port)
        assert [c.laddr.ip for c in mine] == ["127.0.0.1"], mine  # torch's own server would say 0.0.0.0 / ::
        client = dist.TCPStore("127.0.0.1", bound.port, 2, False, timedelta(seconds=10))
        client.set("rank1", "here")
        assert bound.store.get("rank1") == b"here"


SECRET = b"s" * 32


def eventually(check, timeout_s: float = 10.0) -> bool:
    """The relays count refusals as their helper process reports them."""
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)
    return check()


@pytest.fixture
def gateway():
    with BoundStore("127.0.0.1", world_size=2, timeout_s=10) as bound:
        gate = StoreGateway("127.0.0.1", bound.port, SECRET)
        try:
            yield bound, gate
        finally:
            gate.close()


def test_a_client_with_the_launch_secret_reaches_the_store_through_the_gateway(gateway):
    bound, gate = gateway
    forwarder = LocalForwarder("127.0.0.1", gate.port, SECRET)
    try:
        client = dist.TCPStore("127.0.0.1", forwarder.port, 2, False, timedelta(seconds=10))
        client.set("rank1", "here")
        assert bound.store.get("rank1") == b"here" and client.get("rank1") == b"here"
    finally:
        forwarder.close()
    assert gate.refused == 0 and forwarder.refused == 0


def test_a_connection_without_the_secret_is_refused_and_logged(gateway, caplog):
    _, gate = gateway
    with socket.create_connection(("127.0.0.1", gate.port), timeout=10) as raw:
        nonce = raw.recv(64)
        assert len(nonce) == 32, "the gateway challenges first"
        raw.sendall(b"\0" * 32)  # not the proof
        assert raw.recv(64) == b"", "closed without a byte of the store"
    wrong = LocalForwarder("127.0.0.1", gate.port, b"w" * 32)  # another launch's secret
    try:
        with pytest.raises(Exception, match="(?i)recv|closed|connect|timed out"):
            dist.TCPStore("127.0.0.1", wrong.port, 2, False, timedelta(seconds=5))
    finally:
        wrong.close()
    assert eventually(lambda: gate.refused >= 2), "the raw probe and every retry of the wrong secret"
    assert (
        "refused a connection from 127.0.0.1" in caplog.text
        and "did not prove the job's secret" in caplog.text
    )


def test_the_forwarder_admits_only_its_own_process(gateway, tmp_path):
    """Another local process cannot borrow a rank's proof through its loopback forwarder (the
    rank's own children, e.g. a training script, can)."""
    bound, gate = gateway
    forwarder = LocalForwarder("127.0.0.1", gate.port, SECRET)
    probe = (
        "import socket, sys; s = socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=10); "
        "print(len(s.recv(64)))"
    )
    try:
        script = (
            "import sys; from datetime import timedelta; import torch.distributed as dist; "
            "dist.TCPStore('127.0.0.1', int(sys.argv[1]), 2, False, timedelta(seconds=10)).set('child', 'in')"
        )
        child = subprocess.run(
            [sys.executable, "-c", script, str(forwarder.port)], capture_output=True, text=True, timeout=120
        )
        assert child.returncode == 0, child.stderr[-2000:]
        assert bound.store.get("child") == b"in", (
            "a child of the rank's process (a training script) is admitted"
        )
        stranger = tmp_path / "stranger.out"  # its parent exits first: no longer this process's descendant
        subprocess.run(
            [
                "bash",
                "-c",
                f'( sleep 1; "{sys.executable}" -c "$0" {forwarder.port} > {stranger} ) & exit',
                probe,
            ],
            timeout=30,
        )
        deadline = time.monotonic() + 30
        while not (stranger.exists() and stranger.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert stranger.read_text().strip() == "0", "closed at once"
        assert eventually(lambda: forwarder.refused == 1) and gate.refused == 0
    finally:
        forwarder.close()


def test_horovods_rendezvous_server_is_reached_only_through_the_gateway():
    """Rank 0's Horovod rendezvous HTTP server listens on loopback; the ranks' one way in is the
    gateway the launcher puts before it (as before torch's store), which refuses an HTTP request
    that does not first prove the launch's secret."""
    from sparkml_dist.launch.horovod_backend import HorovodBackend

    server = HorovodBackend().rendezvous_server(2)
    gate = StoreGateway("127.0.0.1", server.port, SECRET)
    try:
        assert [c.laddr.ip for c in _listeners(server.port)] == ["127.0.0.1"]
        with socket.create_connection(("127.0.0.1", gate.port), timeout=10) as raw:
            raw.sendall(b"GET /rank/0 HTTP/1.1\r\nHost: x\r\n\r\n")  # Horovod's client, without the proof
            assert len(raw.recv(64)) == 32, "a challenge, not an HTTP response"
            assert raw.recv(4096) == b"", "closed without a byte of the rendezvous server"
        assert eventually(lambda: gate.refused == 1)
        forwarder = LocalForwarder("127.0.0.1", gate.port, SECRET)
        try:
            with socket.create_connection(("127.0.0.1", forwarder.port), timeout=10) as ok:
                ok.sendall(b"PUT /scope/key HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nvalue")
                assert ok.recv(4096).startswith(b"HTTP/1."), "the proven path reaches the server"
        finally:
            forwarder.close()
    finally:
        gate.close()
        server.close()
