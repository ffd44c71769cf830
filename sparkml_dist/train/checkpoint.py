"""Checkpoints: written by rank 0 only, atomically (temp file + rename), last K kept, loaded
with torch.load(weights_only=True) so a checkpoint file cannot run code."""

from __future__ import annotations

import io
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import torch

_NAME = re.compile(r"^ckpt-e(\d+)-s(\d+)\.(pt|dcp)$")


def checkpoint_name(epoch: int, step: int, sharded: bool = False) -> str:
    """`.pt`: one file written by rank 0; `.dcp`: a directory of every rank's shards."""
    return f"ckpt-e{epoch:05d}-s{step:07d}.{'dcp' if sharded else 'pt'}"


def save_checkpoint(directory: str | Path, state: dict[str, Any], epoch: int, step: int, keep: int) -> Path:
    """Write `state` as the checkpoint for (epoch, step); prune to the newest `keep`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / checkpoint_name(epoch, step)
    atomic_torch_save(state, final)
    for old in [p for p in list_checkpoints(directory) if p.suffix == ".pt"][:-keep]:
        old.unlink(missing_ok=True)
    return final


def atomic_torch_save(obj: Any, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def list_checkpoints(directory: str | Path) -> list[Path]:
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [((int(m[1]), int(m[2])), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def load_latest(directory: str | Path) -> dict[str, Any] | None:
    """The newest complete checkpoint, or None. Partial files never match the name pattern."""
    paths = [p for p in list_checkpoints(directory) if p.suffix == ".pt"]
    if not paths:
        return None
    return torch.load(paths[-1], map_location="cpu", weights_only=True)


def state_dict_to_bytes(state: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def state_dict_from_bytes(blob: bytes) -> dict[str, Any]:
    return torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
