"""Where a scoring process runs its model (`score.device`)."""

from __future__ import annotations

import socket

import torch


def scoring_device(requested: str = "auto") -> torch.device:
    """`cpu`; else the GPU Spark assigned this task (spark.task.resource.gpu.amount); else GPU 0
    where torch sees one; `cuda` with no GPU is an error, `auto` falls back to the CPU."""
    if requested not in ("auto", "cpu", "cuda"):
        raise ValueError(f"score.device={requested!r}: use auto, cpu or cuda")
    if requested == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        assigned = task_gpus()
        index = int(assigned[0]) if assigned else 0
        if index >= torch.cuda.device_count():
            raise RuntimeError(
                f"score.device={requested}: Spark assigned GPU {index} but torch sees "
                f"{torch.cuda.device_count()} on {socket.gethostname()}; check the discovery script "
                f"and CUDA_VISIBLE_DEVICES"
            )
        return torch.device("cuda", index)
    if requested == "cuda":
        raise RuntimeError(
            f"score.device=cuda but torch sees no GPU on {socket.gethostname()} (torch "
            f"{torch.__version__}, CUDA {torch.version.cuda}); use score.device=auto or cpu"
        )
    return torch.device("cpu")


def task_gpus() -> tuple[str, ...]:
    """The GPU addresses Spark assigned the running task, () outside a Spark task."""
    try:
        from pyspark import TaskContext
    except ImportError:  # a serving process: no Spark
        return ()
    context = TaskContext.get()
    if context is None:
        return ()
    gpu = context.resources().get("gpu")
    return tuple(gpu.addresses) if gpu is not None else ()
