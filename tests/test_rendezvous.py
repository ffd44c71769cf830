"""The rendezvous store the launcher hosts: bound to one address, on a port nobody can take first."""

from datetime import timedelta

import psutil
import torch.distributed as dist

from sparkml_dist.launch.rendezvous import BoundStore


def test_the_store_listens_on_the_given_address_only_and_serves_clients():
    with BoundStore("127.0.0.1", world_size=2, timeout_s=10) as bound:
        mine = [c for c in psutil.Process().net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr.port == bound.port]
        assert [c.laddr.ip for c in mine] == ["127.0.0.1"], mine  # torch's own server would say 0.0.0.0 / ::
        client = dist.TCPStore("127.0.0.1", bound.port, 2, False, timedelta(seconds=10))
        client.set("rank1", "here")
        assert bound.store.get("rank1") == b"here"
