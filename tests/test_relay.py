"""The driver's output relay (launch.relay, `stream_output`): a rank's lines reach the driver in
order, under the rank's number; a connection without the launch's token is refused, counted and
logged, and none of its lines are shown; the listener is on the given address only."""

from __future__ import annotations

import socket
import time
from dataclasses import replace

import psutil
import pytest

from sparkml_dist.launch.relay import OutputRelay, RelaySink


@pytest.fixture
def relay():
    lines: list[tuple[str, str]] = []
    running = OutputRelay("127.0.0.1", emit=lambda rank, line: lines.append((rank, line)))
    running.lines = lines
    yield running
    running.stop()


def _wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_ranks_lines_arrive_in_order_under_its_rank(relay):
    sinks = {rank: RelaySink(relay.address, rank) for rank in (0, 1)}
    for i in range(50):
        for rank, sink in sinks.items():
            sink(f"step {i} of rank {rank}")
    for sink in sinks.values():
        sink.close()
    _wait_for(lambda: len(relay.lines) == 100)
    for rank in ("0", "1"):
        assert [line for r, line in relay.lines if r == rank] == [
            f"step {i} of rank {rank}" for i in range(50)
        ]


def test_a_connection_without_the_launch_token_is_refused_and_shows_nothing(relay, caplog):
    stranger = RelaySink(replace(relay.address, token="0" * 32), 0)
    stranger("a forged line")
    stranger.close()
    _wait_for(lambda: relay.refused == 1)
    assert "output relay refused a connection from 127.0.0.1" in caplog.text
    with socket.create_connection((relay.address.host, relay.address.port)) as raw:  # no token line at all
        raw.sendall(b"0\tanother forged line\n")
    _wait_for(lambda: relay.refused == 2)
    mine = RelaySink(relay.address, 3)
    mine("a real line")
    mine.close()
    _wait_for(lambda: relay.lines)
    assert relay.lines == [("3", "a real line")], "no forged line was shown"


def test_it_listens_on_the_given_address_only(relay):
    mine = [
        c
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == relay.address.port
    ]
    assert [c.laddr.ip for c in mine] == ["127.0.0.1"], mine
