"""Which ports the launch's listeners on the driver may bind: `spark.sparkml_dist.driver.ports`.

By default each listener binds a port the kernel picks, so executors must reach the driver on
any ephemeral port. A driver behind a firewall (an edge node whose open ports are listed, as
`spark.driver.port` and `spark.blockManager.port` are for Spark's own) sets a range instead:

    spark-submit --conf spark.sparkml_dist.driver.ports=40100-40119 ...
    spark.conf.set("spark.sparkml_dist.driver.ports", "40100-40119")   # or in a running session

Each launch holds up to three ports of it on the driver while it runs (its coordinator, the
output relay of `stream_output=True`, Horovod's rendezvous gateway); launches side by side each
take their own. The first free port of the range is taken, as Spark's `spark.port.maxRetries`
walks up from `spark.driver.port`.
"""

from __future__ import annotations

import errno
import re
import socket
from dataclasses import dataclass

from sparkml_dist.errors import ConfigError

DRIVER_PORTS_CONF = "spark.sparkml_dist.driver.ports"


@dataclass(frozen=True)
class PortRange:
    first: int
    last: int

    @classmethod
    def parse(cls, text: str | None) -> PortRange | None:
        """`A-B` or a single port `A`; None for unset or empty (kernel-picked ports)."""
        if text is None or not text.strip():
            return None
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
        first, last = (int(match.group(1)), int(match.group(2) or match.group(1))) if match else (0, -1)
        if not (match and 1024 <= first <= last <= 65535):
            raise ConfigError(
                f"{DRIVER_PORTS_CONF}={text!r}: give a port range like 40100-40119 "
                f"(unprivileged ports, 1024-65535, the first not above the last)"
            )
        return cls(first, last)

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"

    def bind(self, sock: socket.socket, host: str) -> None:
        """Bind `sock` to the first free port of the range on `host`."""
        for port in range(self.first, self.last + 1):
            try:
                sock.bind((host, port))
                return
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
        raise range_full(str(self), host)


def range_full(ports: str, host: str) -> ConfigError:
    """The error for a range whose every port is taken (here, or in the gateway's own process)."""
    return ConfigError(
        f"{DRIVER_PORTS_CONF}={ports}: every port in it is in use on {host}; widen the range "
        f"(a launch holds up to 3 of its ports while it runs) or stop what holds them"
    )


def bind_listener(sock: socket.socket, host: str, ports: PortRange | None) -> None:
    """A kernel-picked port (`ports` None), else the first free one of the range."""
    if ports is None:
        sock.bind((host, 0))
    else:
        ports.bind(sock, host)


def driver_ports(spark) -> PortRange | None:
    """The range the session's conf names, or None: `--conf` at submit, or
    `spark.conf.set(...)` in a running session (a notebook), read at each launch."""
    return PortRange.parse(spark.conf.get(DRIVER_PORTS_CONF, None))
