"""Where the 2-rank scaling gap goes (docs/benchmarks.md, train_scaling_2_ranks): the same
compute-bound steps timed (a) on one rank alone, (b) on two ranks at once without gradient
sync (DDP's no_sync: CPU contention only), (c) on two ranks with DDP's allreduce; plus a
torch.profiler table of (c) on rank 0.

    .venv/bin/python -m bench.scaling_profile
"""

from __future__ import annotations

import json
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "scaling_profile.json"
STEPS, BATCH = 30, 1024


def _steps(model, optimizer, x, y, sync: bool) -> float:
    import contextlib

    import torch

    loss_fn = torch.nn.BCEWithLogitsLoss()
    times = []
    for _ in range(STEPS):
        t0 = time.perf_counter()
        context = contextlib.nullcontext() if sync or not hasattr(model, "no_sync") else model.no_sync()
        with context:
            loss_fn(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def profile_rank(ctx, mode: str) -> dict:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from bench.scaling import compute_bound
    from sparkml_dist.models.factory import build_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    spec = compute_bound()
    model = build_model(spec)
    if ctx.world_size > 1:
        model = DDP(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(BATCH, spec.input_dim), (torch.rand(BATCH) > 0.5).float()
    _steps(model, optimizer, x, y, sync=True)  # warm-up (DDP buckets, allocator)
    result = {"rank": ctx.rank, "step_s": _steps(model, optimizer, x, y, sync=mode == "ddp")}
    if mode == "ddp":  # both ranks step (the allreduces must match); rank 0 records the profile
        import contextlib

        from torch.profiler import ProfilerActivity, profile

        recorder = profile(activities=[ProfilerActivity.CPU]) if ctx.rank == 0 else contextlib.nullcontext()
        with recorder:
            _steps(model, optimizer, x, y, sync=True)
        if ctx.rank == 0:
            result["profile"] = recorder.key_averages().table(sort_by="self_cpu_time_total", row_limit=12)
    return result


def main(spark=None) -> dict:
    from bench.common import make_bench_importable
    from sparkml_dist.config import SparkConfig
    from sparkml_dist.launch import TorchBackend, run_barrier
    from sparkml_dist.spark import build_session

    make_bench_importable()
    spark = spark or build_session(SparkConfig(master="local[2]", app_name="bench-scaling-profile"))
    spark.sparkContext.setLogLevel("ERROR")
    one = run_barrier(spark, profile_rank, "alone", 1, TorchBackend())[0]["step_s"]
    no_sync = max(r["step_s"] for r in run_barrier(spark, profile_rank, "no_sync", 2, TorchBackend()))
    ddp = run_barrier(spark, profile_rank, "ddp", 2, TorchBackend())
    synced = max(r["step_s"] for r in ddp)
    report = {
        "one_rank_step_ms": 1000 * one,
        "two_ranks_no_sync_step_ms": 1000 * no_sync,
        "two_ranks_ddp_step_ms": 1000 * synced,
        "scaling": one / synced,
        "contention_factor": no_sync / one,
        "communication_factor": synced / no_sync,
    }
    print(json.dumps(report, indent=1))
    print(ddp[0]["profile"])
    OUT.write_text(json.dumps({**report, "profile_rank0": ddp[0]["profile"]}, indent=1))
    return report


if __name__ == "__main__":
    main()
