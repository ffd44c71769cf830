"""Model-parallel strategies inside the barrier stage: FSDP2 sharding, tensor parallelism
(DTensor), pipeline parallelism (torch.distributed.pipelining) and a 2-D hybrid of data x
tensor parallelism. All run on gloo (CPU) and nccl (GPU)."""

from __future__ import annotations

from sparkml_dist.train.strategies import Strategy


def make_model_parallel(strategy: str, world_size: int, rank: int, *, tensor_parallel: int = 2,
                        microbatches: int = 4, schedule: str = "1f1b", batch_size: int = 256) -> Strategy:
    from sparkml_dist.train.parallel.mesh import FullyShardedDataParallel, HybridParallel, TensorParallel
    from sparkml_dist.train.parallel.pipeline import PipelineParallel

    if strategy == "fsdp":
        return FullyShardedDataParallel(world_size, rank)
    if strategy == "tensor":
        return TensorParallel(world_size, rank)
    if strategy == "hybrid":
        return HybridParallel(world_size, rank, tensor_parallel)
    if strategy == "pipeline":
        return PipelineParallel(world_size, rank, microbatches, schedule, batch_size)
    raise ValueError(f"unknown train.strategy {strategy!r}; known: ddp, fsdp, tensor, hybrid, pipeline")
