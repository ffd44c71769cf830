"""Authenticated access to the rendezvous store.

torch's TCPStore has no authentication: whoever reaches its port can read and write the keys
the ranks rendezvous with. Here the store server listens on loopback only. The one port other
hosts can reach is a gateway that first challenges each connection: it sends 32 random bytes,
and only a peer that returns their HMAC-SHA256 under the launch's secret is piped through to
the store. The secret is fresh random bytes per launch, handed to this stage's tasks only.
Everything else is refused and logged.

Each rank's own TCPStore clients reach the gateway through a forwarder on loopback. It pipes
only connections held by the rank's process or by a process it started (a training script the
distributor runs). It looks up the connecting socket's inode in /proc/net/tcp and finds it
among those processes' /proc/<pid>/fd. So another local process cannot borrow the rank's
proof. Linux only, like the rest of the launcher.

Both run in a process of their own (`gateway_process.py`, standard library only), because C++
code in a rank can block on store traffic while holding the GIL.
"""

from __future__ import annotations

import logging
import os
import pkgutil
import subprocess
import sys
import threading

from sparkml_dist.launch.ports import PortRange, range_full

log = logging.getLogger(__name__)

# its source, run with `python -I -c`: read through the package loader, so that a package
# shipped to the executors as a zip (--py-files) works as well as an installed one
_SOURCE_BYTES = pkgutil.get_data("sparkml_dist.launch", "gateway_process.py")
if _SOURCE_BYTES is None:  # a loader that cannot read package data: say so here, not as a silent relay
    raise ImportError("sparkml_dist.launch: gateway_process.py cannot be read from the installed package")
_SOURCE = _SOURCE_BYTES.decode()
START_TIMEOUT_S = 30.0


class _Relay:
    """The helper process: started listening, its refusals counted and logged here, stopped by PID."""

    def __init__(
        self,
        mode: str,
        bind_host: str,
        target_host: str,
        target_port: int,
        secret: bytes,
        ports: PortRange | None = None,
    ):
        self.refused = 0
        self.bind_host = bind_host
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-I",
                "-c",
                _SOURCE,
                mode,
                bind_host,
                target_host,
                str(target_port),
                str(os.getpid()),
                str(ports or "0"),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        # both pipes exist: asked for above (the asserts tell the type checker)
        assert self.process.stdin is not None and self.process.stdout is not None
        self._to_helper, self._from_helper = self.process.stdin, self.process.stdout
        try:
            self._to_helper.write(secret.hex() + "\n")  # never on the command line or in the environment
            self._to_helper.flush()
            self.port = self._read_port()
        except BaseException:
            self.close()
            raise
        threading.Thread(target=self._watch, name=f"sparkml_dist-{mode}-log", daemon=True).start()

    def _read_port(self) -> int:
        found: list[str] = []
        reader = threading.Thread(target=lambda: found.append(self._from_helper.readline()), daemon=True)
        reader.start()
        reader.join(START_TIMEOUT_S)
        line = found[0] if found else ""
        if line.startswith("NO_FREE_PORT "):
            raise range_full(line.split()[1], self.bind_host)
        if not line.startswith("PORT "):
            raise RuntimeError(
                f"the rendezvous relay did not start (exit code {self.process.poll()}): {line!r}"
            )
        return int(line.split()[1])

    def _watch(self) -> None:
        for line in self._from_helper:
            if line.startswith("REFUSED "):
                log.warning("%s", line[len("REFUSED ") :].strip())
                self.refused += 1  # after the log line: whoever waits on the count sees the line

    def close(self) -> None:
        try:
            self._to_helper.close()  # the helper exits when its stdin ends
        except OSError:
            pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._from_helper.close()


class StoreGateway(_Relay):
    """On rank 0's task address: challenge, then pipe to the loopback store at `store_port`."""

    def __init__(self, host: str, store_port: int, secret: bytes, ports: PortRange | None = None):
        super().__init__("gateway", host, "127.0.0.1", store_port, secret, ports)


class LocalForwarder(_Relay):
    """On loopback, for this process and the processes it starts: carries each connection to the
    gateway with the launch's proof."""

    def __init__(self, gateway_host: str, gateway_port: int, secret: bytes):
        super().__init__("forward", "127.0.0.1", gateway_host, gateway_port, secret)
