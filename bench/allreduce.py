"""Allreduce throughput on 2 ranks: Horovod and our torch.distributed backend (both launched by
our barrier launcher, using the training strategies' allreduce) vs raw torch.distributed
all_reduce with gloo in two plain processes, 1/16/64 MiB float32.

    .venv/bin/python -m bench.allreduce
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from bench.common import Measured, alternate, entry, record, unused_port

CONFIG = str(Path(__file__).resolve().parents[1] / "conf" / "adult.yaml")

SIZES_MIB = (1, 16, 64)
ITERS = {1: 300, 16: 60, 64: 24}
WARMUP = 3
ROUNDS = 5
TORCH_NOTE = (
    "reported, no target: both sides call the same torch.distributed all_reduce over gloo; the row "
    "checks that running inside barrier tasks in Spark's Python workers costs communication "
    "nothing beyond this machine's noise, and measures nothing of ours"
)


def _time_allreduce(reduce_fn) -> dict[int, float]:
    """Mean seconds per allreduce for each size: a run's elapsed time over its calls (all ranks run
    the same sequence). Not the median call: on this machine a 1 MiB call takes either ~0.6 ms or
    ~3-4 ms (a scheduler tick when both ranks' threads meet on one core), in proportions that
    change between runs, so the median flips between the two modes while the mean is the rate a
    job sees."""
    out = {}
    for mib in SIZES_MIB:
        t = torch.ones(mib * (1 << 20) // 4, dtype=torch.float32)
        for _ in range(WARMUP):
            reduce_fn(t)
        t0 = time.perf_counter()
        for _ in range(ITERS[mib]):
            reduce_fn(t)
        out[mib] = (time.perf_counter() - t0) / ITERS[mib]
    return out


def _raw_gloo_rank(rank: int, port: int, queue) -> None:
    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    result = _time_allreduce(dist.all_reduce)
    dist.destroy_process_group()
    if rank == 0:
        queue.put(result)


def raw_gloo() -> dict[int, float]:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = unused_port()  # as torchrun users do: a port that is free now (loopback, this benchmark only)
    procs = [ctx.Process(target=_raw_gloo_rank, args=(r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    result = queue.get(timeout=600)
    for p in procs:
        p.join()
    return result


def strategy_rank(ctx, backend_name: str) -> dict[int, float]:
    from sparkml_dist.config import load_config
    from sparkml_dist.methods import get_method

    torch.set_num_threads(1)
    cfg = load_config(CONFIG, [f"train.backend={backend_name}"]).train  # ddp: DDP or Horovod by backend
    strategy = get_method("ddp").placement(cfg, ctx.world_size, ctx.rank)
    return _time_allreduce(strategy.allreduce_sum)


def ours(spark, backend_name: str) -> dict[int, float]:
    from sparkml_dist.launch import get_backend, run_barrier

    return run_barrier(spark, strategy_rank, backend_name, 2, get_backend(backend_name, timeout_s=300))[0]


def throughput(seconds: dict[int, float]) -> dict[int, float]:
    return {mib: mib / s for mib, s in seconds.items()}  # MiB/s of tensor reduced


def main(spark=None) -> list[dict]:
    from sparkml_dist.config import SparkConfig
    from sparkml_dist.spark import build_session

    spark = spark or build_session(SparkConfig(master="local[2]", app_name="bench-allreduce"))
    spark.sparkContext.setLogLevel("ERROR")
    rows = []
    for backend_name in ("torch", "horovod"):
        runs_ours, runs_base = [], []

        def run_ours():
            runs_ours.append(throughput(ours(spark, backend_name)))
            return 0.0

        def run_base():
            runs_base.append(throughput(raw_gloo()))
            return 0.0

        alternate(run_ours, run_base, rounds=ROUNDS)
        for mib in SIZES_MIB:
            o = Measured([r[mib] for r in runs_ours])
            b = Measured([r[mib] for r in runs_base])
            name = f"allreduce_{backend_name}_vs_gloo" + ("" if mib == 64 else f"_{mib}mib")
            if backend_name == "torch":  # the same dist.all_reduce on both sides: a check, not a result
                rows.append(entry(name, o, b, "MiB/s", "higher", None, note=TORCH_NOTE))
            else:
                rows.append(entry(name, o, b, "MiB/s", "higher", 0.9))
    record(rows)
    return rows


if __name__ == "__main__":
    main()
