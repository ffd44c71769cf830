"""A user job as the ranks see it: the call, the attempt it belongs to, where it may checkpoint,
and the environment a rank sets before calling it (torchrun's, plus this project's).

Inside the user's code, `launch_info()` reads it back (scripts included, since it is all in
environment variables)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from sparkml_dist.distributor.objects import TrainCall
from sparkml_dist.launch.context import RankContext, env_scope
from sparkml_dist.storage import has_scheme

ATTEMPT = "SPARKML_DIST_ATTEMPT"
MAX_ATTEMPTS = "SPARKML_DIST_MAX_ATTEMPTS"
CHECKPOINT_DIR = "SPARKML_DIST_CHECKPOINT_DIR"
PARTITION_FILE = "SPARKML_DIST_PARTITION_FILE"
PARTITION_ROWS = "SPARKML_DIST_PARTITION_ROWS"


@dataclass(frozen=True)
class UserJob:
    call: TrainCall
    attempt: int
    max_attempts: int
    checkpoint_dir: str
    use_gpu: bool = True

    def env(self) -> dict[str, str]:
        return {
            ATTEMPT: str(self.attempt),
            MAX_ATTEMPTS: str(self.max_attempts),
            CHECKPOINT_DIR: self.checkpoint_dir,
        }


@dataclass(frozen=True)
class LaunchInfo:
    """What a rank of `TorchDistributor.run` knows about its launch."""

    rank: int
    world_size: int
    local_rank: int
    attempt: int  # 0 on the first launch; a relaunch after a failure counts up
    max_attempts: int
    checkpoint_dir: str  # save here to resume after a relaunch (shared storage on a multi-host cluster)

    @property
    def is_relaunch(self) -> bool:
        return self.attempt > 0


def launch_info() -> LaunchInfo:
    """Inside a function or script launched by `TorchDistributor`: this rank's launch."""
    env = os.environ
    if ATTEMPT not in env:
        raise RuntimeError(
            "launch_info() is only available inside a rank launched by sparkml_dist.TorchDistributor"
        )
    return LaunchInfo(
        int(env.get("RANK", 0)),
        int(env.get("WORLD_SIZE", 1)),
        int(env.get("LOCAL_RANK", 0)),
        int(env[ATTEMPT]),
        int(env[MAX_ATTEMPTS]),
        env[CHECKPOINT_DIR],
    )


def partition_env(ctx: RankContext) -> dict[str, str]:
    if ctx.partition is None:
        return {}
    return {PARTITION_FILE: ctx.partition.path, PARTITION_ROWS: json.dumps(list(ctx.partition.rows_per_rank))}


def gpu_env(ctx: RankContext, use_gpu: bool) -> dict[str, str]:
    """As pyspark's TorchDistributor: a rank sees only the GPU Spark assigned to its task, as cuda:0,
    and none when it was given none (use_gpu=False); each task is its own local world of one."""
    one_per_task = {
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
    }  # pyspark: torchrun --nproc_per_node=1 per task
    if not use_gpu or not ctx.gpus:
        return {"CUDA_VISIBLE_DEVICES": "", **one_per_task}
    return {"CUDA_VISIBLE_DEVICES": ",".join(ctx.gpus), **one_per_task}


def user_rank(ctx: RankContext, job: UserJob) -> Any:
    """The rank function of a distributor launch: the user's call in its environment; rank 0's
    return value goes back to the driver."""
    if job.checkpoint_dir and not has_scheme(job.checkpoint_dir):
        os.makedirs(job.checkpoint_dir, exist_ok=True)  # a path on this host's disk (or a shared mount)
    with env_scope({**job.env(), **partition_env(ctx), **gpu_env(ctx, job.use_gpu)}):
        result = job.call.call()
    return result if ctx.rank == 0 else None
