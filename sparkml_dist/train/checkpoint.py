"""Checkpoints: written by rank 0 only, atomically, last K kept, loaded with
torch.load(weights_only=True) so a checkpoint file cannot run code. The directory is a path or
URI (sparkml_dist.storage); sharded checkpoints (train/parallel/checkpoint.py) need a local or
mounted one."""

from __future__ import annotations

import io
import re
from typing import Any

import torch

from sparkml_dist import storage

_NAME = re.compile(r"^ckpt-e(\d+)-s(\d+)\.(pt|dcp)$")


def checkpoint_name(epoch: int, step: int, sharded: bool = False) -> str:
    """`.pt`: one file written by rank 0; `.dcp`: a directory of every rank's shards."""
    return f"ckpt-e{epoch:05d}-s{step:07d}.{'dcp' if sharded else 'pt'}"


def save_checkpoint(directory: str, state: dict[str, Any], epoch: int, step: int, keep: int) -> str:
    """Write `state` as the checkpoint for (epoch, step); prune to the newest `keep` (and the
    newest epoch start, see `prunable`)."""
    final = storage.join(str(directory), checkpoint_name(epoch, step))
    with storage.atomic_writer(final) as fh:
        torch.save(state, fh)
    for old in prunable([e for e in list_checkpoints(directory) if e.endswith(".pt")], keep):
        storage.delete(old)
    return final


def position_of(uri: str) -> tuple[int, int]:
    """(epoch, step) from a checkpoint's name."""
    m = _NAME.match(storage.name_of(uri))
    if m is None:
        raise ValueError(f"not a checkpoint name: {uri}")
    return int(m[1]), int(m[2])


def prunable(saved: list[str], keep: int) -> list[str]:
    """All but the newest `keep` checkpoints, sparing the newest one at an epoch start (step 0):
    ranks relaunched at another world size resume there, since a mid-epoch position means
    nothing in another cut of the data."""
    starts = [p for p in saved if position_of(p)[1] == 0]
    spared = set(saved[-keep:]) | set(starts[-1:])
    return [p for p in saved if p not in spared]


def list_checkpoints(directory: str) -> list[str]:
    """Complete checkpoints under `directory`, oldest first (partial writes never match the name)."""
    found = [
        ((int(m[1]), int(m[2])), e.uri)
        for e in storage.list_dir(str(directory))
        if (m := _NAME.match(e.name))
    ]
    return [uri for _, uri in sorted(found)]


def load_latest(directory: str, epoch_start: bool = False) -> dict[str, Any] | None:
    """The newest complete single-file checkpoint (with `epoch_start`: the newest at step 0), or None."""
    paths = [p for p in list_checkpoints(directory) if p.endswith(".pt")]
    if epoch_start:
        paths = [p for p in paths if position_of(p)[1] == 0]
    if not paths:
        return None
    return torch.load(io.BytesIO(storage.read_bytes(paths[-1])), map_location="cpu", weights_only=True)
