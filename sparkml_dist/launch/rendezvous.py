"""torch.distributed's rendezvous store, hosted by the launcher on rank 0's task address only.

torch's own TCPStore server (what `init_method="tcp://..."` or `env://` start on rank 0) listens
on every interface, and `free_port` followed by a later bind leaves a window in which another
process can take the port. Here rank 0 binds a socket to its task's address with a port the
kernel picks, listens, and hands that socket to the TCPStore server (`master_listen_fd`). Every
rank, rank 0 included, then joins as a client the way torchrun's ranks join its agent's store
(`TORCHELASTIC_USE_AGENT_STORE`), so `init_process_group()` with its defaults works unchanged."""

from __future__ import annotations

import socket
from datetime import timedelta

# torch's env:// rendezvous joins an existing store (no server of its own) when this is set
AGENT_STORE_ENV = {"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0"}


class BoundStore:
    """A TCPStore server listening on `host` only; keep it open while the ranks run."""

    def __init__(self, host: str, world_size: int, timeout_s: float = 300.0) -> None:
        import torch.distributed as dist

        listener = bound_listener(host, max(128, 4 * world_size))
        try:
            self.host, self.port = host, listener.getsockname()[1]
            self.store: dist.TCPStore | None = dist.TCPStore(
                host,
                self.port,
                world_size,
                True,
                timedelta(seconds=timeout_s),
                wait_for_workers=False,
                master_listen_fd=listener.fileno(),
                use_libuv=True,
            )
        except BaseException:
            listener.close()
            raise
        listener.detach()  # the store's server owns the descriptor now and closes it itself

    def close(self) -> None:
        self.store = None  # the server stops when its last reference goes

    def __enter__(self) -> BoundStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def bound_listener(host: str, backlog: int = 128) -> socket.socket:
    """A socket bound to `host` on a kernel-picked port and already listening: no free-port race."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock
