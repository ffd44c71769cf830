"""The driver's listener for one launch's ranks (the output relay and the launch coordinator).

Bound to one address, on a port the kernel picks or the first free one of
`spark.sparkml_dist.driver.ports` (launch.ports); a connection is admitted only when its first
line is the launch's random token (which travels to the ranks inside the task closure). A
connection without it is refused, counted and logged, and nothing more is read from it. The
serving loop polls every 50 ms, so stopping the listener at the end of a launch costs 50 ms, not
socketserver's 0.5 s.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import socketserver
import threading
from collections.abc import Callable

from sparkml_dist.launch.ports import PortRange, bind_listener

log = logging.getLogger(__name__)
TOKEN_BYTES = 16

Serve = Callable[[socketserver.StreamRequestHandler], None]


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        server: _Server = self.server  # type: ignore[assignment]
        first = self.rfile.readline(256).decode(errors="replace").strip()
        if not hmac.compare_digest(first, server.token):
            log.warning(
                "the %s refused a connection from %s:%d without this launch's token",
                server.what,
                *self.client_address[:2],
            )
            server.refused += 1  # after the log line: a caller that waits on the count then sees the line
            return  # not this launch's rank: say nothing, read nothing more
        server.serve(self)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = False

    def __init__(self, host: str, token: str, what: str, serve: Serve, ports: PortRange | None):
        super().__init__((host, 0), _Handler, bind_and_activate=False)
        try:
            bind_listener(self.socket, host, ports)
            self.server_address = self.socket.getsockname()
            self.server_activate()
        except BaseException:
            self.server_close()
            raise
        self.token = token
        self.what = what
        self.serve = serve
        self.refused = 0


class TokenListener:
    """Listens on `host` for connections that present its token; `serve(handler)` gets each
    admitted one, its token line already read. `what` names it in the log and its thread."""

    def __init__(self, host: str, what: str, serve: Serve, ports: PortRange | None = None):
        self._server = _Server(host, secrets.token_hex(TOKEN_BYTES), what, serve, ports)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"sparkml_dist-{what.replace(' ', '-')}",
            daemon=True,
        )
        self._thread.start()

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def token(self) -> str:
        return self._server.token

    @property
    def refused(self) -> int:
        """Connections turned away for want of the token."""
        return self._server.refused

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
