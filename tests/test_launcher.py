"""Barrier launcher: real ranks in a Spark barrier stage, real torch.distributed collectives."""

import os

import pytest

from sparkml_dist.errors import RankFailure, SlotError
from sparkml_dist.launch import TorchBackend, run_barrier

pytestmark = pytest.mark.spark


def allreduce_rank(ctx, payload):
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t)
    return {"rank": ctx.rank, "sum": t.item(), "world": dist.get_world_size(), "env_rank": os.environ["RANK"]}


def failing_rank(ctx, payload):
    import torch
    import torch.distributed as dist

    print(f"rank {ctx.rank} is loading shard {payload}")
    if ctx.rank == 1:
        raise ValueError("shard 7 has a corrupt row group")
    dist.all_reduce(torch.ones(1))  # rank 0 waits here for rank 1, which is gone
    return ctx.rank


def worker_env(_):
    yield {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}


def test_two_ranks_allreduce_and_results_come_back_in_rank_order(spark):
    results = run_barrier(spark, allreduce_rank, None, 2, TorchBackend(timeout_s=60))
    assert [r["rank"] for r in results] == [0, 1]
    assert [r["sum"] for r in results] == [3.0, 3.0]
    assert [r["env_rank"] for r in results] == ["0", "1"]


def test_rank_environment_is_restored_in_reused_python_workers(spark):
    run_barrier(spark, allreduce_rank, None, 2, TorchBackend(timeout_s=60))
    envs = spark.sparkContext.parallelize(range(2), 2).mapPartitions(worker_env).collect()
    assert envs == [{"MASTER_ADDR": None, "MASTER_PORT": None, "RANK": None, "WORLD_SIZE": None}] * 2


def test_a_raising_rank_is_reported_by_rank_with_its_output(spark):
    with pytest.raises(RankFailure) as err:
        run_barrier(spark, failing_rank, 7, 2, TorchBackend(timeout_s=60))
    failure = err.value
    assert failure.ranks == [1]
    text = str(failure)
    assert "rank 1" in text and "ValueError: shard 7 has a corrupt row group" in text
    assert "rank 1 is loading shard 7" in text, "the tail of the rank's output comes back"
    # the error pickles (it may cross process boundaries, e.g. from a notebook job)
    import pickle

    assert pickle.loads(pickle.dumps(failure)).ranks == [1]


def test_too_many_ranks_fails_fast_with_the_slot_count(spark):
    with pytest.raises(SlotError, match="4 task slots available, 5 ranks requested"):
        run_barrier(spark, allreduce_rank, None, 5, TorchBackend())


def _abort_like_gloo():
    import faulthandler

    faulthandler.disable()  # pytest's dump of the child's stack would only be noise in the log
    os.write(2, b"terminate called after throwing an instance of 'gloo::EnforceNotMet'\n")
    os.abort()


def test_a_forked_rank_that_aborts_in_native_code_reports_the_signal_and_its_message():
    from sparkml_dist.launch.isolation import run_forked

    with pytest.raises(RuntimeError, match="killed by SIGABRT") as info:
        run_forked(_abort_like_gloo)
    assert "gloo::EnforceNotMet" in str(info.value)
