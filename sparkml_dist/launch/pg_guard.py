"""Keep torch process groups alive until a rank's code has fully returned.

torch 2.13 stashes a Python object in thread-local state on every `backward()` (pytorch#173568),
and each gloo collective launched during it copies that state. A gloo worker thread that drops its
last reference to such a collective takes the Python GIL while holding the group's work mutex. If
the group's last reference goes at that moment from a DDP `Reducer` being freed (the user's
function returning after `destroy_process_group()`), the freeing thread holds the GIL and waits for
the mutex: a deadlock (measured here: one rank of a 2-rank DDP function hung in
`~ProcessGroupGloo` about one run in three under load). A Python `ProcessGroup` object releases the
GIL when it is freed (pytorch#154976), so the guard holds one for every group the code creates and
lets go of them only after the code and the backend's shutdown have returned.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class _KeepingDict(dict):
    """torch's registry of live groups, remembering every group ever registered in it."""

    def __init__(self, initial: dict):
        super().__init__(initial)
        self.kept: list = list(initial)

    def __setitem__(self, key, value) -> None:
        self.kept.append(key)
        super().__setitem__(key, value)


@contextmanager
def process_groups_outlive_the_call() -> Iterator[None]:
    try:
        from torch.distributed import distributed_c10d as c10d
    except ImportError:  # torch without distributed support: no groups to guard
        yield
        return
    original = c10d._pg_map
    keeping = _KeepingDict(original)
    c10d._pg_map = keeping
    try:
        yield
    finally:
        c10d._pg_map = original
        original.clear()
        original.update(keeping)  # groups still live after the call stay registered
        keeping.kept.clear()  # the last references: freed here with the GIL released
