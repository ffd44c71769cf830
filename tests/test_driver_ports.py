"""`spark.sparkml_dist.driver.ports` (launch.ports): the launch's listeners on the driver take
ports of the given range, for a driver behind a firewall; a bad range or a full one is an error
that names the conf key."""

from __future__ import annotations

import os
import random
import socket
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from sparkml_dist.errors import ConfigError
from sparkml_dist.launch import TorchBackend, run_barrier
from sparkml_dist.launch.coordinator import LaunchCoordinator, all_gather
from sparkml_dist.launch.gateway import StoreGateway
from sparkml_dist.launch.ports import DRIVER_PORTS_CONF, PortRange
from sparkml_dist.launch.relay import OutputRelay


def free_block(size: int) -> PortRange:
    """`size` consecutive ports that are free on 127.0.0.1 now, below the kernel's ephemeral range."""
    for _ in range(200):
        first = random.randrange(20000, 30000)
        probes = []
        try:
            for port in range(first, first + size):
                probe = socket.socket()
                probes.append(probe)
                probe.bind(("127.0.0.1", port))
            return PortRange(first, first + size - 1)
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise AssertionError("no free block of ports")


def listening_ports(pid: int) -> set[int]:
    return {
        c.laddr.port
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    }


@pytest.mark.parametrize("text", ["80-90", "40100-40000", "40100-70000", "forty", "40100:40119", "-5"])
def test_a_range_that_is_not_one_is_refused_naming_the_conf_key(text):
    with pytest.raises(ConfigError, match=DRIVER_PORTS_CONF):
        PortRange.parse(text)


def test_a_range_or_a_single_port_is_read_and_unset_means_kernel_picked():
    assert PortRange.parse("40100-40119") == PortRange(40100, 40119)
    assert PortRange.parse(" 40100 ") == PortRange(40100, 40100)
    assert PortRange.parse(None) is None and PortRange.parse("") is None


def test_the_driver_listeners_take_free_ports_of_the_range_and_say_when_it_is_full():
    ports = free_block(3)
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", ports.first))  # something else holds the range's first port
    started = []
    try:
        coordinator = LaunchCoordinator("127.0.0.1", 2, ports)
        started.append(coordinator)
        relay = OutputRelay("127.0.0.1", ports=ports)
        started.append(relay)
        taken = {coordinator.address.port, relay.address.port}
        assert taken == {ports.first + 1, ports.first + 2}, (
            "the first free ports of the range, the held one skipped"
        )
        with pytest.raises(ConfigError, match=f"{DRIVER_PORTS_CONF}={ports}: every port in it is in use"):
            LaunchCoordinator("127.0.0.1", 2, ports)
        with pytest.raises(ConfigError, match=f"{DRIVER_PORTS_CONF}={ports}: every port in it is in use"):
            StoreGateway("127.0.0.1", 9, os.urandom(32), ports)
        with ThreadPoolExecutor(2) as pool:  # the ranks reach the coordinator on its port of the range
            answers = [
                f.result(timeout=10)
                for f in [pool.submit(all_gather, coordinator.address, "start", r, str(r)) for r in range(2)]
            ]
        assert answers == [["0", "1"]] * 2
    finally:
        for listener in started:
            listener.stop()
        squatter.close()


def test_a_driver_side_gateway_takes_a_port_of_the_range():
    """What a backend that hosts its rendezvous on the driver (`driver_start`) puts before it."""
    ports = free_block(2)
    gateway = StoreGateway("127.0.0.1", 9, os.urandom(32), ports)
    try:
        assert gateway.port == ports.first
        mine = [
            c
            for c in psutil.Process(gateway.process.pid).net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN
        ]
        assert [(c.laddr.ip, c.laddr.port) for c in mine] == [("127.0.0.1", ports.first)]
    finally:
        gateway.close()


def driver_listeners(ctx, driver_pid: int) -> list[int]:
    return sorted(listening_ports(driver_pid)) if ctx.rank == 0 else []


def test_a_launch_in_a_session_with_the_conf_listens_on_the_driver_only_within_the_range(spark):
    ports = free_block(4)
    before = listening_ports(os.getpid())
    spark.conf.set(DRIVER_PORTS_CONF, str(ports))
    try:
        during = run_barrier(
            spark, driver_listeners, os.getpid(), 2, TorchBackend(timeout_s=60), stream_output=True
        )[0]
    finally:
        spark.conf.unset(DRIVER_PORTS_CONF)
    opened = set(during) - before
    assert len(opened) == 2, f"the coordinator and the output relay: {opened}"
    assert all(ports.first <= p <= ports.last for p in opened), (opened, ports)
