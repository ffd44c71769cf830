"""Horovod as a training backend in the barrier stage: real Horovod (Gloo) ranks on local Spark."""

import pytest
from test_training import job_for

from sparkml_dist.config import load_config
from sparkml_dist.errors import ConfigError, RankFailure
from sparkml_dist.launch import TorchBackend, get_backend, run_barrier
from sparkml_dist.train.loop import train_rank

pytestmark = pytest.mark.spark


def failing_horovod_rank(ctx, payload):
    import horovod.torch as hvd
    import torch

    print(f"horovod rank {hvd.rank()} of {hvd.size()} starting")
    if ctx.rank == 1:
        raise RuntimeError("rank 1 ran out of memory on purpose")
    hvd.allreduce(torch.ones(1), name="never_completes")
    return ctx.rank


def horovod_layout(ctx, payload):
    import os

    import horovod.torch as hvd

    return {
        "rank": hvd.rank(),
        "size": hvd.size(),
        "local_rank": hvd.local_rank(),
        "rendezvous": (
            os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
            os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"],
        ),
        "gateway": (ctx.master_addr, ctx.master_port),  # rank 0 task's, before its rendezvous server
    }


def repeated_reductions(ctx, payload):
    import torch

    from sparkml_dist.train.horovod_parallel import HorovodDataParallel

    strategy = HorovodDataParallel(ctx.world_size, ctx.rank)
    mine = float(ctx.rank + 1)
    sums = []
    # the same shape again (its name is in Horovod's response cache), others between, and back
    for shape, dtype in [
        ((3,), torch.float64),
        ((3,), torch.float64),
        ((5,), torch.float32),
        ((2, 2), torch.float32),
        ((3,), torch.float64),
        ((5,), torch.float32),
    ]:
        sums.append(strategy.allreduce_sum(torch.full(shape, mine, dtype=dtype)).flatten().tolist())
    return {"sums": sums, "maxima": [strategy.allreduce_max(ctx.rank * 10 + i) for i in range(3)]}


def test_repeated_horovod_reductions_under_reused_names_give_every_sum(spark):
    """The strategy reuses one name per op, dtype and shape (for Horovod's response cache; the
    speed is measured in bench.allreduce): interleaved shapes and repeats must still sum what
    each call passed."""
    results = run_barrier(spark, repeated_reductions, None, 2, get_backend("horovod", timeout_s=60))
    expected = [[3.0] * 3, [3.0] * 3, [3.0] * 5, [3.0] * 4, [3.0] * 3, [3.0] * 5]
    assert [r["sums"] for r in results] == [expected, expected]
    assert [r["maxima"] for r in results] == [[10, 11, 12], [10, 11, 12]]


def test_horovod_ranks_match_the_barrier_layout_and_rendezvous_through_their_own_forwarder(spark):
    results = run_barrier(spark, horovod_layout, None, 2, get_backend("horovod", timeout_s=60))
    assert [(r["rank"], r["size"], r["local_rank"]) for r in results] == [(0, 2, 0), (1, 2, 1)]
    # each rank's Horovod talks to a loopback forwarder of its own, which proves the secret to the
    # gateway in rank 0's task (nothing on the driver: the same launch runs from a Connect client)
    assert {r["rendezvous"][0] for r in results} == {"127.0.0.1"}
    assert results[0]["gateway"] == results[1]["gateway"]
    assert len({r["rendezvous"][1] for r in results} | {results[0]["gateway"][1]}) == 3


def test_repeated_horovod_launches_survive_python_worker_reuse(spark):
    # hvd.init() a second time in a reused Spark Python worker segfaults; ranks run in forked children
    for _ in range(3):
        results = run_barrier(spark, horovod_layout, None, 2, get_backend("horovod", timeout_s=60))
        assert [r["rank"] for r in results] == [0, 1]


def test_horovod_training_matches_torch_ddp_and_keeps_ranks_identical(spark, adult_prep, tmp_path):
    cfg, prep = adult_prep
    hvd_job = job_for(cfg, prep, tmp_path / "hvd", "epochs=3", "backend=horovod")
    ddp_job = job_for(cfg, prep, tmp_path / "ddp", "epochs=3", "backend=torch")
    hvd_results = run_barrier(spark, train_rank, hvd_job, 2, get_backend("horovod", timeout_s=120))
    ddp_results = run_barrier(spark, train_rank, ddp_job, 2, TorchBackend(timeout_s=120))
    assert hvd_results[0].stats.param_checksum == hvd_results[1].stats.param_checksum, (
        "identical parameters on both ranks"
    )
    hvd_loss = [r.train_loss for r in hvd_results[0].records]
    ddp_loss = [r.train_loss for r in ddp_results[0].records]
    assert hvd_loss[-1] < hvd_loss[0], "converges"
    # same seed, same data order, same averaging: the curves agree to float-summation noise
    assert hvd_loss == pytest.approx(ddp_loss, rel=0.01)
    assert hvd_results[0].records[-1].evaluation.value > 0.83
    # each step's wait for Horovod's allreduces is timed as communication (in synchronize), on both ranks
    for pace in hvd_results[0].records[-1].per_rank:
        ms = pace.phases_ms
        assert ms["comm"] > 0 and sum(
            ms[p] for p in ("data", "compute", "comm", "optimizer")
        ) == pytest.approx(ms["total"], rel=0.1)


def test_horovod_gradient_accumulation_and_fp16_compression_train(spark, adult_prep, tmp_path):
    cfg, prep = adult_prep
    job = job_for(
        cfg,
        prep,
        tmp_path,
        "epochs=2",
        "backend=horovod",
        "horovod.compression=fp16",
        "horovod.backward_passes_per_step=2",
    )
    results = run_barrier(spark, train_rank, job, 2, get_backend("horovod", timeout_s=120))
    assert results[0].stats.param_checksum == results[1].stats.param_checksum
    assert results[0].records[-1].evaluation.value > 0.82


def test_a_raising_horovod_rank_is_reported_by_rank(spark):
    with pytest.raises(RankFailure) as err:
        run_barrier(spark, failing_horovod_rank, None, 2, get_backend("horovod", timeout_s=30))
    assert err.value.ranks == [1]
    assert "rank 1 ran out of memory on purpose" in str(err.value)
    assert "horovod rank 1 of 2 starting" in str(err.value)


@pytest.mark.parametrize(
    "override, words",
    [
        ("train.horovod.compression=bf16", "no bf16"),
        ("train.horovod.reduce_op=adasum", "needs Horovod built with MPI"),
        ("train.horovod.sync_batch_norm=true", "SyncBatchNorm runs on GPUs only"),
    ],
)
def test_what_horovod_on_cpu_cannot_do_is_refused_at_config_load(adult_config_path, override, words):
    with pytest.raises(ConfigError, match=words):
        load_config(adult_config_path, ["train.backend=horovod", override])


@pytest.mark.slow
def test_adult_pipeline_with_the_horovod_backend_reaches_the_accuracy_bar(spark, make_adult_config):
    from sparkml_dist.pipeline import run_pipeline

    summary = run_pipeline(spark, make_adult_config("train.backend=horovod"))
    assert summary.test_metrics["accuracy"] >= 0.84
    assert summary.alias == "champion"
    assert summary.rows["scored"] + summary.rows["score_rejected"] == summary.rows["input"]["test"]
