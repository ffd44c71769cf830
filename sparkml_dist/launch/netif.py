"""Which network interface carries a given local address (for Gloo's interface settings)."""

from __future__ import annotations

import socket


def interface_for(address: str) -> str:
    """The local interface holding `address` ('lo' for loopback); raises if none does."""
    import psutil

    ip = socket.gethostbyname(address)
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addrs):
            return name
    raise RuntimeError(
        f"no local network interface has address {ip} ({address}); "
        f"set spark.driver.host / SPARK_LOCAL_IP to an address of this machine"
    )
