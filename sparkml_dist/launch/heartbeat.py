"""Per-rank progress marks in torch.distributed's store, so that a rank whose collective timed
out can name the rank(s) that stopped making progress."""

from __future__ import annotations

from datetime import timedelta

_KEY = "sparkml_dist/heartbeat/{}"


class Heartbeat:
    def __init__(self, rank: int, world_size: int):
        self.rank = rank
        self.world_size = world_size
        # one rank has no peer to name: no mark per step (a store write, ~10 us: a tenth of a graphed GPU step)
        self._store = _default_store() if world_size > 1 else None

    def beat(self, epoch: int, step: int) -> None:
        if self._store is not None:
            self._store.set(_KEY.format(self.rank), f"{epoch}:{step}")

    def describe_missing(self) -> str:
        """'rank(s) [k] stopped at epoch e batch s (this rank reached ...)', or '' when unknown."""
        if self._store is None:
            return ""
        marks: dict[int, tuple[int, int]] = {}
        try:
            self._store.set_timeout(timedelta(seconds=2))
            for r in range(self.world_size):
                try:
                    epoch, step = self._store.get(_KEY.format(r)).decode().split(":")
                    marks[r] = (int(epoch), int(step))
                except Exception:
                    marks[r] = (-1, -1)
        except Exception:
            return "the rendezvous store is unreachable: rank 0 is probably the one lost"
        lead = max(marks.values())
        behind = sorted(r for r, m in marks.items() if m < lead)
        if not behind:
            return ""
        where = ", ".join(f"rank {r} at epoch {marks[r][0] + 1} batch {marks[r][1]}" for r in behind)
        return (
            f"missing rank(s) {behind}: last allreduce joined: {where}; the others are waiting in "
            f"epoch {lead[0] + 1} batch {lead[1]}"
        )


def _default_store():
    import torch.distributed as dist

    if not dist.is_initialized():
        return None
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:
        return None
