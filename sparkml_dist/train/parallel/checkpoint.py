"""Sharded checkpoints with torch.distributed.checkpoint (DCP).

Every rank writes its own shards into one directory; keys are the plain model's names and
the optimizer state is flattened per parameter name, so a checkpoint written at one world size
or parallel layout loads into another (DCP reshards on load). Like the single-file
checkpoints, a checkpoint only becomes visible complete: ranks write into a hidden
`.ckpt-...tmp` directory and rank 0 renames it after the last rank is done.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.planner import LoadPlan
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from sparkml_dist import storage
from sparkml_dist.errors import StorageError
from sparkml_dist.train.checkpoint import checkpoint_name, list_checkpoints, position_of, prunable
from sparkml_dist.train.parallel.signing import sign, verify

META = "meta.pt"


def _local_dir(directory: str | Path) -> Path:
    """DCP writes every rank's shards as files: the directory must be on a local or mounted file
    system (the same mount on every host)."""
    path = storage.local_path(str(directory))
    if path is None:
        raise StorageError(
            f"{directory}: sharded checkpoints (fsdp, tensor, pipeline, hybrid) are written with "
            f"torch.distributed.checkpoint to a local or mounted path; set output.root to one "
            f"(e.g. a shared mount such as /dbfs/... or an NFS path)"
        )
    return path


_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def save_sharded(
    directory: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    meta: dict[str, Any],
    epoch: int,
    step: int,
    keep: int,
    rank: int,
    key: bytes,
) -> Path:
    """Collective: every rank calls it. Returns the checkpoint directory, signed with `key`."""
    directory = _local_dir(directory)
    final = directory / checkpoint_name(epoch, step, sharded=True)
    staging = directory / f".{final.name}.tmp"
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    dist.barrier()
    model_state, optim_state = get_state_dict(model, optimizer, options=_OPTIONS)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(staging))
    dist.barrier()  # every rank's shards are on disk
    if rank == 0:
        with storage.atomic_writer(str(staging / META)) as fh:
            torch.save(meta, fh)
        sign(staging, key)
        shutil.rmtree(final, ignore_errors=True)  # a re-run of the same step: the older copy goes
        os.replace(staging, final)
        for old in prunable(list_checkpoints(str(directory)), keep):
            storage.delete(old)
    dist.barrier()
    return final


class _SkipEmptyShards(DefaultLoadPlanner):
    """A rank whose shard of a small parameter is empty (FSDP2 splits a [1] bias over 4 ranks
    as 1,0,0,0) reads nothing for it; the default plan asks it to read one element into zero
    and DCP refuses (pytorch#153283)."""

    def create_local_plan(self) -> LoadPlan:
        plan = super().create_local_plan()
        return dataclasses.replace(plan, items=[item for item in plan.items if not self._is_empty(item)])

    def _is_empty(self, item) -> bool:
        target = self.state_dict.get(item.dest_index.fqn)
        if not torch.is_tensor(target):
            return False
        local = target.to_local() if hasattr(target, "to_local") else target
        return local.numel() == 0


def load_sharded(
    directory: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    key: bytes,
    data_world: int | None = None,
) -> dict[str, Any] | None:
    """Load the newest sharded checkpoint into the (already parallelised) model and optimizer,
    resharding to this run's layout; returns its meta, or None when there is none. A mid-epoch
    checkpoint cut for another number of data shards than `data_world` is passed over for the
    newest epoch start (an elastic relaunch at another world size). Its signature is verified
    with `key` before anything in it is read (train.parallel.signing)."""
    found = [p for p in list_checkpoints(str(directory)) if p.endswith(".dcp")]
    if found and data_world is not None and position_of(found[-1])[1] > 0:
        verify(_local_dir(found[-1]), key)
        meta = torch.load(_local_dir(found[-1]) / META, map_location="cpu", weights_only=True)
        if meta.get("data_world", data_world) != data_world:
            found = [p for p in found if position_of(p)[1] == 0]
    if not found:
        return None
    latest = _local_dir(found[-1])
    verify(latest, key)
    model_state, optim_state = get_state_dict(model, optimizer, options=_OPTIONS)
    dcp.load(
        {"model": model_state, "optim": optim_state}, checkpoint_id=str(latest), planner=_SkipEmptyShards()
    )
    # dcp.load filled both dicts in place
    set_state_dict(
        model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state, options=_OPTIONS
    )
    return torch.load(latest / META, map_location="cpu", weights_only=True)
