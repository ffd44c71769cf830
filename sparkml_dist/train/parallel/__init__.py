"""Model-parallel placements (Parallelism subclasses) inside the barrier stage: FSDP2 sharding, tensor parallelism
(DTensor), pipeline parallelism (torch.distributed.pipelining) and a 2-D hybrid of data x
tensor parallelism (`mesh`, `pipeline`), with sharded checkpoints that reshard on load
(`checkpoint`). All run on gloo (CPU) and nccl (GPU); `sparkml_dist.methods.model_parallel`
registers them as training methods."""
