"""Parameter server + asynchronous SGD (torch RPC) in the barrier stage, on the real Adult data."""

from dataclasses import replace

import pytest
from mlflow.tracking import MlflowClient
from stores import fresh_store
from test_training import job_for

from sparkml_dist.launch import TorchBackend, run_barrier
from sparkml_dist.methods import make_job
from sparkml_dist.methods.async_ps.worker import ParameterServer, async_rank, shard_names
from sparkml_dist.train.job import Fault
from sparkml_dist.train.loop import train_rank

FRESH = TorchBackend(timeout_s=120, needs_fresh_process=True)


def test_a_too_stale_update_is_dropped_or_downweighted_and_counted():
    import torch

    for policy, applied in (("drop", 1), ("downweight", 2)):
        server = ParameterServer(
            {"w": torch.zeros(3)}, lr=0.1, weight_decay=0.0, max_staleness=0, policy=policy
        )
        assert server.push({"w": torch.ones(3)}, seen=0)  # fresh: applied, version 1
        assert server.push({"w": torch.ones(3)}, seen=0) == (policy == "downweight")  # one version old
        assert server.stats.applied == applied and server.stats.staleness == [0, 1]
        assert server.stats.dropped + server.stats.downweighted == 1


def test_parameters_are_sharded_over_servers_by_name():
    assert shard_names(["a", "b", "c", "d", "e"], 2) == [["a", "c", "e"], ["b", "d"]]


def async_job(cfg, prep, checkpoints, *overrides):
    cfg = cfg.with_overrides("train.strategy=async", *[f"train.{o}" for o in overrides])
    return make_job(cfg, prep, str(checkpoints)), cfg


@pytest.mark.spark
@pytest.mark.slow
def test_async_sgd_reaches_synchronous_ddp_accuracy_and_logs_staleness(spark, adult_prep, tmp_path):
    from sparkml_dist.stages.train import train
    from sparkml_dist.tracking.client import tracked_run

    cfg, prep = adult_prep
    ddp_job = job_for(cfg, prep, tmp_path / "ddp", "epochs=4")
    ddp = (
        run_barrier(spark, train_rank, ddp_job, 2, TorchBackend(timeout_s=120))[0]
        .records[-1]
        .evaluation.value
    )

    async_cfg = cfg.with_overrides(
        "train.strategy=async",
        "train.num_ranks=3",
        "train.epochs=4",
        f"tracking.tracking_uri={fresh_store(tmp_path)}",
    )
    with tracked_run(async_cfg.tracking, "train", async_cfg.flat_params()) as run:
        result = train(spark, async_cfg, prep, run)
    final = result.records[-1]
    assert final.evaluation.rows == "val", "measured on the validation split, and says so"
    assert final.evaluation.value >= ddp - 0.01, f"async {final.evaluation.value:.4f} vs DDP {ddp:.4f}"
    assert [r.role for r in result.outcome.ranks] == ["server", "worker", "worker"]
    metrics = MlflowClient(async_cfg.tracking.tracking_uri).get_run(run.run_id).data.metrics
    assert metrics["updates_applied"] + metrics["updates_dropped"] > 0
    assert {
        "staleness_mean",
        "staleness_max",
        "samples_per_s_rank1",
        "samples_per_s_rank2",
        "val_accuracy",
    } <= set(metrics)
    assert result.model_uri.startswith("runs:/"), "the model from the servers' parameters is logged"
    # what each rank cost: workers' pulls and pushes timed as communication, servers' energy too
    for worker in (1, 2):
        parts = [metrics[f"step_{p}_ms_rank{worker}"] for p in ("data", "compute", "comm", "optimizer")]
        assert sum(parts) == pytest.approx(metrics[f"step_total_ms_rank{worker}"], rel=0.1)
        assert metrics[f"step_comm_ms_rank{worker}"] > 0
    assert all(metrics[f"energy_joules_rank{r}"] > 0 for r in (0, 1, 2))
    assert "system/rank0/process_cpu_percentage" in metrics


@pytest.mark.spark
@pytest.mark.slow
def test_a_slowed_worker_does_not_slow_the_others(spark, adult_prep, tmp_path):
    cfg, prep = adult_prep
    job, _ = async_job(
        cfg, prep, tmp_path / "even", "epochs=2", "num_ranks=4", "async_ps.stale_policy=downweight"
    )

    def even_steps_ms(name: str) -> dict[int, float]:
        results = run_barrier(spark, async_rank, replace(job, checkpoint_dir=str(tmp_path / name)), 4, FRESH)
        return {r.stats.rank: r.stats.step_ms for r in results}

    # the even run before and after the slowed one: the machine's other load (the test suite's
    # second worker) may change between runs, and the slower of the two is the fair reference
    before = even_steps_ms("even-before")
    slowed_job = replace(
        job, checkpoint_dir=str(tmp_path / "s"), faults=(Fault(rank=3, kind="slow", seconds=0.05),)
    )
    slowed = {r.stats.rank: r for r in run_barrier(spark, async_rank, slowed_job, 4, FRESH)}
    after = even_steps_ms("even-after")
    assert slowed[3].stats.step_ms >= 50, "the fault slowed rank 3"
    for rank in (1, 2):
        # median step times. Held to the slow worker's pace (synchronous SGD) a step would take
        # >= 50 ms; on 2 shared cores with 4 ranks and a JVM a fast worker's few-ms step still
        # varies run to run (2.9 vs 5.1 ms seen), so the bound against the even runs is 2x
        even = max(before[rank], after[rank])
        assert slowed[rank].stats.step_ms < 0.25 * slowed[3].stats.step_ms, (
            "not held to the slow worker's pace"
        )
        assert slowed[rank].stats.step_ms <= 2 * even, (
            f"rank {rank}: {slowed[rank].stats.step_ms:.1f} ms a step beside a slow peer, {even:.1f} without"
        )
    server = slowed[0].counters
    assert server["staleness_max"] >= 1 and server["applied"] + server["dropped"] > 0


@pytest.mark.spark
@pytest.mark.slow
def test_a_relaunch_resumes_the_parameter_servers_from_the_last_epoch(spark, adult_prep, tmp_path):
    """A worker is killed in epoch 1. The relaunch starts at epoch 1 from the servers' epoch-0
    checkpoint: a second fault planted in epoch 0 of that attempt is never reached (a restart from
    the initial weights would hit it and exhaust train.max_attempts)."""
    from sparkml_dist.launch.relaunch import run_with_relaunch
    from sparkml_dist.train.checkpoint import list_checkpoints

    cfg, prep = adult_prep
    job, _ = async_job(cfg, prep, tmp_path / "ckpt", "num_ranks=3", "epochs=3", "timeout_s=60")
    job = replace(job, faults=(Fault(rank=2, epoch=1, step=7), Fault(rank=1, epoch=0, step=3, attempt=1)))
    launched = run_with_relaunch(
        spark, async_rank, lambda a: replace(job, attempt=a), 3, FRESH, max_attempts=2
    )
    assert launched.attempts == 2
    saved = [p.rsplit("/", 1)[-1] for p in list_checkpoints(tmp_path / "ckpt")]
    assert saved == ["ckpt-e00001-s0000000.pt", "ckpt-e00002-s0000000.pt"], "one per epoch, newest kept"
    assert launched.results[0].records[-1].evaluation.value >= 0.83
    workers = [r.stats for r in launched.results if r.stats.role == "worker"]
    assert sum(w.samples for w in workers) == prep.manifest.splits["train"].rows, "each epoch's rows, once"
